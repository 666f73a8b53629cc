package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
)

// WithRecorder enables "record": true sessions.
func WithRecorder(r *recordings.Recorder) Option { return func(s *Server) { s.recorder = r } }

// watchers is what runs beside a live session on the gateway's side.
type watchers struct {
	mu       sync.Mutex
	cancel   map[string]context.CancelFunc
	reassert map[string]chan struct{} // tells a download watcher a client left
	done     map[string]chan struct{} // closed when a watcher has stored what it had
	gen      map[string]uint64        // the session's latest watcher
	owner    map[string]session.Info  // a watched session's info, once it has a tenant
	recorded map[string]bool          // sessions whose recording step is done
	// storeDown: until then, downloads are not stored (the store did
	// not answer one).
	storeDown time.Time
}

// Observer returns the gateway's session observer: it starts the recorder
// and the download watcher of a session that became ready, and when a
// session ends it finalises its recording and stores its audit trail.
func (s *Server) Observer() session.Observer { return (*observer)(s) }

type observer Server

// recordingStartWait bounds how long a recorded session's creation waits
// for the recording's first frame.
const recordingStartWait = 30 * time.Second

func (o *observer) SessionRunning(info session.Info, ep session.Endpoint) {
	s := (*Server)(o)
	log := s.log.With("session", info.ID, "tenant", info.Tenant)
	if info.Record && s.recorder != nil {
		t := recordings.Target{
			Tenant: info.Tenant, Session: info.ID, VNC: ep.VNC.String(),
			Width: info.Screen.Width, Height: info.Screen.Height,
			Note: func(typ string, f map[string]any) { s.sessions.Record(info.ID, typ, f) },
			Running: func() bool {
				i, err := s.sessions.Get(info.Tenant, info.ID)
				return err == nil && i.State == session.StateRunning
			},
		}
		var ready <-chan struct{}
		goesOn := false // a recording placed before goes on
		if s.recShare != nil {
			// Whichever replica has room records it.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var err error
			ready, goesOn, err = s.recShare.Place(ctx, info.ID, recordingParams(t), s.heldNote(info.Tenant, info.ID))
			cancel()
			if err != nil {
				// A lease that was written after all must not be taken
				// by another replica as well: stopped, if it is there.
				log.Warn("the recording cannot be placed with a replica; this one records it", "err", err, "stop_err", s.stopRecording(info.ID))
				ready, goesOn = s.recorder.Start(t), false
			}
		} else {
			ready = s.recorder.Start(t)
		}
		// One placed before (by a leader that died, or by a replica that
		// created the session alone) started when the trail says.
		if !goesOn || !s.hasEvent(info.Tenant, info.ID, "recording_started", time.Time{}) {
			s.sessions.Record(info.ID, "recording_started", nil)
		}
		// The session is handed out once its display is being recorded,
		// so a slow display loses nothing; the recorder keeps trying after
		// this wait, and says so in the trail if it gives up.
		select {
		case <-ready:
			log.Info("recording")
		case <-time.After(recordingStartWait):
			log.Warn("recording has not started yet; the session is handed out all the same", "waited", recordingStartWait)
		}
	}
	if info.Kind != session.KindBrowser {
		return
	}
	live := func() bool {
		_, err := s.sessions.Endpoint(info.Tenant, info.ID)
		return err == nil
	}
	// A session this gateway readied in its pool (it is watched since)
	// and claimed just now, with the browser it waited with.
	s.watch.mu.Lock()
	claimed := s.watch.cancel[info.ID] != nil && info.Profile == nil && info.Snapshot == ""
	s.watch.mu.Unlock()
	if claimed {
		s.wakeBrowser(info.ID, ep, live)
	}
	// The first client's connection, made now (a pooled one has had its
	// own since it was ready; a restore restarted the browser, and its new
	// target gets a new one).
	s.prepareSpare(info.ID, spareTarget(ep), live)
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	if s.watch.cancel[info.ID] != nil && info.Profile == nil && info.Snapshot == "" {
		s.watch.owner[info.ID] = info // watched since it was pooled
		return
	}
	// A claim that restored a profile or snapshot restarted Chromium: the
	// pooled watcher's connection is gone, and it would reconnect only
	// after a pause. A new one at once.
	s.unwatch(info.ID)
	s.watch.owner[info.ID] = info
	s.watchDownloads(info.ID, ep)
	// A session that ended before this call had its watcher stopped
	// (SessionStopping) before this one started: stop this one too.
	if i, err := s.sessions.Get(info.Tenant, info.ID); err != nil || i.State != session.StateRunning {
		s.unwatch(info.ID)
	}
}

