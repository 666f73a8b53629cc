package session

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ExecSpec is a command to run in a session.
type ExecSpec struct {
	Args     []string
	Env      []string // KEY=VALUE, added to the session's environment
	Cwd      string   // default: the session user's home
	Root     bool     // run as root (still without capabilities)
	Stdin    io.Reader
	Stdout   io.Writer
	Stderr   io.Writer // ignored with Terminal
	Terminal bool
	Cols     uint16
	Rows     uint16
}

// Process is a command running in a session.
type Process struct {
	ns      func(context.Context) context.Context // adds the containerd namespace
	proc    containerd.Process
	statusC <-chan containerd.ExitStatus
	started time.Time
	once    sync.Once
	closed  chan struct{} // closed by Close
	log     func(error)
}

var execSeq atomic.Uint64

// homeDir is the session user's home inside every session.
const homeDir = "/home/sandgate"

// Start runs a command in the session through containerd's exec, so it
// works the same under every runtime handler. The caller must Wait and
// then Close.
func (m *Manager) Start(ctx context.Context, tenant, id string, spec ExecSpec) (*Process, error) {
	if len(spec.Args) == 0 || spec.Args[0] == "" {
		return nil, publicf(ErrInvalid, "cmd must name a program", nil)
	}
	s, err := m.lookup(tenant, id)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	c, state := s.container, s.info.State
	m.mu.Unlock()
	if state != StateRunning {
		return nil, publicf(ErrConflict, "the session is "+string(state), nil)
	}
	return m.startIn(ctx, c, id, spec)
}

// startIn is Start in a container, whatever its session's state.
func (m *Manager) startIn(ctx context.Context, c containerd.Container, id string, spec ExecSpec) (*Process, error) {
	ctx = m.ctx(ctx)
	cspec, err := c.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("container spec: %w", err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("task: %w", err)
	}
	p := *cspec.Process
	p.Args = spec.Args
	p.Terminal = spec.Terminal
	p.Cwd = homeDir
	if spec.Cwd != "" {
		p.Cwd = spec.Cwd
	}
	p.Env = append(append([]string{}, cspec.Process.Env...), "DISPLAY=:0", "HOME="+homeDir, "USER=sandgate", "TERM=xterm-256color")
	p.Env = append(p.Env, spec.Env...)
	if spec.Root {
		p.User = specs.User{UID: 0, GID: 0}
	}
	if spec.Terminal {
		p.ConsoleSize = &specs.Box{Width: uint(max(spec.Cols, 1)), Height: uint(max(spec.Rows, 1))}
	}

	stdin := spec.Stdin
	if stdin == nil {
		stdin = bytes.NewReader(nil)
	}
	stdout, stderr := spec.Stdout, spec.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	er := &eofReader{r: stdin, eof: make(chan struct{})}
	opts := []cio.Opt{cio.WithStreams(er, stdout, stderr)}
	if spec.Terminal {
		opts = []cio.Opt{cio.WithStreams(er, stdout, nil), cio.WithTerminal}
	}
	execID := fmt.Sprintf("x%d-%d", time.Now().UnixNano(), execSeq.Add(1))
	proc, err := task.Exec(ctx, execID, &p, cio.NewCreator(opts...))
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, publicf(ErrConflict, "the session is not running", err)
		}
		return nil, fmt.Errorf("exec: %w", err)
	}
	pr := &Process{proc: proc, ns: m.ctx, closed: make(chan struct{}), log: func(err error) { m.log.Warn("exec", "session", id, "err", err) }}
	statusC, err := proc.Wait(ctx)
	if err != nil {
		pr.Close()
		return nil, fmt.Errorf("exec wait: %w", err)
	}
	pr.statusC = statusC
	if err := proc.Start(ctx); err != nil {
		pr.Close()
		if errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err) {
			return nil, publicf(ErrInvalid, fmt.Sprintf("cannot run %q in the session: no such program, or cwd missing", spec.Args[0]), err)
		}
		return nil, fmt.Errorf("exec start: %w", err)
	}
	pr.started = time.Now()
	// The shim keeps the process's stdin open until told: pass EOF on,
	// but only once the process has started. Stdin is copied from the
	// moment Exec made its pipes, so an empty or tiny stdin is often done
	// before that, and a close sent then was lost (cat > file waited
	// forever on a 0- or 1-byte upload).
	go func() {
		select {
		case <-er.eof:
		case <-pr.closed:
			return
		}
		cctx, cancel := context.WithTimeout(m.ctx(context.Background()), 5*time.Second)
		defer cancel()
		if err := proc.CloseIO(cctx, containerd.WithStdinCloser); err != nil && !errdefs.IsNotFound(err) {
			pr.log(fmt.Errorf("closing stdin: %w", err))
		}
	}()
	return pr, nil
}

// eofReader closes eof once its reader is exhausted.
type eofReader struct {
	r    io.Reader
	once sync.Once
	eof  chan struct{}
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil {
		e.once.Do(func() { close(e.eof) })
	}
	return n, err
}

// Wait waits for the process to exit and for its output to be copied, and
// returns the exit code. When ctx ends first the process is killed; when
// it ends after the exit while the output is still open (a child the
// process left behind holds it), the copy is cut off.
func (p *Process) Wait(ctx context.Context) (int, error) {
	select {
	case st := <-p.statusC:
		copied := make(chan struct{})
		go func() {
			p.proc.IO().Wait()
			close(copied)
		}()
		select {
		case <-copied:
		case <-ctx.Done():
			p.proc.IO().Cancel()
			p.proc.IO().Close()
			select {
			case <-copied:
			case <-time.After(5 * time.Second):
			}
			return -1, fmt.Errorf("the output stayed open after the command exited: %w", ctx.Err())
		}
		code, _, err := st.Result()
		return int(code), err
	case <-ctx.Done():
		p.Signal(syscall.SIGKILL)
		select {
		case <-p.statusC:
		case <-time.After(5 * time.Second):
		}
		return -1, ctx.Err()
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig syscall.Signal) error {
	ctx, cancel := context.WithTimeout(p.ns(context.Background()), 5*time.Second)
	defer cancel()
	return p.proc.Kill(ctx, sig)
}

// Resize sets the terminal size of a Terminal process.
func (p *Process) Resize(ctx context.Context, cols, rows uint16) error {
	return p.proc.Resize(p.ns(ctx), uint32(cols), uint32(rows))
}

// Close removes the process from containerd, killing it if it still runs.
func (p *Process) Close() {
	p.once.Do(func() {
		close(p.closed)
		ctx, cancel := context.WithTimeout(p.ns(context.Background()), 10*time.Second)
		defer cancel()
		if _, err := p.proc.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			p.log(err)
		}
	})
}

// ExecResult is how a command in a session ended.
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// maxExecOutput bounds what Exec keeps of a command's output.
const maxExecOutput = 4 << 20

// Exec runs argv as the session's user with its display and returns the
// output; for short commands such as desktop input.
func (m *Manager) Exec(ctx context.Context, tenant, id string, argv []string) (ExecResult, error) {
	var stdout, stderr limitedBuffer
	stdout.max, stderr.max = maxExecOutput, maxExecOutput
	p, err := m.Start(ctx, tenant, id, ExecSpec{Args: argv, Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return ExecResult{}, err
	}
	defer p.Close()
	code, err := p.Wait(ctx)
	if err != nil {
		return ExecResult{}, err
	}
	return ExecResult{ExitCode: code, Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}, nil
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		if len(p) > room {
			b.Buffer.Write(p[:room])
		} else {
			b.Buffer.Write(p)
		}
	}
	return len(p), nil
}
