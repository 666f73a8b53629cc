package session

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/contrib/seccomp"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/fifo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// containerdBackend runs each session as a containerd container and its
// task, under the runtime handler of the session's runtime, in the
// manager's containerd namespace. The session's record is the
// container's labels.
type containerdBackend struct {
	client      *containerd.Client
	namespace   string
	image       string
	snapshotter string
	runtimes    RuntimeConfig
	// base outlives requests: the waits on tasks use it.
	base context.Context
	log  *slog.Logger
}

var _ Backend = (*containerdBackend)(nil)

func newContainerdBackend(base context.Context, client *containerd.Client, cfg Config, log *slog.Logger) *containerdBackend {
	return &containerdBackend{client: client, namespace: cfg.Namespace, image: cfg.Image, snapshotter: cfg.Snapshotter,
		runtimes: cfg.Runtimes, base: namespaces.WithNamespace(base, cfg.Namespace), log: log}
}

// Runtimes probes the runtime handlers' binaries on this host.
func (b *containerdBackend) Runtimes(ctx context.Context) map[string]*Runtime {
	return probeRuntimes(ctx, b.runtimes)
}

func (b *containerdBackend) Name() string { return "containerd" }

func (b *containerdBackend) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, b.namespace)
}

func (b *containerdBackend) Ready(ctx context.Context) error {
	_, err := b.client.Version(ctx)
	return err
}

// taskCreateTimeout bounds the creation of a session's task (a gVisor
// sandbox's start on a slow machine takes seconds).
const taskCreateTimeout = 2 * time.Minute

// Create creates the session's container and task and starts the task.
func (b *containerdBackend) Create(ctx context.Context, info Info, rt *Runtime, record map[string]string, host Host) (Sandbox, <-chan Exit, error) {
	ctx = b.ctx(ctx)
	c, err := b.newContainer(ctx, info, rt, record, host)
	if err != nil {
		return nil, nil, fmt.Errorf("create container: %w", err)
	}
	host.Done("container")
	sb := &container{b: b, c: c}
	fail := func(err error) (Sandbox, <-chan Exit, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if rerr := sb.Remove(cctx); rerr != nil {
			err = fmt.Errorf("%w (and removing the container: %v)", err, rerr)
		}
		return nil, nil, err
	}
	// The task's creation is not cut short by ctx: cancelled half way,
	// it goes on in containerd and its shim, which open the console log
	// in a workspace the start's rollback has removed already (and make
	// it again). It completes or fails whole; then a cancellation is
	// honoured and the task removed with the container.
	tctx, tcancel := context.WithTimeout(context.WithoutCancel(ctx), taskCreateTimeout)
	task, err := c.NewTask(tctx, cio.LogFile(host.Console))
	tcancel()
	if err != nil {
		return fail(fmt.Errorf("create task: %w", err))
	}
	if err := ctx.Err(); err != nil {
		return fail(fmt.Errorf("create task: %w", err))
	}
	exited, err := task.Wait(b.base)
	if err != nil {
		return fail(fmt.Errorf("wait task: %w", err))
	}
	if err := task.Start(ctx); err != nil {
		return fail(fmt.Errorf("start task: %w", err))
	}
	host.Done("task")
	return sb, exits(exited), nil
}

// exits turns a containerd wait into an Exit channel.
func exits(ch <-chan containerd.ExitStatus) <-chan Exit {
	out := make(chan Exit, 1)
	go func() {
		st := <-ch
		out <- Exit{Code: int(st.ExitCode()), Err: st.Error()}
	}()
	return out
}

// newContainer creates the session's container (not its task).
func (b *containerdBackend) newContainer(ctx context.Context, info Info, rt *Runtime, labels map[string]string, host Host) (containerd.Container, error) {
	image, err := b.client.GetImage(ctx, b.image)
	if err != nil {
		return nil, fmt.Errorf("session image %s: %w", b.image, err)
	}
	res := info.Resources
	period := uint64(100000)
	quota := int64(res.CPUs * float64(period))
	specOpts := []oci.SpecOpts{
		oci.WithImageConfig(image),
		oci.WithHostname("sandgate"),
		oci.WithUIDGID(sessionUID, sessionGID),
		oci.WithEnv(host.Env),
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: host.NetNS}),
		oci.WithCapabilities(nil),
		oci.WithAmbientCapabilities(nil),
		oci.WithNoNewPrivileges,
		seccomp.WithDefaultProfile(),
		withSessionSeccomp(rt.Name),
		oci.WithMemoryLimit(uint64(res.MemoryMB) << 20),
		oci.WithCPUCFS(quota, period),
		oci.WithPidsLimit(int64(res.Pids)),
		withOOMScoreAdj(500),
		withRlimit("RLIMIT_NOFILE", 4096),
		// The image is read-only; what a session writes goes to bounded
		// tmpfs (charged to the session's memory) or its workspace.
		oci.WithRootFSReadonly(),
		oci.WithMounts([]specs.Mount{
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", "size=1g"}},
			{Destination: "/home/sandgate", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=0755", "uid=1000", "gid=1000", "size=256m"}},
			{Destination: "/home/sandgate/workspace", Type: "bind", Source: host.Workspace, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
		}),
	}
	return b.client.NewContainer(ctx, info.ID,
		containerd.WithImage(image),
		containerd.WithSnapshotter(b.snapshotter),
		containerd.WithNewSnapshot(info.ID, image),
		containerd.WithRuntime(rt.shim, rt.options),
		containerd.WithContainerLabels(labels),
		containerd.WithNewSpec(specOpts...),
	)
}

