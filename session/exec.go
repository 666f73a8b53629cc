package session

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"syscall"
	"time"
)

// ExecSpec is a command to run in a session.
type ExecSpec struct {
	Args  []string
	Env   []string // KEY=VALUE, added to the session's environment
	Cwd   string   // default: the session user's home
	Root  bool     // run as root (still without capabilities)
	Stdin io.Reader
	// StdinSize is how many bytes Stdin holds, when known (0: not
	// known). A backend whose stdin can lose its end (the Pod exec API)
	// reads that many and no more, rather than wait for the end.
	StdinSize int64
	Stdout    io.Writer
	Stderr    io.Writer // ignored with Terminal
	Terminal  bool
	Cols      uint16
	Rows      uint16
}

// Process is a command running in a session.
type Process struct {
	p   ExecProc
	log func(error)
}

var execSeq atomic.Uint64

// homeDir is the session user's home inside every session.
const homeDir = "/home/sandgate"

// WorkspaceDir, under a session's home, is where every backend mounts
// the session's workspace volume: a directory the session user may not
// own (a Pod's emptyDir is root's).
const WorkspaceDir = "workspace"

// Start runs a command in the session through its backend's exec, so it
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
	sb, state := s.box, s.info.State
	m.mu.Unlock()
	if state != StateRunning {
		return nil, publicf(ErrConflict, "the session is "+string(state), nil)
	}
	return m.startIn(ctx, sb, id, spec)
}

// startIn is Start in a sandbox, whatever its session's state.
func (m *Manager) startIn(ctx context.Context, sb Sandbox, id string, spec ExecSpec) (*Process, error) {
	return StartIn(ctx, sb, spec, func(err error) { m.log.Warn("exec", "session", id, "err", err) })
}

// StartIn runs a command in a session's sandbox as Start does (the same
// user, home and environment), for a gateway replica that runs no
// session manager: one that stands by carries a shell it is sent
// straight to the session's Pod. log takes what goes wrong after the
// start.
func StartIn(ctx context.Context, sb Sandbox, spec ExecSpec, log func(error)) (*Process, error) {
	if len(spec.Args) == 0 || spec.Args[0] == "" {
		return nil, publicf(ErrInvalid, "cmd must name a program", nil)
	}
	if spec.Cwd == "" {
		spec.Cwd = homeDir
	}
	if spec.Stdout == nil {
		spec.Stdout = io.Discard
	}
	if spec.Stderr == nil {
		spec.Stderr = io.Discard
	}
	env := append([]string{"DISPLAY=:0", "HOME=" + homeDir, "USER=sandgate", "TERM=xterm-256color"}, spec.Env...)
	p, err := sb.Exec(ctx, spec, env)
	if err != nil {
		return nil, err
	}
	return &Process{p: p, log: log}, nil
}

// RunIn runs a command in a session's sandbox as StartIn starts it, and
// returns its exit code once it has exited and its output is copied.
func RunIn(ctx context.Context, sb Sandbox, spec ExecSpec, log func(error)) (int, error) {
	p, err := StartIn(ctx, sb, spec, log)
	if err != nil {
		return -1, err
	}
	defer p.Close()
	return p.Wait(ctx)
}

// Wait waits for the process to exit and for its output to be copied, and
// returns the exit code. When ctx ends first the process is killed; when
// it ends after the exit while the output is still open (a child the
// process left behind holds it), the copy is cut off.
func (p *Process) Wait(ctx context.Context) (int, error) {
	select {
	case st := <-p.p.Exited():
		copied := p.p.Copied()
		select {
		case <-copied:
		case <-ctx.Done():
			p.p.CancelIO()
			select {
			case <-copied:
			case <-time.After(5 * time.Second):
			}
			return -1, fmt.Errorf("the output stayed open after the command exited: %w", ctx.Err())
		}
		return st.Code, st.Err
	case <-ctx.Done():
		p.Signal(syscall.SIGKILL)
		select {
		case <-p.p.Exited():
		case <-time.After(5 * time.Second):
		}
		return -1, ctx.Err()
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig syscall.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return p.p.Signal(ctx, sig)
}

// Resize sets the terminal size of a Terminal process.
func (p *Process) Resize(ctx context.Context, cols, rows uint16) error {
	return p.p.Resize(ctx, cols, rows)
}

// Close removes the process, killing it if it still runs.
func (p *Process) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.p.Delete(ctx); err != nil {
		p.log(err)
	}
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