// SessionPooled starts a pooled browser's download watcher, so that the
// claim finds its connection made and its download behaviour set.
func (o *observer) SessionPooled(info session.Info, ep session.Endpoint) {
	s := (*Server)(o)
	if info.Kind != session.KindBrowser {
		return
	}
	// Called while the session starts: a stop after this point drops it
	// (SessionStopping).
	s.prepareSpare(info.ID, spareTarget(ep), nil)
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	if s.watch.cancel[info.ID] == nil {
		s.watchDownloads(info.ID, ep)
	}
}

// SessionStopping stops the session's download watcher before its
// address is released: a watcher that reconnected after that could reach
// the next session given the address. Downloads already finished are
// still stored: the teardown waits for them (at most downloadFlush),
// since it is about to remove the files (the workspace, or the Pod they
// are read out of).
func (o *observer) SessionStopping(id string) {
	s := (*Server)(o)
	if s.recShare != nil {
		// The replica recording it stops before the address goes.
		if err := s.stopRecording(id); err != nil {
			s.log.Warn("cannot ask for the recording to stop; it stops when its holder sees the session's Pod go", "session", id, "err", err)
		}
	}
	s.dropSpare(id)
	s.watch.mu.Lock()
	done := s.unwatch(id)
	s.watch.mu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-time.After(downloadFlush):
		s.log.Warn("downloads of a stopping session still being stored; its teardown goes on", "session", id, "waited", downloadFlush)
	}
}

// downloadFlush bounds how long a teardown waits for the downloads that
// finished before it to be stored.
const downloadFlush = 2 * time.Minute

var _ session.EarlyObserver = (*observer)(nil)

// watchDownloads starts a session's download watcher. Each download is
// stored as its owner's, the tenant the session had when it finished;
// a session with none (pooled, never driven) stores nothing. A store
// under way finishes when the watcher is stopped. s.watch.mu is held.
func (s *Server) watchDownloads(id string, ep session.Endpoint) {
	ctx, cancel := context.WithCancel(context.Background())
	s.watch.cancel[id] = cancel
	reassert := make(chan struct{}, 1)
	s.watch.reassert[id] = reassert
	done := make(chan struct{})
	s.watch.done[id] = done
	s.watch.gen[id]++
	gen := s.watch.gen[id]
	go func() {
		defer close(done)
		s.runWatcher(ctx, id, ep, reassert)
		// The owner stays until then: what finished before the stop is
		// stored as the owner's. Not if a newer watcher has it.
		s.watch.mu.Lock()
		if s.watch.gen[id] == gen {
			delete(s.watch.owner, id)
			delete(s.watch.gen, id)
		}
		s.watch.mu.Unlock()
	}()
}