// withOOMScoreAdj raises the session's OOM score so that under memory
// pressure sessions go before the gateway. (Lowering it is refused on
// some hosts and makes runc fail.)
func withOOMScoreAdj(score int) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		s.Process.OOMScoreAdj = &score
		return nil
	}
}

// withRlimit sets one resource limit, soft and hard, for every process.
func withRlimit(kind string, n uint64) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		for i, r := range s.Process.Rlimits {
			if r.Type == kind {
				s.Process.Rlimits[i].Soft, s.Process.Rlimits[i].Hard = n, n
				return nil
			}
		}
		s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: kind, Soft: n, Hard: n})
		return nil
	}
}

func (b *containerdBackend) List(ctx context.Context) ([]Sandbox, error) {
	cs, err := b.client.Containers(b.ctx(ctx), fmt.Sprintf("labels.%q", labelSession))
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := make([]Sandbox, 0, len(cs))
	for _, c := range cs {
		out = append(out, &container{b: b, c: c})
	}
	return out, nil
}

// Sweep removes the cgroups of the namespace that no live session owns:
// those a runtime left after its container was deleted, when Remove's
// own removal had already run (gVisor sandboxes were seen leaving an
// empty one per controller). Only empty cgroups go (rmdir refuses any
// with a process).
func (b *containerdBackend) Sweep(live func(id string) bool) {
	sweepCgroups(b.namespace, live)
}

// container is a session's containerd container.
type container struct {
	b *containerdBackend
	c containerd.Container
}

func (sb *container) ID() string { return sb.c.ID() }

// Addr is invalid: the manager gave the container its network namespace.
func (sb *container) Addr() netip.Addr { return netip.Addr{} }

func (sb *container) Record(ctx context.Context) (map[string]string, error) {
	return sb.c.Labels(sb.b.ctx(ctx))
}

func (sb *container) SetRecord(ctx context.Context, record map[string]string) (map[string]string, error) {
	l, err := sb.c.SetLabels(sb.b.ctx(ctx), record)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("%w: %v", ErrSandboxGone, err)
	}
	return l, err
}

// task returns the container's task, wrapping ErrSandboxGone when it has
// none.
func (sb *container) task(ctx context.Context) (containerd.Task, error) {
	t, err := sb.c.Task(sb.b.ctx(ctx), nil)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("%w: %v", ErrSandboxGone, err)
	}
	return t, err
}

func (sb *container) Running(ctx context.Context) (bool, error) {
	t, err := sb.task(ctx)
	if err != nil {
		return false, err
	}
	st, err := t.Status(sb.b.ctx(ctx))
	if err != nil {
		return false, err
	}
	return st.Status == containerd.Running, nil
}

