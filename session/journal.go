package session

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"time"
)

// TrailStore keeps each session's audit trail off the gateway's host
// while the session runs, so that a gateway that loses its host (a
// replica on a node that died, a host disk gone) loses at most the last
// flush interval of it. The trail is stored as pieces: the piece at
// start holds the trail's events from index start on, one JSON object a
// line. The artifact store (recordings.Store) is one.
type TrailStore interface {
	// PutTrail stores one piece; storing a piece again replaces it.
	PutTrail(ctx context.Context, tenant, id string, start int, lines []byte) error
	// ReadTrail calls each with the session's pieces, in order of start.
	ReadTrail(ctx context.Context, tenant, id string, each func(start int, r io.Reader) error) error
	// DropTrail removes the session's pieces.
	DropTrail(ctx context.Context, tenant, id string) error
}

// TrailLister is a TrailStore that lists the trails it holds pieces of.
// With one, a gateway finalises the sessions that ended, sandbox and all,
// while no gateway ran or led, and that only the store remembers
// (endStoredOrphans).
type TrailLister interface {
	// Trails calls each with every trail's tenant and session, the
	// scope all its pieces are marked with (TrailMarker; "" when one is
	// not, as pieces written before the mark, or their marks differ),
	// and when its newest piece was written, until each returns false.
	Trails(ctx context.Context, each func(tenant, id, scope string, newest time.Time) bool) error
}

// TrailMarker is a TrailStore that marks each piece with the scope of
// the gateway that wrote it, which its listing (TrailLister) reports: a
// gateway then passes over other gateways' trails without reading them.
type TrailMarker interface {
	// PutScopedTrail is PutTrail, the piece marked with scope (the
	// writer's Manager.scopeTag).
	PutScopedTrail(ctx context.Context, tenant, id, scope string, start int, lines []byte) error
}

// Bounds of the stored trail.
const (
	// DefaultTrailFlush is how long an event waits, at most, before its
	// piece is written, unless the store is away.
	DefaultTrailFlush = time.Second
	// A piece holds at most this many events or bytes.
	maxPieceEvents = 1000
	maxPieceBytes  = 4 << 20
	// pieceCoalesce: a stored piece smaller than this is stored again,
	// extended, by the next flush (trail.tail).
	pieceCoalesce = 16 << 10
	// maxJournalBackoff bounds the wait between attempts while the store
	// is away.
	maxJournalBackoff = 30 * time.Second
	// trailReadTimeout bounds reading a session's stored trail.
	trailReadTimeout = 60 * time.Second
)

// The journal keeps no copy of what it has yet to store: the host file
// (and, where the file failed, the trail's memory) holds it, and a flush
// reads on from where the last one stopped (storedOff).

// journalOn tells whether the manager stores trails as they are written.
func (m *Manager) journalOn() bool { return m.cfg.Trails != nil }

// kickJournal asks the journal to flush soon; it never blocks, so it may
// be called with m.mu held.
func (m *Manager) kickJournal() {
	select {
	case m.journalKick <- struct{}{}:
	default:
	}
}

// journal writes the sessions' new events to the store, a flush interval
// after the first of them; while the store is away, it tries again with
// backoff and new events do not hurry it.
func (m *Manager) journal(ctx context.Context) {
	defer m.wg.Done()
	retry := time.Duration(0)
	failing := false
	for {
		if retry == 0 {
			select {
			case <-ctx.Done():
				return
			case <-m.journalKick:
			}
			// Gather what comes in the interval into one piece.
			select {
			case <-ctx.Done():
				return
			case <-time.After(m.cfg.TrailFlush):
			}
		} else {
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
		}
		err := m.flushTrails(ctx)
		m.journalFailing.Store(err != nil && ctx.Err() == nil)
		switch {
		case err == nil:
			if failing {
				m.log.Info("audit trails are stored in MinIO again")
			}
			retry, failing = 0, false
		case ctx.Err() != nil:
			return
		default:
			if !failing {
				m.log.Warn("audit trails cannot be stored in MinIO; the host keeps them, and the journal tries again with backoff", "err", err)
			}
			retry, failing = min(max(2*retry, time.Second), maxJournalBackoff), true
		}
	}
}

