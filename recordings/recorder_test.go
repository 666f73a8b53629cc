package recordings

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// fakeS3 is an in-memory stand-in for MinIO that takes every PUT.
func fakeS3(t *testing.T) *Store {
	t.Helper()
	var mu sync.Mutex
	objects := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Query().Has("location"):
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><LocationConstraint xmlns="http://s3.amazonaws.com/doc/2006-03-01/">us-east-1</LocationConstraint>`)
		case r.Method == http.MethodPut:
			n, _ := io.Copy(io.Discard, r.Body)
			mu.Lock()
			objects[r.URL.Path] = int(n)
			mu.Unlock()
			w.Header().Set("ETag", `"0123456789abcdef0123456789abcdef"`)
		default:
			http.Error(w, "not here", http.StatusNotImplemented)
		}
	}))
	t.Cleanup(srv.Close)
	c, err := minio.New(strings.TrimPrefix(srv.URL, "http://"), &minio.Options{Creds: credentials.NewStaticV4("k", "s", ""), Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	return &Store{client: c, cfg: Config{Bucket: "test"}}
}

// vncServer is an in-process fake VNC server on addr serving a w x h
// screen: it answers every update request with the whole screen in one
// colour, a little later. It counts connections; drop closes the current
// one.
type vncServer struct {
	ln       net.Listener
	accepted atomic.Int32
	requests atomic.Int32
	mu       sync.Mutex
	conn     net.Conn
}

func serveVNC(t *testing.T, addr string, w, h uint16) *vncServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &vncServer{ln: ln}
	t.Cleanup(func() { ln.Close(); s.drop() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			s.mu.Lock()
			s.conn = c
			s.mu.Unlock()
			go s.serve(c, w, h)
		}
	}()
	return s
}

func (s *vncServer) drop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Close()
	}
}

func (s *vncServer) serve(c net.Conn, w, h uint16) {
	defer c.Close()
	c.Write(serverInit(w, h))
	if _, err := io.ReadFull(c, make([]byte, 12+2+20+8)); err != nil {
		return
	}
	for {
		if _, err := io.ReadFull(c, make([]byte, 10)); err != nil {
			return
		}
		s.requests.Add(1)
		time.Sleep(50 * time.Millisecond)
		var b bytes.Buffer
		b.Write([]byte{0, 0, 0, 1})
		binary.Write(&b, binary.BigEndian, [4]uint16{0, 0, w, h})
		b.Write([]byte{0, 0, 0, 0})
		b.Write(bytes.Repeat([]byte{200, 30, 30, 0}, int(w)*int(h)))
		if _, err := c.Write(b.Bytes()); err != nil {
			return
		}
	}
}

// serverInit is a server's side of the handshake for security None.
func serverInit(w, h uint16) []byte {
	var b bytes.Buffer
	b.WriteString("RFB 003.008\n\x01\x01\x00\x00\x00\x00")
	binary.Write(&b, binary.BigEndian, struct {
		W, H uint16
		PF   [16]byte
		NLen uint32
	}{w, h, [16]byte{32, 24, 0, 1}, 0})
	return b.Bytes()
}

// freeAddr is a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// trail collects what the recorder notes for the audit trail.
type trail struct {
	mu     sync.Mutex
	events []string
	fields []map[string]any
}

func (tr *trail) note(ev string, f map[string]any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.events = append(tr.events, ev)
	tr.fields = append(tr.fields, f)
}

func (tr *trail) count(ev string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, e := range tr.events {
		if e == ev {
			n++
		}
	}
	return n
}

func (tr *trail) String() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var b strings.Builder
	for i, e := range tr.events {
		fmt.Fprintf(&b, "%s %v; ", e, tr.fields[i])
	}
	return b.String()
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const testSession = "s-0123456789abcdef"

func newTestRecorder(t *testing.T) *Recorder {
	t.Helper()
	if _, err := exec.LookPath("ffmpeg"); err != nil {
		t.Skip("ffmpeg is not installed (deploy/setup.sh installs it)")
	}
	retryFirst, retryMax = 20*time.Millisecond, 200*time.Millisecond
	t.Cleanup(func() { retryFirst, retryMax = 200*time.Millisecond, 5*time.Second })
	r, err := NewRecorder(RecorderConfig{Dir: t.TempDir(), FPS: 5, Segment: time.Second}, fakeS3(t))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// stop ends the recording without finalising it.
func stop(r *Recorder, session string) {
	r.mu.Lock()
	p := r.parts[session]
	r.mu.Unlock()
	p.cancel()
	<-p.done
}

// parts lists the distinct parts among the session's local segments.
func parts(r *Recorder, session string) map[string]bool {
	out := map[string]bool{}
	for _, f := range segments(r.sessionDir("t", session)) {
		out[strings.SplitN(filepath.Base(f), "-", 2)[0]] = true
	}
	return out
}

// TestRecorderWaitsForDisplay: a display that answers only after a while
// (a slow sandbox start) is recorded from when it answers; a display that
// answers with more than the session's screen is given up on, with the
// reason in the trail.
func TestRecorderWaitsForDisplay(t *testing.T) {
	r := newTestRecorder(t)
	addr := freeAddr(t)
	var tr trail
	ready := r.Start(Target{Tenant: "t", Session: testSession, VNC: addr, Width: 64, Height: 48, Note: tr.note})
	defer stop(r, testSession)
	time.Sleep(time.Second) // nothing answers for a second: several attempts fail
	select {
	case <-ready:
		t.Fatal("ready before the display answered")
	default:
	}
	srv := serveVNC(t, addr, 64, 48)
	select {
	case <-ready:
	case <-time.After(20 * time.Second):
		t.Fatal("not ready 20 s after the display answered")
	}
	if srv.requests.Load() < 1 {
		t.Fatal("ready before the display sent a frame")
	}
	waitFor(t, 20*time.Second, "the recorder connects and records", func() bool {
		return srv.requests.Load() >= 5 && len(parts(r, testSession)) == 1
	})
	if n := tr.count("recording_failed") + tr.count("recording_interrupted"); n != 0 {
		t.Fatalf("trail: %s", &tr)
	}

	// The control beside it: a display announcing more than the session's
	// screen never records, and the trail says why.
	hostile := freeAddr(t)
	ln, err := net.Listen("tcp", hostile)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write(serverInit(65535, 65535))
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	var htr trail
	const other = "s-fedcba9876543210"
	hready := r.Start(Target{Tenant: "t", Session: other, VNC: hostile, Width: 64, Height: 48, Note: htr.note})
	defer stop(r, other)
	waitFor(t, 20*time.Second, "recording_failed", func() bool { return htr.count("recording_failed") == 1 })
	select {
	case <-hready: // a recording that gave up does not hold its session back
	case <-time.After(5 * time.Second):
		t.Fatal("not ready after giving up")
	}
	if s := htr.String(); !strings.Contains(s, "65535x65535") || htr.count("recording_interrupted") != 0 {
		t.Fatalf("trail: %s", s)
	}
	if len(parts(r, other)) != 0 {
		t.Fatal("a refused display was recorded")
	}
}

// TestRecorderResumes: a display that drops mid-recording is reconnected
// to, and the trail says so.
func TestRecorderResumes(t *testing.T) {
	r := newTestRecorder(t)
	addr := freeAddr(t)
	srv := serveVNC(t, addr, 64, 48)
	var tr trail
	r.Start(Target{Tenant: "t", Session: testSession, VNC: addr, Width: 64, Height: 48, Note: tr.note})
	defer stop(r, testSession)
	waitFor(t, 20*time.Second, "the first part records", func() bool { return srv.requests.Load() >= 5 && len(parts(r, testSession)) == 1 })
	// Part prefixes are milliseconds: let the next one differ.
	time.Sleep(10 * time.Millisecond)
	srv.drop()
	waitFor(t, 20*time.Second, "the recorder reconnects", func() bool { return srv.accepted.Load() >= 2 && tr.count("recording_resumed") == 1 })
	before := srv.requests.Load()
	waitFor(t, 20*time.Second, "the second part records", func() bool {
		return srv.requests.Load() >= before+5 && len(parts(r, testSession)) == 2
	})
	if tr.count("recording_interrupted") != 1 || tr.count("recording_failed") != 0 {
		t.Fatalf("trail: %s", &tr)
	}
}

// TestRecorderSessionEnding: a display lost because the session is ending
// is no interruption: nothing is noted and no reconnect is tried.
func TestRecorderSessionEnding(t *testing.T) {
	r := newTestRecorder(t)
	addr := freeAddr(t)
	srv := serveVNC(t, addr, 64, 48)
	var tr trail
	var running atomic.Bool
	running.Store(true)
	ready := r.Start(Target{Tenant: "t", Session: testSession, VNC: addr, Width: 64, Height: 48, Note: tr.note, Running: running.Load})
	defer stop(r, testSession)
	<-ready
	running.Store(false)
	srv.drop()
	r.mu.Lock()
	done := r.parts[testSession].done
	r.mu.Unlock()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the recorder went on after the session ended")
	}
	if srv.accepted.Load() != 1 || tr.count("recording_interrupted") != 0 {
		t.Fatalf("%d connections; trail: %s", srv.accepted.Load(), &tr)
	}
}

// TestHandLeft: segments an earlier run left on the host are stored; the
// local copies go only when the recording's end will still join them
// (joined), and stay otherwise, for a Finish here. A session recorded
// here now is not a leftover: its part goes on.
func TestHandLeft(t *testing.T) {
	r := newTestRecorder(t)
	ctx := context.Background()
	leave := func(session string) string {
		dir := r.sessionDir("t", session)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"1000-000000.ts", "1000-000001.ts"} {
			os.WriteFile(filepath.Join(dir, n), []byte("segment"), 0o600)
		}
		os.WriteFile(filepath.Join(dir, "1000-000000.ts.up"), nil, 0o600) // stored before the death
		return dir
	}
	stored := func(dir string) bool {
		_, err := os.Stat(filepath.Join(dir, "1000-000001.ts.up"))
		return err == nil
	}

	dir := leave("s-0000000000000001")
	asked := 0
	if err := r.HandLeft(ctx, "t", "s-0000000000000001", func(context.Context) bool { asked++; return true }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) || asked != 1 {
		t.Errorf("joined: the local copies stay (%v), or joined was asked %d times", err, asked)
	}

	dir = leave("s-0000000000000002")
	if err := r.HandLeft(ctx, "t", "s-0000000000000002", func(context.Context) bool { return false }); err == nil {
		t.Error("not joined: no error")
	}
	if !stored(dir) || len(segments(dir)) != 2 {
		t.Errorf("not joined: stored %v, %d local segments, want both kept", stored(dir), len(segments(dir)))
	}
	if p := r.Pending(false); len(p) != 1 || p[0] != [2]string{"t", "s-0000000000000002"} {
		t.Errorf("pending %v, want the one kept for a Finish", p)
	}

	vnc := serveVNC(t, freeAddr(t), 64, 48)
	var tr trail
	<-r.Start(Target{Tenant: "t", Session: "s-0000000000000003", VNC: vnc.ln.Addr().String(), Width: 64, Height: 48, Note: tr.note})
	if err := r.HandLeft(ctx, "t", "s-0000000000000003", func(context.Context) bool { return true }); err == nil {
		t.Error("a session recorded here was taken for a leftover")
	}
	r.mu.Lock()
	_, recording := r.parts["s-0000000000000003"]
	r.mu.Unlock()
	if !recording {
		t.Error("the part recording here was dropped")
	}
	stop(r, "s-0000000000000003")
}