func (sb *container) Wait(ctx context.Context) (<-chan Exit, error) {
	t, err := sb.task(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := t.Wait(sb.b.ctx(ctx))
	if err != nil {
		return nil, err
	}
	return exits(ch), nil
}

func (sb *container) Freeze(ctx context.Context) error {
	t, err := sb.task(ctx)
	if err != nil {
		return err
	}
	return t.Pause(sb.b.ctx(ctx))
}

func (sb *container) Thaw(ctx context.Context) error {
	ctx = sb.b.ctx(ctx)
	t, err := sb.task(ctx)
	if err != nil {
		return err
	}
	if st, err := t.Status(ctx); err == nil && st.Status == containerd.Running {
		return nil // the pause failed or never ran
	}
	return t.Resume(ctx)
}

// CPU reads the container's cgroup. Under gVisor the sandbox (sentry,
// gofer, systrap stubs) runs in the container's cgroup, so it counts too.
func (sb *container) CPU() (time.Duration, bool) {
	return cgroupCPU(sb.b.namespace, sb.c.ID())
}

// Remove kills the task and deletes the container and its snapshot;
// anything already gone counts as done.
func (sb *container) Remove(ctx context.Context) error {
	ctx = sb.b.ctx(ctx)
	c := sb.c
	spec, _ := c.Spec(ctx) // for its cgroups, after the delete
	if t, err := c.Task(ctx, nil); err == nil {
		// A frozen task (a warm pool's) takes no signal until thawed.
		if st, err := t.Status(ctx); err == nil && (st.Status == containerd.Paused || st.Status == containerd.Pausing) {
			t.Resume(ctx)
		}
		if _, err := t.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			// A gVisor sandbox whose control server died (after an OOM
			// kill, say) cannot be signalled through runsc any more: kill
			// its process from the host, then delete what is left.
			if pid := t.Pid(); pid > 0 {
				if exited, werr := t.Wait(ctx); werr == nil {
					unix.Kill(int(pid), unix.SIGKILL)
					select {
					case <-exited:
					case <-time.After(10 * time.Second):
					}
				}
			}
			if _, err2 := t.Delete(ctx); err2 != nil && !errdefs.IsNotFound(err2) {
				return fmt.Errorf("delete task: %w (and after killing its process: %v)", err, err2)
			}
		}
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("task: %w", err)
	}
	if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete container: %w", err)
	}
	if spec != nil && spec.Linux != nil {
		if err := removeCgroups(sb.b.namespace, spec.Linux.CgroupsPath); err != nil {
			return fmt.Errorf("remove cgroups: %w", err)
		}
	}
	return nil
}

// Exec runs a command through containerd's exec, so it works the same
// under every runtime handler. The process is the container's own (user,
// capabilities, limits) with the command's arguments, directory and
// terminal, and env added to its environment.
func (sb *container) Exec(ctx context.Context, spec ExecSpec, env []string) (ExecProc, error) {
	ctx = sb.b.ctx(ctx)
	cspec, err := sb.c.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("container spec: %w", err)
	}
	task, err := sb.task(ctx)
	if err != nil {
		return nil, fmt.Errorf("task: %w", err)
	}
	p := *cspec.Process
	p.Args = spec.Args
	p.Terminal = spec.Terminal
	p.Cwd = spec.Cwd
	p.Env = append(append([]string{}, cspec.Process.Env...), env...)
	if spec.Root {
		p.User = specs.User{UID: 0, GID: 0}
	}
	if spec.Terminal {
		p.ConsoleSize = &specs.Box{Width: uint(max(spec.Cols, 1)), Height: uint(max(spec.Rows, 1))}
	}
	stdin := spec.Stdin
	if stdin == nil {
		stdin = bytes.NewReader(nil) // the shim wants a stream: an empty one
	}
	closed := make(chan struct{}) // the exec failed, or was deleted
	in := newStdinReader(stdin, closed)
	opts := []cio.Opt{cio.WithStreams(in, spec.Stdout, spec.Stderr)}
	if spec.Terminal {
		opts = []cio.Opt{cio.WithStreams(in, spec.Stdout, nil), cio.WithTerminal}
	}
	execID := fmt.Sprintf("x%d-%d", time.Now().UnixNano(), execSeq.Add(1))
	proc, err := task.Exec(ctx, execID, &p, cio.NewCreator(opts...))
	if err != nil {
		close(closed)
		if errdefs.IsNotFound(err) {
			return nil, publicf(ErrConflict, "the session is not running", err)
		}
		return nil, fmt.Errorf("exec: %w", err)
	}
	cp := &containerProc{b: sb.b, proc: proc, closed: closed}
	cleanup := func() { // the caller's context may be what ended
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cp.Delete(cctx)
	}
	statusC, err := proc.Wait(ctx)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("exec wait: %w", err)
	}
	cp.exited = exits(statusC)
	if err := proc.Start(ctx); err != nil {
		cleanup()
		if errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err) {
			return nil, publicf(ErrInvalid, fmt.Sprintf("cannot run %q in the session: no such program, or cwd missing", spec.Args[0]), err)
		}
		return nil, fmt.Errorf("exec start: %w", err)
	}
	in.shimStarted(proc.IO().Config().Stdin)
	// The shim keeps the process's stdin open until told: pass EOF on
	// once the stream has ended and the shim reads the FIFO (see
	// stdinReader), or the close is lost and the command waits forever.
	go func() {
		select {
		case <-in.ended:
		case <-closed:
			return
		}
		cctx, cancel := context.WithTimeout(sb.b.ctx(context.Background()), 5*time.Second)
		defer cancel()
		if err := proc.CloseIO(cctx, containerd.WithStdinCloser); err != nil && !errdefs.IsNotFound(err) {
			sb.b.log.Warn("exec: closing stdin", "session", sb.c.ID(), "err", err)
		}
	}()
	return cp, nil
}