// runWatcher runs a session's download watcher until ctx ends, storing
// each download as it finishes (and, at the end, those that finished
// before it).
func (s *Server) runWatcher(ctx context.Context, id string, ep session.Endpoint, reassert chan struct{}) {
	list := func(ctx context.Context) ([]string, error) {
		s.watch.mu.Lock()
		info, owned := s.watch.owner[id]
		s.watch.mu.Unlock()
		if !owned {
			return nil, nil // pooled and never driven: nothing to store
		}
		return s.sessions.ListDownloads(ctx, info.Tenant, id)
	}
	browser.WatchDownloads(ctx, ep.CDP, session.DownloadDir, s.cfg.Downloads, reassert, list, func(d browser.Download) error {
		s.watch.mu.Lock()
		info, owned := s.watch.owner[id]
		s.watch.mu.Unlock()
		log := s.log.With("session", id, "tenant", info.Tenant)
		if !owned {
			log.Warn("a download in a session with no tenant yet is not stored", "url", d.URL)
			return nil
		}
		err := s.storeDownload(context.WithoutCancel(ctx), info, d)
		var down storeDown
		switch {
		case err == nil:
			return nil
		case errors.As(err, &down) && d.Final:
			log.Error("download not stored: the store did not answer; not tried again", "err", err)
			s.sessions.Record(id, "download_failed", map[string]any{"url": d.URL, "artifact": recordings.DownloadID(id, d.GUID), "reason": "the store did not answer"})
			return err
		case errors.As(err, &down):
			// The watcher hands it over again a little later, and once
			// more as it stops; the trail says so the first time.
			if !d.Retry {
				log.Warn("download not stored yet: the store does not answer; tried again", "err", err)
				s.sessions.Record(id, "download_failed", map[string]any{"url": d.URL, "artifact": recordings.DownloadID(id, d.GUID), "retrying": true})
			}
			return err
		default:
			log.Warn("download not stored", "err", err)
			s.sessions.Record(id, "download_failed", map[string]any{"url": d.URL})
			return nil
		}
	})
}

// storeDown is a download's store that failed on the store's side, which
// may answer later, not on the session's (a file too large or missing).
type storeDown struct{ err error }

// storeCheckWait bounds the look for a download in the store before it
// is read out of the session.
const storeCheckWait = 10 * time.Second

// storeDownFor is how long a store that did not answer a download's
// store is taken to be down: stores meanwhile fail at once.
const storeDownFor = 10 * time.Second

// storeWentDown notes that the store did not answer, and returns err as
// a storeDown.
func (s *Server) storeWentDown(err error) error {
	s.watch.mu.Lock()
	s.watch.storeDown = time.Now().Add(storeDownFor)
	s.watch.mu.Unlock()
	return storeDown{err}
}

// storeSeenDown is a storeDown while the store is taken to be down.
func (s *Server) storeSeenDown() error {
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	if time.Now().Before(s.watch.storeDown) {
		return storeDown{errors.New("the store did not answer a moment ago")}
	}
	return nil
}

func (e storeDown) Error() string { return e.err.Error() }
func (e storeDown) Unwrap() error { return e.err }

// unwatch stops a session's download watcher and returns what closes
// once it has stored what it had (nil: there was none); s.watch.mu is
// held.
func (s *Server) unwatch(id string) <-chan struct{} {
	if cancel := s.watch.cancel[id]; cancel != nil {
		cancel()
	}
	done := s.watch.done[id]
	delete(s.watch.cancel, id)
	delete(s.watch.reassert, id)
	delete(s.watch.done, id)
	if done == nil {
		delete(s.watch.owner, id)
	} // else the watcher drops it once it has stored what it had
	return done
}

// clientLeft tells the session's download watcher that a CDP client
// left, so that it sets its download behaviour again (Chromium reset it
// if that client had set its own).
func (s *Server) clientLeft(id string) {
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	select {
	case s.watch.reassert[id] <- struct{}{}:
	default:
	}
}