// Durable stores what the session's trail holds now, rather than a
// flush interval later: an event the gateway acknowledges at once (a
// preview issued or revoked) then outlives the gateway being killed the
// moment after, and the replica that takes over knows it. Nothing to do
// without a journal, for a session this gateway does not hold, or while
// the journal finds the store away (it has said so, and stores the
// trail when the store is back). Nor, when no gateway elsewhere takes
// over, for a trail whose events are all in its file here: an event is
// appended to it as it is recorded, and the file outlives this process.
// One the file did not take (a full disk) is in memory only, and is
// stored. A finalised session's event goes into its stored log.
func (m *Manager) Durable(ctx context.Context, id string) error {
	if !m.journalOn() {
		return nil
	}
	if m.journalFailing.Load() {
		// The store is away: requests do not wait for it one by one;
		// the journal stores the trail when it is back.
		return nil
	}
	m.mu.Lock()
	s := m.sessions[id]
	inFile := s != nil && s.trail.path != "" && len(s.trail.mem) <= s.trail.storedMem
	finalised := s != nil && s.finalised
	m.mu.Unlock()
	if s == nil || (inFile && !m.cfg.TakenOverElsewhere) {
		return nil
	}
	if finalised {
		// Its log is stored: an event since (a review link) is added to
		// it now, not by the retries of relog alone.
		_, err := m.relogOnce(ctx, s)
		return err
	}
	// The journal may be flushing this session: wait for it as long as
	// ctx lasts, no longer.
	for !s.journalMu.TryLock() {
		select {
		case <-ctx.Done():
			m.journalFailing.Store(true) // the store is slow: later requests do not wait
			m.kickJournal()
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	defer s.journalMu.Unlock()
	err := m.flushTrailLocked(ctx, s)
	if err != nil {
		// Later requests do not wait for the store until the journal
		// has found it back.
		m.journalFailing.Store(true)
		m.kickJournal()
	}
	return err
}

// flushTrails writes every session's unstored events; the first error
// if any could not be written.
func (m *Manager) flushTrails(ctx context.Context) error {
	m.mu.Lock()
	var work []*sess
	for _, s := range m.sessions {
		if t := &s.trail; t.journal && (!t.synced || t.unstored()) {
			work = append(work, s)
		}
	}
	m.mu.Unlock()
	var first error
	for _, s := range work {
		if err := m.flushTrail(ctx, s); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// unstored tells whether the trail holds events the store lacks.
func (t *trail) unstored() bool { return t.inFile+len(t.mem) > t.stored }

// flushTrail writes one session's unstored events as pieces, in order:
// first what the host file holds past storedOff, then what only memory
// holds. s.journalMu keeps one flush (or drop) of a session at a time.
func (m *Manager) flushTrail(ctx context.Context, s *sess) error {
	s.journalMu.Lock()
	defer s.journalMu.Unlock()
	return m.flushTrailLocked(ctx, s)
}

func (m *Manager) flushTrailLocked(ctx context.Context, s *sess) error {
	m.mu.Lock()
	synced := s.trail.synced
	m.mu.Unlock()
	if !synced {
		if err := m.syncTrailLocked(ctx, s); err != nil {
			return err
		}
	}
	fileDone := false // the file has nothing whole past storedOff
	for {
		m.mu.Lock()
		t := &s.trail
		if !t.journal || !t.unstored() {
			m.mu.Unlock()
			return nil
		}
		tenant, id, path, off, start := s.info.Tenant, s.info.ID, t.path, t.storedOff, t.stored
		fromFile := !fileDone && path != "" && t.inFile > t.stored-t.storedMem
		var mem []Event
		if !fromFile {
			mem = append(mem, t.mem[min(t.storedMem, len(t.mem)):min(len(t.mem), t.storedMem+maxPieceEvents)]...)
		}
		m.mu.Unlock()
		if !fromFile && len(mem) == 0 {
			return nil
		}
		var lines []byte
		var n int
		var used int64
		if fromFile {
			var err error
			if lines, n, used, err = readPiece(path, off); err != nil {
				return err
			}
			if n == 0 && used == 0 {
				fileDone = true // what the count says is not there whole: memory next
				continue
			}
		} else {
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			for _, ev := range mem {
				if n > 0 && b.Len() >= maxPieceBytes {
					break
				}
				enc.Encode(ev)
				n++
			}
			lines = b.Bytes()
		}
		put, at := lines, start
		if n > 0 {
			// Extending the last piece, when it is small and these
			// follow on: the store replaces it whole, so a reader sees
			// the old piece or the new one, never less. After a put
			// that failed, the same key as it, whatever the size: it
			// may be stored, and a piece of its own would overlap it.
			follows := t.tailN > 0 && t.tailStart+t.tailN == start
			extend := follows && len(t.tail)+len(lines) <= pieceCoalesce && t.tailN+n <= maxPieceEvents
			if t.unsure {
				extend = follows && t.unsureAt == t.tailStart
			}
			if extend {
				put, at = append(t.tail[:len(t.tail):len(t.tail)], lines...), t.tailStart
			}
			pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := m.putPiece(pctx, tenant, id, at, put)
			cancel()
			if err != nil {
				t.unsure, t.unsureAt = true, at
				return err
			}
			t.unsure = false
		}
		m.mu.Lock()
		if t.path == path && t.storedOff == off && t.stored == start { // not rewritten meanwhile
			t.stored += n
			if fromFile {
				t.storedOff += used
			} else {
				t.storedMem += n
			}
			if n > 0 {
				t.keepTail(put, at, start-at+n)
			}
		} else {
			t.keepTail(nil, 0, 0)
		}
		m.mu.Unlock()
	}
}

// keepTail keeps piece, stored at start with n events, as the piece the
// next flush extends, while it is small enough to.
func (t *trail) keepTail(piece []byte, start, n int) {
	if len(piece) >= pieceCoalesce {
		piece, n = nil, 0
	}
	t.tail, t.tailStart, t.tailN = piece, start, n
}

// readPiece reads whole lines of a trail file from off: at most a
// piece's worth of events and bytes. It returns them as events encoded
// again (lines that do not parse are skipped, as readTrail skips them),
// how many, and how many bytes of the file they took.
func readPiece(path string, off int64) ([]byte, int, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, 0, err
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, 0, 0, err
	}
	r := bufio.NewReaderSize(f, 64<<10)
	var out bytes.Buffer
	var used int64
	n := 0
	for n < maxPieceEvents && out.Len() < maxPieceBytes {
		line, err := r.ReadBytes('\n')
		if err != nil {
			break // end of file; a last line not yet whole waits
		}
		used += int64(len(line))
		var ev Event
		// Read as readTrail reads: a line it would not take is skipped.
		if len(line) <= maxTrailLine && json.Unmarshal(line, &ev) == nil {
			b, _ := json.Marshal(ev)
			out.Write(append(b, '\n'))
			n++
		}
	}
	return out.Bytes(), n, used, nil
}

// readStoredTrail reads what the store holds of a session's trail
// (StoredTrail), saying so in the log where it has a gap.
func (m *Manager) readStoredTrail(ctx context.Context, tenant, id string) ([]Event, error) {
	out, gap, err := StoredTrail(ctx, m.cfg.Trails, tenant, id)
	if gap {
		m.log.Warn("the stored audit trail has a gap; read up to it", "session", id, "events", len(out))
	}
	return out, err
}

// StoredTrail reads what ts holds of a session's trail while it runs:
// its events, in order, up to the first gap in its pieces (and whether
// there is one), within the bound of a trail.
func StoredTrail(ctx context.Context, ts TrailStore, tenant, id string) ([]Event, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, trailReadTimeout)
	defer cancel()
	var out []Event
	gap := false
	err := ts.ReadTrail(ctx, tenant, id, func(start int, r io.Reader) error {
		if gap || start > len(out) {
			// A piece that does not follow on: what comes after a gap
			// cannot be placed, so the trail stops at it.
			gap = true
			return nil
		}
		// A piece that starts within what was read (one extended,
		// stored by a put that then failed, and one written after it):
		// its events past what was read follow on.
		evs := readEventsFrom(r, trailLimit()-start)
		if skip := len(out) - start; skip < len(evs) {
			out = append(out, evs[skip:]...)
		}
		return nil
	})
	return out, gap, err
}

// syncTrail matches an adopted session's trail with what the store has
// of it, before the trail is flushed or finalised.
func (m *Manager) syncTrail(ctx context.Context, s *sess) error {
	s.journalMu.Lock()
	defer s.journalMu.Unlock()
	return m.syncTrailLocked(ctx, s)
}

// syncTrailLocked does syncTrail; the caller holds s.journalMu. The
// store holds a prefix of the trail, and is taken as right where the
// two differ (a host file left by an earlier gateway on this host, while
// another ran the session elsewhere). When the host holds more (the last
// interval before a gateway died), the rest is stored next; when it
// holds less (a gateway on another host, a lost file), the store's
// events are written in first, and what was recorded here since follows.
func (m *Manager) syncTrailLocked(ctx context.Context, s *sess) error {
	m.mu.Lock()
	tenant, id, path, base := s.info.Tenant, s.info.ID, s.trail.path, s.trail.fileBase
	m.mu.Unlock()
	stored, err := m.readStoredTrail(ctx, tenant, id)
	if err != nil {
		return err
	}
	// The host's trail as it was opened, and what came after, read
	// outside the manager's lock; what is appended meanwhile is read
	// under it (a little).
	have, ends := scanTrail(path, 0)
	m.mu.Lock()
	defer m.mu.Unlock()
	t := &s.trail
	if t.path != path {
		return errors.New("the trail moved while it was matched")
	}
	var end int64
	if len(ends) > 0 {
		end = ends[len(ends)-1]
	}
	more, moreEnds := scanTrail(path, end)
	have, ends = append(have, more...), append(ends, moreEnds...)
	have = append(have, t.mem...)
	agree := len(stored) <= len(have)
	for i := 0; agree && i < len(stored); i++ {
		agree = stored[i].Type == have[i].Type && stored[i].Time.Equal(have[i].Time)
	}
	switch {
	case agree && len(stored) <= len(ends):
		// The store's events are the file's first ones.
		t.stored, t.storedMem = len(stored), 0
		if len(stored) > 0 {
			t.storedOff = ends[len(stored)-1]
		} else {
			t.storedOff = 0
		}
	case agree:
		// The store reaches into what only memory holds.
		t.stored, t.storedMem = len(stored), len(stored)-len(ends)
		t.storedOff = end
		if len(ends) > 0 {
			t.storedOff = ends[len(ends)-1]
		}
	default:
		// The store's events first, then what this gateway recorded
		// since it opened the trail.
		merged := append(append([]Event(nil), stored...), have[min(len(have), base):]...)
		t.stored, t.storedMem, t.storedOff = len(stored), 0, 0
		if !t.rewrite(merged) {
			t.storedMem = len(stored) // the file could not take them: memory holds them
		} else if _, ends := scanTrail(t.path, 0); len(stored) > 0 && len(ends) >= len(stored) {
			t.storedOff = ends[len(stored)-1]
		}
	}
	t.synced = true
	// The store was read: what a failed put left is known, and its
	// pieces may be another gateway's.
	t.keepTail(nil, 0, 0)
	t.unsure = false
	if t.unstored() {
		m.kickJournal()
	}
	return nil
}

// scanTrail reads a trail file's events from off, with the offset just
// past each.
func scanTrail(path string, off int64) ([]Event, []int64) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, nil
	}
	r := bufio.NewReaderSize(f, 64<<10)
	var evs []Event
	var ends []int64
	pos := off
	for len(evs) < trailLimit() {
		line, err := r.ReadBytes('\n')
		if err != nil {
			break // end of file; a last line not yet whole is not an event yet
		}
		pos += int64(len(line))
		if len(line) > maxTrailLine {
			continue
		}
		var ev Event
		if json.Unmarshal(line, &ev) == nil {
			evs, ends = append(evs, ev), append(ends, pos)
		}
	}
	return evs, ends
}