// containerProc is a command run through containerd's exec.
type containerProc struct {
	b        *containerdBackend
	proc     containerd.Process
	exited   <-chan Exit
	once     sync.Once
	closed   chan struct{} // closed by Delete; the exec's stdin stops waiting on it
	copied   chan struct{}
	copyOnce sync.Once
}

func (p *containerProc) Exited() <-chan Exit { return p.exited }

func (p *containerProc) Copied() <-chan struct{} {
	p.copyOnce.Do(func() {
		p.copied = make(chan struct{})
		go func() {
			p.proc.IO().Wait()
			close(p.copied)
		}()
	})
	return p.copied
}

func (p *containerProc) CancelIO() {
	p.proc.IO().Cancel()
	p.proc.IO().Close()
}

func (p *containerProc) Signal(ctx context.Context, sig syscall.Signal) error {
	return p.proc.Kill(p.b.ctx(ctx), sig)
}

func (p *containerProc) Resize(ctx context.Context, cols, rows uint16) error {
	return p.proc.Resize(p.b.ctx(ctx), uint32(cols), uint32(rows))
}

func (p *containerProc) Delete(ctx context.Context) error {
	var err error
	p.once.Do(func() {
		close(p.closed)
		if _, derr := p.proc.Delete(p.b.ctx(ctx), containerd.WithProcessKill); derr != nil && !errdefs.IsNotFound(derr) {
			err = derr
		}
	})
	return err
}

// stdinReader is a command's stdin as containerd's copy reads it, and
// tells (ended) when the stream is over and the shim is reading the FIFO,
// so that a CloseIO then reaches the process.
//
// The shim opens its end of the stdin FIFO lazily, after Start has
// answered, and holds a writer of its own until CloseIO closes it. A
// CloseIO that comes before the shim's reader exists leaves no writer for
// that reader's open to meet: the open waits forever, the process's
// stdin is never closed, and `cat > file` never ends. That was an empty
// or one-byte upload hanging for its 30 minute timeout under load.
// containerd's copy writes to the FIFO only once a reader exists, so:
//   - a stream's end that comes with data is held back to the next Read,
//     which the copy makes only after that data was written;
//   - a stream that ends with nothing written opens the FIFO for writing
//     itself, which returns once the shim's reader is there.
type stdinReader struct {
	r       io.Reader
	sent    bool          // some data was written to the FIFO
	err     error         // the stream's end, held back until its data is written
	path    string        // the stdin FIFO, set before started is closed
	started chan struct{} // closed once Start has answered
	closed  <-chan struct{}
	ended   chan struct{}
	once    sync.Once
}

// stdinReaderWait bounds how long an empty stream waits for the shim's
// reader once Start has answered (the shim opens it straight after). A
// bound that ran out before the reader opened would lose the close again,
// so it is generous and counted from Start, not from the exec's creation.
const stdinReaderWait = 2 * time.Minute

func newStdinReader(r io.Reader, closed <-chan struct{}) *stdinReader {
	return &stdinReader{r: r, started: make(chan struct{}), closed: closed, ended: make(chan struct{})}
}

// shimStarted tells that Start has answered, and where the FIFO is.
func (s *stdinReader) shimStarted(path string) {
	s.path = path
	close(s.started)
}

func (s *stdinReader) Read(p []byte) (int, error) {
	if s.err != nil {
		s.end()
		return 0, s.err
	}
	n, err := s.r.Read(p)
	if n > 0 {
		s.sent = true
		s.err = err
		return n, nil
	}
	if err != nil {
		s.err = err
		s.end()
	}
	return n, err
}

func (s *stdinReader) end() {
	s.once.Do(func() {
		if !s.sent {
			s.awaitShim()
		}
		close(s.ended)
	})
}

// awaitShim returns once the shim has its reader on the stdin FIFO, the
// exec is gone, or stdinReaderWait has passed.
func (s *stdinReader) awaitShim() {
	select {
	case <-s.started:
	case <-s.closed:
		return
	}
	if s.path == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), stdinReaderWait)
	defer cancel()
	go func() {
		select {
		case <-s.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	// A blocking open for writing returns when a reader is there. Nobody
	// has closed an end yet, so that reader is the shim's (a failed exec's
	// cancel makes one too, but then no close waits on this).
	if w, err := fifo.OpenFifo(ctx, s.path, syscall.O_WRONLY, 0); err == nil {
		w.Close()
	}
}
