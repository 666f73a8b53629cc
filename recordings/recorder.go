package recordings

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/desktop"
)

// RecorderConfig says how sessions are recorded.
type RecorderConfig struct {
	// Dir keeps segments on the host until the recording is final, so a
	// crash of MinIO or of the gateway loses at most the open segment.
	Dir string
	// FPS is the frame rate of recordings (default 5).
	FPS int
	// Segment is the length of one segment (default 2s).
	Segment time.Duration
	// FFmpeg and FFprobe are the programs' paths (default from PATH).
	FFmpeg, FFprobe string
	Log             *slog.Logger
}

// Recorder records sessions' screens from outside the sandbox: it watches
// each session as a view-only VNC client, encodes H.264 with ffmpeg on the
// host into short MPEG-TS segments, uploads every finished segment to
// MinIO at once, and when the session ends joins them into one MP4 with a
// manifest.
type Recorder struct {
	cfg   RecorderConfig
	store *Store

	mu        sync.Mutex
	parts     map[string]*recording // by session
	finishing map[string]chan struct{}
}

// NewRecorder checks that ffmpeg is there.
func NewRecorder(cfg RecorderConfig, store *Store) (*Recorder, error) {
	if cfg.FPS <= 0 {
		cfg.FPS = 5
	}
	if cfg.Segment <= 0 {
		cfg.Segment = 2 * time.Second
	}
	if cfg.FFmpeg == "" {
		cfg.FFmpeg = "ffmpeg"
	}
	if cfg.FFprobe == "" {
		cfg.FFprobe = "ffprobe"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	for _, p := range []*string{&cfg.FFmpeg, &cfg.FFprobe} {
		full, err := exec.LookPath(*p)
		if err != nil {
			return nil, fmt.Errorf("recorder: %s not found (install ffmpeg): %w", *p, err)
		}
		*p = full
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	return &Recorder{cfg: cfg, store: store, parts: map[string]*recording{}, finishing: map[string]chan struct{}{}}, nil
}

// Target is a session to record.
type Target struct {
	Tenant, Session string
	// VNC is the session's VNC server, host:port.
	VNC string
	// Width and Height are the session's configured screen: the most the
	// recorder accepts from the session's VNC server.
	Width, Height int
	// Note writes an event to the session's audit trail (may be nil):
	// recording_interrupted and recording_resumed when the display goes
	// away and comes back, recording_failed when the recorder gives up.
	Note func(event string, fields map[string]any)
	// Running says whether the session still runs (may be nil): a
	// display lost when the session is ending is no interruption.
	Running func() bool
	// Serves, when set, is asked before each connection to VNC: false
	// means the address is no longer the session's (it ended, and the
	// address may be another session's soon), and the recording stops.
	Serves func() bool
}

// recording is one session being recorded, made of parts: one VNC
// connection and one ffmpeg each. The display going away (the session's
// VNC server restarting, a slow sandbox not answering yet) or a gateway
// restart ends a part; the next one starts when the display answers
// again, and the finished recording joins them.
type recording struct {
	Target
	dir    string
	prefix string // of the current part's segment files
	cancel context.CancelFunc
	done   chan struct{}
	ready  chan struct{} // closed at the first frame, or when run ends
	once   sync.Once
	// Set by run, read once done is closed.
	connected bool // a part ran at some time
	gaveUp    bool // recording_failed was noted
}

// ErrNothingRecorded is a recording whose session's display never
// answered while the session ran.
var ErrNothingRecorded = errors.New("the session's display never answered; nothing was recorded")

// Reconnecting: the first retry comes after retryFirst, doubling up to
// retryMax, for the life of the session. The recorder gives up only when
// the session's display keeps violating the protocol or recording cannot
// run on this host (giveUpAfter times in a row).
var (
	connectTimeout = 10 * time.Second
	retryFirst     = 200 * time.Millisecond
	retryMax       = 5 * time.Second
)

// A part that ran stableAfter resets the backoff; giveUpAfter failures
// in a row that retrying cannot fix end the recording.
const (
	stableAfter = 30 * time.Second
	giveUpAfter = 5
)

func (r *Recorder) sessionDir(tenant, session string) string {
	return filepath.Join(r.cfg.Dir, tenant, session)
}

// Start records the session until Finish is called. It connects to the
// session's display as soon as it answers, however long that takes, and
// reconnects whenever the connection is lost. The channel it returns is
// closed once the first frame of the display is in the recording (or the
// recording ended without one): a caller that waits on it before handing
// the session out has every moment of the session recorded.
func (r *Recorder) Start(t Target) <-chan struct{} {
	if t.Note == nil {
		t.Note = func(string, map[string]any) {}
	}
	if t.Running == nil {
		t.Running = func() bool { return true }
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.parts[t.Session]; ok {
		select {
		case <-p.done:
		default:
			return p.ready // already recording
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &recording{Target: t, dir: r.sessionDir(t.Tenant, t.Session), cancel: cancel, done: make(chan struct{}), ready: make(chan struct{})}
	r.parts[t.Session] = p
	go func() {
		defer close(p.done)
		defer p.isReady()
		r.run(ctx, p)
	}()
	return p.ready
}

func (p *recording) isReady() { p.once.Do(func() { close(p.ready) }) }

// run records parts until ctx ends, reconnecting with backoff.
func (r *Recorder) run(ctx context.Context, p *recording) {
	log := r.cfg.Log.With("session", p.Session, "tenant", p.Tenant)
	wait := retryFirst
	failed, interruptions := 0, 0
	var lost time.Time // when the display went away mid-recording
	started := time.Now()
	for {
		if p.Serves != nil && !p.Serves() {
			log.Info("the session's address is no longer its own: the recording stops")
			return
		}
		var began time.Time
		err := r.record(ctx, p, func() {
			if !p.connected {
				log.Info("recording the display", "after", time.Since(started).Round(time.Millisecond))
			}
			began, failed, p.connected = time.Now(), 0, true
			if !lost.IsZero() {
				p.Note("recording_resumed", map[string]any{"interruptions": interruptions, "gap_ms": time.Since(lost).Milliseconds()})
				log.Info("recording resumed", "gap", time.Since(lost))
				lost = time.Time{}
			}
		})
		if ctx.Err() != nil {
			return
		}
		if !p.Running() {
			// The session is ending; Finish makes the recording final.
			log.Debug("display gone with the session", "err", err)
			return
		}
		var local *localError
		switch {
		case !began.IsZero():
			if time.Since(began) > stableAfter {
				wait = retryFirst
			}
			interruptions++
			lost = time.Now()
			p.Note("recording_interrupted", map[string]any{"reason": publicReason(err), "interruptions": interruptions})
			log.Warn("recording interrupted; reconnecting", "err", err)
		case errors.Is(err, desktop.ErrProtocol) || errors.As(err, &local):
			failed++
			if failed >= giveUpAfter {
				reason := fmt.Sprintf("%s (%d attempts in a row)", publicReason(err), failed)
				log.Error("recording failed", "reason", reason, "err", err)
				p.Note("recording_failed", map[string]any{"reason": reason})
				p.gaveUp = true
				return
			}
			log.Warn("recording could not start; retrying", "err", err)
		default:
			log.Debug("session's display not answering yet", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, retryMax)
	}
}

// publicReason says why a part ended or could not start, for the
// session's audit trail: what the session's display did wrong, never the
// host's internals.
func publicReason(err error) string {
	var local *localError
	switch {
	case err == nil || errors.Is(err, io.EOF):
		return "the session's display closed the connection"
	case errors.As(err, &local):
		return "the gateway could not encode the recording"
	case errors.Is(err, desktop.ErrProtocol):
		return "the session's display was refused: " + err.Error()
	default:
		return "the session's display stopped answering"
	}
}

// localError is a failure on this host's side (ffmpeg, the disk):
// retrying does not help.
type localError struct{ err error }

func (e *localError) Error() string { return "recording on the gateway's host: " + e.err.Error() }
func (e *localError) Unwrap() error { return e.err }

// record connects to the session's display and records one part until the
// connection or ffmpeg ends or ctx is done. It calls connected once the
// part runs.
func (r *Recorder) record(ctx context.Context, p *recording, connected func()) error {
	if p.Width <= 0 || p.Height <= 0 {
		return &localError{fmt.Errorf("no screen size to bound the display by (%dx%d)", p.Width, p.Height)}
	}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return &localError{err}
	}
	dctx, cancel := context.WithTimeout(ctx, connectTimeout)
	vnc, err := desktop.Dial(dctx, p.VNC, p.Width, p.Height)
	cancel()
	if err != nil {
		return fmt.Errorf("connect to the session's display: %w", err)
	}
	p.prefix = strconv.FormatInt(time.Now().UnixMilli(), 10)
	defer vnc.Close()
	stop := context.AfterFunc(ctx, func() { vnc.Close() })
	defer stop()
	w, h := vnc.Width, vnc.Height
	fps, seg := r.cfg.FPS, r.cfg.Segment.Seconds()
	var stderr bytes.Buffer
	cmd := exec.Command(r.cfg.FFmpeg, "-hide_banner", "-loglevel", "error",
		"-f", "rawvideo", "-pix_fmt", "rgba", "-video_size", fmt.Sprintf("%dx%d", w, h), "-framerate", strconv.Itoa(fps), "-i", "pipe:0",
		"-an", "-c:v", "libx264", "-preset", "ultrafast", "-crf", "28", "-pix_fmt", "yuv420p",
		"-g", strconv.Itoa(int(float64(fps)*seg)), "-sc_threshold", "0",
		"-force_key_frames", fmt.Sprintf("expr:gte(t,n_forced*%g)", seg),
		"-f", "segment", "-segment_time", fmt.Sprintf("%g", seg), "-segment_format", "mpegts", "-reset_timestamps", "1",
		filepath.Join(p.dir, p.prefix+"-%06d.ts"))
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return &localError{err}
	}
	if err := cmd.Start(); err != nil {
		return &localError{fmt.Errorf("start ffmpeg: %w", err)}
	}
	connected()

	// The reader applies the server's updates and publishes the screen;
	// the writer sends it to ffmpeg at a fixed rate, repeating frames when
	// nothing changed, so the video's clock is the wall clock.
	var mu sync.Mutex
	frame := make([]byte, w*h*4)
	readErr := make(chan error, 1)
	go func() {
		if err := vnc.RequestUpdate(false); err != nil {
			readErr <- err
			return
		}
		for {
			rects, _, err := vnc.ReadUpdate()
			if err != nil {
				readErr <- err
				return
			}
			fb := vnc.Framebuffer()
			mu.Lock()
			for _, rc := range rects {
				for y := rc.Min.Y; y < rc.Max.Y; y++ {
					off := fb.PixOffset(rc.Min.X, y)
					n := rc.Dx() * 4
					copy(frame[off:off+n], fb.Pix[off:off+n])
				}
			}
			mu.Unlock()
			p.isReady() // the writer sends the display from now on
			if err := vnc.RequestUpdate(true); err != nil {
				readErr <- err
				return
			}
		}
	}()
	uploadDone := make(chan struct{})
	uctx, stopUploads := context.WithCancel(context.Background())
	go func() {
		defer close(uploadDone)
		r.uploadLoop(uctx, p, false)
	}()

	out := make([]byte, len(frame))
	start := time.Now()
	interval := time.Second / time.Duration(fps)
	var n int64
	var ended error
loop:
	for {
		due := start.Add(time.Duration(n) * interval)
		select {
		case ended = <-readErr:
			break loop
		case <-ctx.Done():
			break loop
		case <-time.After(time.Until(due)):
		}
		mu.Lock()
		copy(out, frame)
		mu.Unlock()
		if _, err := in.Write(out); err != nil {
			ended = &localError{fmt.Errorf("ffmpeg: %w", err)}
			break
		}
		n++
	}
	in.Close()
	werr := cmd.Wait()
	stopUploads()
	<-uploadDone
	// Everything ffmpeg wrote is complete now.
	r.uploadLoop(context.Background(), p, true)
	if ctx.Err() != nil {
		return nil
	}
	if ended != nil && !errors.Is(ended, io.EOF) {
		return ended
	}
	if werr != nil {
		return &localError{fmt.Errorf("ffmpeg: %v: %s", werr, strings.TrimSpace(stderr.String()))}
	}
	return ended
}

// segments lists the session's local segment files, oldest first.
func segments(dir string) []string {
	names, _ := filepath.Glob(filepath.Join(dir, "*.ts"))
	sort.Strings(names)
	return names
}

// uploadLoop uploads finished segments: all of them when final, else all
// but the one of this part that ffmpeg is still writing. Uploaded ones are
// marked with a ".up" file so they are not sent again; a failed upload
// (MinIO away) is retried on the next round.
func (r *Recorder) uploadLoop(ctx context.Context, p *recording, final bool) {
	for {
		files := segments(p.dir)
		open := ""
		if !final {
			for i := len(files) - 1; i >= 0; i-- {
				if strings.HasPrefix(filepath.Base(files[i]), p.prefix+"-") {
					open = files[i]
					break
				}
			}
		}
		for _, f := range files {
			if f == open {
				continue
			}
			if _, err := os.Stat(f + ".up"); err == nil {
				continue
			}
			if err := r.uploadSegment(ctx, p.Tenant, p.Session, f); err != nil {
				r.cfg.Log.Debug("segment upload failed; will retry", "session", p.Session, "err", err)
				break
			}
		}
		if final {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (r *Recorder) uploadSegment(ctx context.Context, tenant, session, path string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	name := filepath.Base(path)
	a := Artifact{ID: SegmentID(session, name), Session: session, Kind: KindSegment, Name: name, ContentType: "video/mp2t"}
	if _, err := r.store.PutFile(ctx, tenant, a, path); err != nil {
		return err
	}
	return os.WriteFile(path+".up", nil, 0o600)
}

// claim takes the session's finisher's place, waiting within ctx for
// one that has it, and the part recording now (nil: none), which is no
// longer the recorder's; done gives the place back.
func (r *Recorder) claim(ctx context.Context, session string) (p *recording, done func(), err error) {
	r.mu.Lock()
	for r.finishing[session] != nil {
		ch := r.finishing[session]
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		r.mu.Lock()
	}
	ch := make(chan struct{})
	r.finishing[session] = ch
	p = r.parts[session]
	delete(r.parts, session)
	r.mu.Unlock()
	return p, func() {
		r.mu.Lock()
		delete(r.finishing, session)
		r.mu.Unlock()
		close(ch)
	}, nil
}

// Hand stops recording the session on this host and stores in MinIO
// every segment this host has of it, for another replica to finish (a
// recording spread over replicas: the leader finishes what any replica
// recorded). The local copies go once all are stored; until ctx ends, a
// failed upload is tried again. recorded says whether a part ran here.
func (r *Recorder) Hand(ctx context.Context, tenant, session string) (recorded bool, err error) {
	// The finisher's place: the janitor leaves the directory alone meanwhile.
	p, done, err := r.claim(ctx, session)
	if err != nil {
		return false, err
	}
	defer done()
	if p != nil {
		p.cancel()
		<-p.done
		recorded = p.connected
	}
	if err := r.storeAll(ctx, tenant, session); err != nil {
		return recorded, err
	}
	os.RemoveAll(r.sessionDir(tenant, session))
	return recorded, nil
}

// HandLeft stores in MinIO the segments an earlier run on this host left
// of the session (nothing records it here). The local copies go only if
// joined, asked once all are stored, says the recording's end has not
// read the store yet (it will join them); else they stay, for a Finish
// on this host to make a recording of.
func (r *Recorder) HandLeft(ctx context.Context, tenant, session string, joined func(context.Context) bool) error {
	p, done, err := r.claim(ctx, session)
	if err != nil {
		return err
	}
	defer done()
	if p != nil {
		r.mu.Lock()
		r.parts[session] = p // not a leftover: it records here
		r.mu.Unlock()
		return fmt.Errorf("session %s is recorded on this host", session)
	}
	if err := r.storeAll(ctx, tenant, session); err != nil {
		return err
	}
	if !joined(ctx) {
		return fmt.Errorf("the recording of session %s may have been finished without them: they stay on this host", session)
	}
	os.RemoveAll(r.sessionDir(tenant, session))
	return nil
}

// storeAll stores every segment of the session on this host that is not
// stored yet, trying a failed upload again until ctx ends.
func (r *Recorder) storeAll(ctx context.Context, tenant, session string) error {
	dir := r.sessionDir(tenant, session)
	for {
		left := 0
		for _, f := range segments(dir) {
			if _, err := os.Stat(f + ".up"); err == nil {
				continue
			}
			if err := r.uploadSegment(ctx, tenant, session, f); err != nil {
				left++
			}
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d segments of session %s not stored; they stay on this host: %w", left, session, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// Manifest describes a finished recording.
type Manifest struct {
	Session   string        `json:"session"`
	Recording string        `json:"recording"` // artifact id of the MP4
	Start     time.Time     `json:"start"`
	End       time.Time     `json:"end"`
	Duration  float64       `json:"duration_seconds"`
	Size      int64         `json:"size"`
	SHA256    string        `json:"sha256"`
	FPS       int           `json:"fps"`
	Segments  []SegmentInfo `json:"segments"`
}

// SegmentInfo is one segment that went into a recording.
type SegmentInfo struct {
	Name   string    `json:"name"`
	Start  time.Time `json:"start"`
	Size   int64     `json:"size"`
	SHA256 string    `json:"sha256"`
}

// Finish ends the session's recording and makes it final: one MP4 and its
// manifest as artifacts, the segments removed. Segments only in MinIO (the
// host lost them) are fetched. With no segments at all there is nothing to
// finish, and no error, unless this recorder recorded the session and its
// display never answered: then ErrNothingRecorded, which the caller puts
// in the audit trail as recording_failed (it is not retried).
func (r *Recorder) Finish(ctx context.Context, tenant, session string, end time.Time) (*Manifest, error) {
	// One finisher at a time; a second waits, then finds the work done.
	p, done, err := r.claim(ctx, session)
	if err != nil {
		return nil, err
	}
	defer done()
	m, err := r.finish(ctx, tenant, session, end, p)
	if err != nil && !errors.Is(err, ErrNothingRecorded) {
		// Leave a mark for the janitor to try again.
		os.WriteFile(filepath.Join(r.sessionDir(tenant, session), "retry"), nil, 0o600)
	}
	return m, err
}

func (r *Recorder) finish(ctx context.Context, tenant, session string, end time.Time, p *recording) (*Manifest, error) {
	if p != nil {
		p.cancel()
		<-p.done
	}
	dir := r.sessionDir(tenant, session)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// Segments another gateway uploaded but this host does not have.
	remote, err := r.store.ListKind(ctx, tenant, session, KindSegment)
	if err != nil {
		return nil, fmt.Errorf("list segments: %w", err)
	}
	for _, a := range remote {
		local := filepath.Join(dir, filepath.Base(a.Name))
		if _, err := os.Stat(local); err == nil || !strings.HasSuffix(a.Name, ".ts") {
			continue
		}
		f, err := os.Create(local)
		if err != nil {
			return nil, err
		}
		err = r.store.Fetch(ctx, tenant, a.ID, f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("fetch segment %s: %w", a.Name, err)
		}
		os.WriteFile(local+".up", nil, 0o600)
	}
	files := segments(dir)
	if len(files) == 0 {
		os.RemoveAll(dir)
		if p != nil && !p.connected && !p.gaveUp {
			return nil, ErrNothingRecorded
		}
		return nil, nil
	}
	m := &Manifest{Session: session, End: end.UTC(), FPS: r.cfg.FPS}
	var list strings.Builder
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil || st.Size() == 0 {
			continue // an empty segment ffmpeg opened as it was stopped
		}
		fmt.Fprintf(&list, "file '%s'\n", f)
		si := SegmentInfo{Name: filepath.Base(f), Size: st.Size(), Start: segmentStart(filepath.Base(f), r.cfg.Segment)}
		si.SHA256, _ = fileSHA256(f)
		m.Segments = append(m.Segments, si)
	}
	if len(m.Segments) == 0 {
		os.RemoveAll(dir)
		return nil, nil
	}
	m.Start = m.Segments[0].Start
	listPath := filepath.Join(dir, "segments.txt")
	if err := os.WriteFile(listPath, []byte(list.String()), 0o600); err != nil {
		return nil, err
	}
	out := filepath.Join(dir, "recording.mp4")
	cmd := exec.CommandContext(ctx, r.cfg.FFmpeg, "-hide_banner", "-loglevel", "error", "-y",
		"-f", "concat", "-safe", "0", "-i", listPath, "-c", "copy", "-movflags", "+faststart", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("join segments: %v: %s", err, strings.TrimSpace(string(b)))
	}
	m.Duration, _ = r.duration(ctx, out)
	rec, err := r.store.PutFile(ctx, tenant, Artifact{Session: session, Kind: KindRecording, Name: "recording.mp4", ContentType: "video/mp4"}, out)
	if err != nil {
		return nil, fmt.Errorf("store recording: %w", err)
	}
	m.Recording, m.Size, m.SHA256 = rec.ID, rec.Size, rec.SHA256
	raw, _ := json.MarshalIndent(m, "", "  ")
	if _, err := r.store.Put(ctx, tenant, session, KindRecording, "recording-manifest.json", "application/json", raw); err != nil {
		return nil, fmt.Errorf("store manifest: %w", err)
	}
	// The recording is safe; its pieces can go.
	for _, a := range remote {
		r.store.Delete(ctx, tenant, a.ID)
	}
	for _, f := range files {
		r.store.Delete(ctx, tenant, SegmentID(session, filepath.Base(f)))
	}
	os.RemoveAll(dir)
	return m, nil
}

// segmentStart reads a segment's start from its name: the part's start
// in Unix milliseconds and the segment's number within the part.
func segmentStart(name string, seg time.Duration) time.Time {
	base := strings.TrimSuffix(name, ".ts")
	i := strings.LastIndexByte(base, '-')
	if i < 0 {
		return time.Time{}
	}
	ms, err1 := strconv.ParseInt(base[:i], 10, 64)
	n, err2 := strconv.Atoi(base[i+1:])
	if err1 != nil || err2 != nil {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC().Add(time.Duration(n) * seg)
}

func (r *Recorder) duration(ctx context.Context, path string) (float64, error) {
	out, err := exec.CommandContext(ctx, r.cfg.FFprobe, "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0", path).Output()
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
}

// Pending lists the recordings left unfinished, as tenant/session pairs:
// with retry, only those a Finish failed on; without, all with local
// segments and no part recording now.
func (r *Recorder) Pending(retry bool) [][2]string {
	dirs, _ := filepath.Glob(filepath.Join(r.cfg.Dir, "*", "s-*"))
	var out [][2]string
	for _, d := range dirs {
		tenant, session := filepath.Base(filepath.Dir(d)), filepath.Base(d)
		r.mu.Lock()
		_, active := r.parts[session]
		busy := r.finishing[session] != nil
		r.mu.Unlock()
		if active || busy {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "retry")); retry && err != nil {
			continue
		}
		out = append(out, [2]string{tenant, session})
	}
	return out
}