func (s *Server) storeDownload(ctx context.Context, info session.Info, d browser.Download) error {
	if d.Refused != "" {
		s.sessions.Record(info.ID, "download_refused", map[string]any{"reason": d.Refused, "url": d.URL})
		return nil
	}
	// Chromium's count of the size is the session's word: the copy is
	// bounded by the gateway's own limit all the same.
	limit := s.cfg.Downloads.Bytes
	if limit <= 0 {
		limit = browser.DefaultDownloadBytes
	}
	// One artifact a download, however often it is found: the first
	// store is kept (the session may have changed the file since).
	id := recordings.DownloadID(info.ID, d.GUID)
	// While the store is seen down, nothing is read out of the session
	// for it, and a watcher's tries again go by quickly. Not a last try:
	// that one tries.
	if !d.Final {
		if err := s.storeSeenDown(); err != nil {
			return err
		}
	}
	if d.Found || d.Retry {
		// Found by a watcher that did not see it end: stored already
		// if a gateway before this one did. Tried again: stored if the
		// store took it but its answer was lost. Not read out of the
		// session again then.
		hctx, cancel := context.WithTimeout(ctx, storeCheckWait)
		has, err := s.store.Has(hctx, info.Tenant, info.ID, recordings.KindDownload, id)
		cancel()
		if recordings.Unavailable(err) {
			return s.storeWentDown(err)
		}
		if err != nil {
			return err
		}
		if has {
			if d.Retry { // the trail says it failed, not yet that it is stored
				s.sessions.Record(info.ID, "download", map[string]any{"artifact": id, "url": d.URL})
			}
			return nil
		}
	}
	f, err := s.sessions.OpenDownload(info.Tenant, info.ID, d.GUID, limit)
	if err != nil {
		return err
	}
	defer f.Close()
	body := &limitedReader{r: f, limit: limit, left: limit, first: -1}
	name := d.Name
	if !recordings.ValidName(name) {
		name = "download"
	}
	ct := mime.TypeByExtension(filepath.Ext(name))
	if ct == "" {
		ct = "application/octet-stream"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	a, err := s.store.PutNew(ctx, info.Tenant, recordings.Artifact{
		ID: id, Session: info.ID, Kind: recordings.KindDownload, Name: name, ContentType: ct, SourceURL: d.URL,
	}, body)
	switch {
	case errors.Is(err, recordings.ErrExists):
		if d.Retry { // stored by a try whose answer was lost
			s.sessions.Record(info.ID, "download", map[string]any{"artifact": id, "url": d.URL})
		}
		return nil // else in the trail since
	case body.err != nil:
		return body.err // the session's file: too large, changed, unreadable
	case recordings.Unavailable(err):
		return s.storeWentDown(err)
	case err != nil:
		return err
	}
	fields := map[string]any{"artifact": a.ID, "name": a.Name, "url": d.URL, "size": a.Size, "sha256": a.SHA256}
	if d.Found {
		// The browser's report of its end was missed (the gateway had
		// no connection to it then): its source and name are unknown.
		fields["found"] = true
	}
	s.sessions.Record(info.ID, "download", fields)
	return nil
}

// SessionEnded is FinaliseSession for a manager that does not retry.
func (o *observer) SessionEnded(info session.Info, events []session.Event) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := o.FinaliseSession(ctx, info, events); err != nil {
		o.log.Error("audit trail not stored", "session", info.ID, "tenant", info.Tenant, "err", err)
	}
}

var (
	_ session.SessionFinaliser = (*observer)(nil)
	_ session.LogReader        = (*observer)(nil)
)

// StoredLog reads a session's stored audit log, and whether it has one
// (session.LogReader).
func (o *observer) StoredLog(ctx context.Context, tenant, id string) ([]session.Event, bool, error) {
	return (*Server)(o).storedEvents(ctx, tenant, id)
}