// rewrite replaces the trail's host file (or memory) with events and
// counts them again; the caller holds m.mu.
func (t *trail) rewrite(events []Event) bool {
	t.mem, t.kept, t.noisy, t.inFile = nil, 0, map[string]int{}, 0
	written := false
	if t.path != "" {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		for _, ev := range events {
			enc.Encode(ev)
		}
		if os.WriteFile(t.path+".new", b.Bytes(), 0o600) == nil && os.Rename(t.path+".new", t.path) == nil {
			written, t.inFile = true, len(events)
		} else {
			os.Remove(t.path + ".new")
			// The old file is not the trail any more, whether or not it
			// can be removed: memory holds it from now on.
			os.Remove(t.path)
			t.path = ""
		}
	}
	if !written {
		t.mem = append(t.mem, events...)
	}
	t.count(events)
	return written
}

// ensureSynced matches an adopted trail with the store before it is
// finalised: pieces are dropped once the log is stored, so a log made
// without them would lose what only they held.
func (m *Manager) ensureSynced(ctx context.Context, s *sess) error {
	m.mu.Lock()
	need := s.trail.journal && !s.trail.synced
	m.mu.Unlock()
	if !need {
		return nil
	}
	return m.syncTrail(ctx, s)
}

// dropStoredTrail removes a finalised session's pieces: the log artifact
// holds the whole trail now. A trail never matched with the store keeps
// its pieces.
func (m *Manager) dropStoredTrail(s *sess, matched bool) {
	if !m.journalOn() {
		return
	}
	s.journalMu.Lock()
	defer s.journalMu.Unlock()
	m.mu.Lock()
	drop := s.trail.journal && s.trail.synced && matched
	s.trail.journal = false
	tenant, id := s.info.Tenant, s.info.ID
	m.mu.Unlock()
	if !drop {
		return
	}
	ctx, cancel := context.WithTimeout(m.journalCtx, time.Minute)
	defer cancel()
	if err := m.cfg.Trails.DropTrail(ctx, tenant, id); err != nil {
		m.log.Warn("the stored pieces of a finalised audit trail were not removed", "session", id, "err", err)
	}
}

