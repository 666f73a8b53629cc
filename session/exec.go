package session

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
)

// ExecResult is how a command in a session ended.
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

var execSeq atomic.Uint64

// maxExecOutput bounds what Exec keeps of a command's output.
const maxExecOutput = 4 << 20

// Exec runs argv in the session as the session's user, with the session's
// display, through containerd's exec (so it works the same under every
// runtime handler), and waits for it.
func (m *Manager) Exec(ctx context.Context, tenant, id string, argv []string) (ExecResult, error) {
	if len(argv) == 0 {
		return ExecResult{}, publicf(ErrInvalid, "empty command", nil)
	}
	s, err := m.lookup(tenant, id)
	if err != nil {
		return ExecResult{}, err
	}
	m.mu.Lock()
	c, state := s.container, s.info.State
	m.mu.Unlock()
	if state != StateRunning {
		return ExecResult{}, publicf(ErrConflict, "the session is "+string(state), nil)
	}
	ctx = m.ctx(ctx)
	spec, err := c.Spec(ctx)
	if err != nil {
		return ExecResult{}, fmt.Errorf("container spec: %w", err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		return ExecResult{}, fmt.Errorf("task: %w", err)
	}
	p := *spec.Process
	p.Args = argv
	p.Terminal = false
	p.Cwd = "/home/sandgate"
	p.Env = append(append([]string{}, spec.Process.Env...), "DISPLAY=:0", "HOME=/home/sandgate")

	var stdout, stderr limitedBuffer
	stdout.max, stderr.max = maxExecOutput, maxExecOutput
	execID := fmt.Sprintf("x%d-%d", time.Now().UnixNano(), execSeq.Add(1))
	proc, err := task.Exec(ctx, execID, &p, cio.NewCreator(cio.WithStreams(bytes.NewReader(nil), &stdout, &stderr)))
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec: %w", err)
	}
	cleanup := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, err := proc.Delete(dctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			m.log.Warn("exec cleanup", "session", id, "err", err)
		}
	}
	defer cleanup()
	statusC, err := proc.Wait(ctx)
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec wait: %w", err)
	}
	if err := proc.Start(ctx); err != nil {
		return ExecResult{}, fmt.Errorf("exec start: %w", err)
	}
	select {
	case st := <-statusC:
		// The output copy finishes once the process's pipes close.
		proc.IO().Wait()
		code, _, err := st.Result()
		if err != nil {
			return ExecResult{}, err
		}
		return ExecResult{ExitCode: int(code), Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}, nil
	case <-ctx.Done():
		return ExecResult{}, ctx.Err()
	}
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

var _ io.Writer = (*limitedBuffer)(nil)