// FinaliseSession stops what watched the session, finalises its recording
// (once: a recording that cannot be finalised is left to the janitor's
// retries) and stores its audit trail. An error means the trail is not
// stored yet: the manager calls again with backoff, apart from the
// reaper, and keeps the session's trail on the host until then.
func (o *observer) FinaliseSession(ctx context.Context, info session.Info, events []session.Event) error {
	s := (*Server)(o)
	log := s.log.With("session", info.ID, "tenant", info.Tenant)
	s.forgetVersion(info.ID)
	s.dropSpare(info.ID)
	s.watch.mu.Lock()
	s.unwatch(info.ID)
	recorded := s.watch.recorded[info.ID]
	s.watch.recorded[info.ID] = true
	s.watch.mu.Unlock()
	var notes []session.Event
	note := func(typ string, f map[string]any) {
		s.sessions.Record(info.ID, typ, f)
		notes = append(notes, session.Event{Time: time.Now().UTC(), Type: typ, Fields: f})
	}
	// A replica recording it stops and stores its segments first (any
	// session: one adopted as it ended has no record of being recorded).
	end, nothing := time.Now(), false
	if s.recShare != nil && !recorded {
		wait := collectQuickWait
		if info.Record {
			wait = collectWait
		}
		var err error
		if nothing, err = s.collectRecording(ctx, info.ID, wait); err != nil {
			// Finished later from all its segments, not now from some.
			recorded = true
			if info.Record {
				note("recording_failed", map[string]any{"reason": "the recording could not be finalised yet; it is retried"})
			}
		}
	}
	if s.recorder != nil && !recorded {
		m, err := s.recorder.Finish(ctx, info.Tenant, info.ID, end)
		if err == nil && m == nil && nothing {
			err = recordings.ErrNothingRecorded
		}
		switch {
		case errors.Is(err, recordings.ErrNothingRecorded):
			note("recording_failed", map[string]any{"reason": err.Error()})
		case err != nil:
			log.Error("recording not finalised; its segments are kept for a retry", "err", err)
			note("recording_failed", map[string]any{"reason": "the recording could not be finalised yet; it is retried"})
		case m != nil:
			note("recording_finalised", finalisedFields(m))
		}
	}
	// The notes as the trail holds them (the same events, at the same
	// times: a log stored again adds only what it lacks). A session the
	// manager no longer holds (one that ended while no gateway ran) has
	// them only here.
	if len(notes) > 0 {
		if evs, err := s.sessions.Events(info.Tenant, info.ID); err == nil && len(evs) >= len(events)+len(notes) {
			events = evs
		} else {
			events = append(events, notes...)
		}
	}
	// The trail is all a reviewer has of what happened: a few quick tries
	// here, then the manager's backoff takes over.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		err := o.StoreTrail(ctx, info, events)
		if err == nil {
			s.watch.mu.Lock()
			delete(s.watch.recorded, info.ID)
			s.watch.mu.Unlock()
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(2 * time.Second):
		}
	}
}

var _ session.TrailRestorer = (*observer)(nil)

// auditLogName is the name of a session's stored audit trail.
const auditLogName = "audit.jsonl"

// maxLogMerge bounds the stored log read to add a trail's events to it;
// maxLogMerges, how many are read at once.
const (
	maxLogMerge  = 256 << 20
	maxLogMerges = 2
)

// StoreTrail stores the session's audit trail as its log artifact, under
// an id of the session's own. A log already there (the end's, when
// events came after it; another replica's; one whose put's answer was
// lost) is kept whole, and the trail's events it lacks are added after
// its own: a log is never stored shorter than it was, and keeps the date
// it was first stored, which its retention counts from. One too large to
// read back (past what a trail holds) is left as it is, and the error
// says so: the events stay in the host's trail, and the caller retries.
func (o *observer) StoreTrail(ctx context.Context, info session.Info, events []session.Event) error {
	if o.logMerges != nil {
		select {
		case o.logMerges <- struct{}{}:
			defer func() { <-o.logMerges }()
		case <-ctx.Done():
			return fmt.Errorf("store the audit trail: %w", ctx.Err())
		}
	}
	a := recordings.Artifact{ID: recordings.SegmentID(info.ID, auditLogName), Session: info.ID,
		Kind: recordings.KindLog, Name: auditLogName, ContentType: "application/x-ndjson"}
	// Conditional on the log as read: another replica adding to it at
	// once (a takeover) makes this one read it again, not overwrite it.
	err := o.store.Update(ctx, info.Tenant, a, maxLogMerge, func(old []byte) ([]byte, bool) {
		merged, added := mergeLog(old, events)
		return merged, old == nil || added > 0 // nothing to write when the log has them all
	})
	if err != nil {
		return fmt.Errorf("store the audit trail: %w", err)
	}
	return nil
}

