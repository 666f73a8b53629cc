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
	"sync/atomic"
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
	parts     map[string]*part // by session
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
	return &Recorder{cfg: cfg, store: store, parts: map[string]*part{}, finishing: map[string]chan struct{}{}}, nil
}

// part is one continuous stretch of a recording: one VNC connection and
// one ffmpeg. A gateway restart ends a part; the next gateway starts
// another, and the finished recording joins them.
type part struct {
	tenant, session string
	dir, prefix     string
	cancel          context.CancelFunc
	done            chan struct{}
	stats           Stats
}

// Stats count what a part did; Late counts frames written behind their
// time, the sign that the machine does not keep up.
type Stats struct {
	Frames atomic.Int64
	Late   atomic.Int64
}

func (r *Recorder) sessionDir(tenant, session string) string {
	return filepath.Join(r.cfg.Dir, tenant, session)
}

// Start begins a part of the session's recording; it runs until the
// session's VNC server goes away or Finish is called.
func (r *Recorder) Start(tenant, session, vncAddr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.parts[session]; ok {
		select {
		case <-p.done:
		default:
			return // already recording
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &part{
		tenant: tenant, session: session, dir: r.sessionDir(tenant, session),
		prefix: strconv.FormatInt(time.Now().UnixMilli(), 10), cancel: cancel, done: make(chan struct{}),
	}
	r.parts[session] = p
	go func() {
		defer close(p.done)
		log := r.cfg.Log.With("session", session, "tenant", tenant)
		if err := r.record(ctx, p, vncAddr); err != nil && ctx.Err() == nil {
			log.Warn("recording part ended", "err", err)
		}
	}()
}

// Stats returns the counters of the session's current part, if any.
func (r *Recorder) Stats(session string) (frames, late int64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.parts[session]
	if !ok {
		return 0, 0, false
	}
	return p.stats.Frames.Load(), p.stats.Late.Load(), true
}

func (r *Recorder) record(ctx context.Context, p *part, vncAddr string) error {
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	vnc, err := desktop.Dial(dctx, vncAddr)
	cancel()
	if err != nil {
		return fmt.Errorf("connect to the session's display: %w", err)
	}
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
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start ffmpeg: %w", err)
	}

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
		if time.Since(due) > 2*interval {
			p.stats.Late.Add(1)
		}
		mu.Lock()
		copy(out, frame)
		mu.Unlock()
		if _, err := in.Write(out); err != nil {
			ended = fmt.Errorf("ffmpeg: %w", err)
			break
		}
		n++
		p.stats.Frames.Add(1)
	}
	in.Close()
	werr := cmd.Wait()
	stopUploads()
	<-uploadDone
	// Everything ffmpeg wrote is complete now.
	r.uploadLoop(context.Background(), p, true)
	if werr != nil {
		return fmt.Errorf("ffmpeg: %v: %s", werr, strings.TrimSpace(stderr.String()))
	}
	if ended != nil && !errors.Is(ended, io.EOF) && ctx.Err() == nil {
		return fmt.Errorf("display: %w", ended)
	}
	return nil
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
func (r *Recorder) uploadLoop(ctx context.Context, p *part, final bool) {
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
			if err := r.uploadSegment(ctx, p.tenant, p.session, f); err != nil {
				r.cfg.Log.Debug("segment upload failed; will retry", "session", p.session, "err", err)
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
// finish, and no error.
func (r *Recorder) Finish(ctx context.Context, tenant, session string, end time.Time) (*Manifest, error) {
	// One finisher at a time; a second waits, then finds the work done.
	r.mu.Lock()
	for r.finishing[session] != nil {
		ch := r.finishing[session]
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		r.mu.Lock()
	}
	ch := make(chan struct{})
	r.finishing[session] = ch
	p := r.parts[session]
	delete(r.parts, session)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.finishing, session)
		r.mu.Unlock()
		close(ch)
	}()
	m, err := r.finish(ctx, tenant, session, end, p)
	if err != nil {
		// Leave a mark for the janitor to try again.
		os.WriteFile(filepath.Join(r.sessionDir(tenant, session), "retry"), nil, 0o600)
	}
	return m, err
}

func (r *Recorder) finish(ctx context.Context, tenant, session string, end time.Time, p *part) (*Manifest, error) {
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