// lastFlush writes what is unstored before the manager closes, within a
// short bound, once the journal has stopped: the next gateway finds it in
// the store even if this host is gone by then.
func (m *Manager) lastFlush() {
	if !m.journalOn() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m.flushTrails(ctx)
}

// recoverStoredTrail gives a sandbox that was not adopted (it ended while
// no gateway ran) a host trail file from the store when the host has
// none, so that it is reported and finalised like any ended session's;
// it says the session's tenant and whether the host has a trail file of
// it now.
func (m *Manager) recoverStoredTrail(ctx context.Context, sb Sandbox) (tenant string, hasFile bool) {
	if !m.journalOn() {
		return "", false
	}
	labels, err := sb.Record(ctx)
	if err != nil || labels[labelPool] != "" {
		return "", false
	}
	info, err := infoFromLabels(labels)
	if err != nil {
		return "", false
	}
	p := m.trailPath(info.Tenant, info.ID)
	if _, err := os.Stat(p); err == nil {
		return info.Tenant, true
	}
	events, err := m.readStoredTrail(ctx, info.Tenant, info.ID)
	if err != nil || len(events) == 0 {
		if err != nil {
			m.log.Warn("the stored audit trail of an ended session could not be read", "session", info.ID, "err", err)
		}
		return "", false
	}
	t := m.openTrail(info.Tenant, info.ID)
	return info.Tenant, t.rewrite(events)
}

func trailLimit() int { return maxEvents + len(noisyEvents)*maxNoisy + maxDropTypes + 16 }
