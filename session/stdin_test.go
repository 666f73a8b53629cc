package session

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/containerd/containerd/cio"
	"github.com/containerd/fifo"
)

// TestStdinCloseAfterShimReads runs a command's stdin through
// containerd's own copy (cio) into real FIFOs, with the far end opened
// in the order the runc shim (v1.6, pkg/process) opens it: its own
// writer first, its reader lazily after Start has answered, and CloseIO
// closing its writer whenever it comes. The shim's reader is late here
// (it opens when told to close, or after a lag); the command must still
// get every byte and then EOF. A reader that says "ended" the moment its
// stream ends is the control: its close comes before the shim's reader
// exists, and that reader then waits forever, as an empty or one-byte
// upload did for 30 minutes.
func TestStdinCloseAfterShimReads(t *testing.T) {
	// An HTTP body's stream (fasthttp's) gives its last bytes with EOF.
	for _, content := range []string{"", "z", "zz", strings.Repeat("x", 100<<10)} {
		for _, body := range []io.Reader{strings.NewReader(content), iotest.DataErrReader(strings.NewReader(content))} {
			in := newStdinReader(body, make(chan struct{}))
			got, err := shimStdin(t, in, in.ended, in.shimStarted, 10*time.Second)
			if err != nil || got != content {
				t.Fatalf("%d bytes in: the command read %d (%v)", len(content), len(got), err)
			}
		}
	}
	// The control hangs unless containerd's copy is still holding the
	// FIFO when the late reader opens (a stall of the lag's length): it
	// has three tries.
	for _, content := range []string{"", "z"} {
		hung := false
		for try := 0; try < 3 && !hung; try++ {
			naive := &endedReader{r: iotest.DataErrReader(strings.NewReader(content)), ended: make(chan struct{})}
			_, err := shimStdin(t, naive, naive.ended, func(string) {}, time.Second)
			hung = err != nil
		}
		if !hung {
			t.Fatalf("the control: a %d-byte stdin closed at once reached the command three times; the test cannot fail", len(content))
		}
	}
}

// shimStdin plays the shim's side of a stdin FIFO and returns what the
// command would read, or an error when its stdin did not open and end
// within bound (the control waits on what never comes: a short bound).
func shimStdin(t *testing.T, stdin io.Reader, ended <-chan struct{}, exists func(path string), bound time.Duration) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	fifos, err := cio.NewCreator(cio.WithStreams(stdin, &stdout, &stderr), cio.WithFIFODir(t.TempDir()))("x")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { fifos.Cancel(); fifos.Close() }()
	path := fifos.Config().Stdin
	exists(path) // task.Exec has answered

	// Start: the shim's own writer, opened lazily...
	w, err := fifo.OpenFifo(context.Background(), path, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	// ...Start answers a while later (containerd's copy is waiting in
	// its open by then), and CloseIO, sent no earlier, closes the
	// shim's writer.
	started := time.After(50 * time.Millisecond)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		<-ended
		<-started
		w.Close()
	}()
	defer func() { <-closed }()
	defer w.Close()
	// The shim's reader is late: it opens a lag after the close came, or
	// after Start if the close waits for it. (The lag stands for the
	// shim's goroutine not having run; it is not a wait for anything.)
	const lag = 200 * time.Millisecond
	select {
	case <-closed:
	case <-time.After(lag):
	}
	time.Sleep(lag)
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	r, err := fifo.OpenFifo(ctx, path, syscall.O_RDONLY, 0)
	if err != nil {
		return "", err // no writer left to meet
	}
	defer r.Close()
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(r)
		got <- b
	}()
	select {
	case b := <-got:
		return string(b), nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// endedReader is the old way: ended as soon as the stream is.
type endedReader struct {
	r     io.Reader
	ended chan struct{}
	once  sync.Once
}

func (e *endedReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil {
		e.once.Do(func() { close(e.ended) })
	}
	return n, err
}