// mergeLog is a stored log (JSON lines) with the events it lacks added
// after its own, and how many those are. An event is known by its time
// and type; one the log holds twice accounts for two.
func mergeLog(old []byte, events []session.Event) ([]byte, int) {
	type key struct{ t, typ string }
	at := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	have := map[key]int{}
	for _, line := range bytes.Split(old, []byte("\n")) {
		var ev struct {
			Time time.Time `json:"time"`
			Type string    `json:"type"`
		}
		if json.Unmarshal(line, &ev) == nil {
			have[key{at(ev.Time), ev.Type}]++
		}
	}
	out := bytes.NewBuffer(old)
	if len(old) > 0 && old[len(old)-1] != '\n' {
		out.WriteByte('\n')
	}
	enc := json.NewEncoder(out)
	added := 0
	for _, ev := range events {
		k := key{at(ev.Time), ev.Type}
		if have[k] > 0 {
			have[k]--
			continue
		}
		enc.Encode(ev)
		added++
	}
	return out.Bytes(), added
}

// errDownloadTooLarge ends a download's copy past the configured bound.
var errDownloadTooLarge = errors.New("the download is larger than the configured limit")

// limitedReader reads at most limit bytes and fails, rather than ending
// quietly, when there is more: a cut file is never stored as whole. It
// seeks (the store reads twice: to hash, then to upload).
//
// The file may change between the reads (OpenDownload hands over a copy
// of the gateway's, so only if that changes): one that ends sooner or
// later than it did fails too (errDownloadChanged). err is the
// first failure it gave that is not the end, so that its caller tells a
// fault of the file's from one of where it was copied to.
type limitedReader struct {
	r           io.ReadSeeker
	limit, left int64
	first       int64 // where the first read through ended; -1 before
	err         error
}

// errDownloadChanged: the file ended sooner on a second read.
var errDownloadChanged = errors.New("the download changed while it was being stored")

func (l *limitedReader) Seek(off int64, whence int) (int64, error) {
	pos, err := l.r.Seek(off, whence)
	if err == nil {
		l.left = l.limit - pos
	}
	return pos, err
}

func (l *limitedReader) Read(p []byte) (int, error) {
	n, err := l.read(p)
	if err != nil && err != io.EOF && l.err == nil {
		l.err = err
	}
	return n, err
}

func (l *limitedReader) read(p []byte) (int, error) {
	room := l.left
	if l.first >= 0 { // a later read ends where the first did
		room = min(room, l.first-(l.limit-l.left))
	}
	if room <= 0 {
		var one [1]byte
		switch n, _ := l.r.Read(one[:]); {
		case n > 0 && l.left <= 0:
			return 0, errDownloadTooLarge
		case n > 0:
			return 0, errDownloadChanged // longer than it was
		}
		return 0, l.end()
	}
	if int64(len(p)) > room {
		p = p[:room]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if err == io.EOF {
		return n, l.end()
	}
	return n, err
}

// end is the file's end: io.EOF where it was the first time.
func (l *limitedReader) end() error {
	at := l.limit - l.left
	switch {
	case l.first < 0:
		l.first = at
	case at != l.first:
		return errDownloadChanged
	}
	return io.EOF
}

// hasEvent says whether the session's trail, as this gateway holds it,
// has an event of type typ at or after since.
func (s *Server) hasEvent(tenant, id, typ string, since time.Time) bool {
	evs, err := s.sessions.Events(tenant, id)
	return err == nil && slices.ContainsFunc(evs, func(ev session.Event) bool { return ev.Type == typ && !ev.Time.Before(since) })
}
