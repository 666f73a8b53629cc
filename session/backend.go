package session

import (
	"context"
	"errors"
	"net/netip"
	"syscall"
	"time"
)

// Backend runs the sandboxes sessions live in: it creates and starts
// them, watches them, runs commands in them, freezes and thaws them,
// keeps each one's record beside it and removes it. It lists what exists
// so that a restarted gateway can adopt or remove it. The manager keeps
// everything else (state, admission, warm pools, previews, profiles), and
// none of it knows which backend runs a session.
//
// containerdBackend (containerd.go) is the embedded default; the
// manager gives its sandboxes their network and workspace on this host
// (network.go, container.go): a network namespace on the bridge behind
// the firewall and the egress proxy, and a tmpfs the gateway reads
// downloads from. Any other backend (Config.Backend; the Kubernetes one
// in session/kube) gives each sandbox its own network and address, and
// the manager reads downloads through exec.
type Backend interface {
	// Name says which backend it is, for logs and errors.
	Name() string
	// Ready tells whether the backend answers.
	Ready(ctx context.Context) error
	// Runtimes says which runtimes (kata, gvisor, runc) the backend can
	// run sandboxes under, with why not where it cannot.
	Runtimes(ctx context.Context) map[string]*Runtime
	// Create creates the sandbox of info under rt and starts it. record
	// is the session's record (labels) kept with it; host says what the
	// manager made for it on this host. The returned channel receives
	// the sandbox's exit once. On error nothing it made is left.
	Create(ctx context.Context, info Info, rt *Runtime, record map[string]string, host Host) (Sandbox, <-chan Exit, error)
	// List returns the sandboxes that hold a session record, in any
	// state, for the manager to adopt or remove.
	List(ctx context.Context) ([]Sandbox, error)
	// Sweep removes what the backend's removed sandboxes left behind on
	// the host, sparing those of sessions live says are live.
	Sweep(live func(id string) bool)
}

// RecordWatcher is a Backend whose records others write too (a Pod's,
// which a gateway replica standing by changes while no leader answers
// it: RecordStopAsked, RecordExpires). WatchRecords calls changed with
// a session's record as its watch sees it change, the manager's own
// writes too, in the order written: a version a quick later write
// replaced may be skipped, and what was written before the watch's
// first list is not told (the manager reads an adopted session's
// record again once it holds it).
type RecordWatcher interface {
	WatchRecords(changed func(rec map[string]string))
}

// RecordUpdater is a Sandbox whose record can be changed by a write
// conditional on what was read (a Pod's, by its version): UpdateRecord
// asks change for the keys to set from the record as it is (its error
// ends it, as is; no keys, nothing is written), and asks again if
// another write came between.
type RecordUpdater interface {
	UpdateRecord(ctx context.Context, change func(rec map[string]string) (map[string]string, error)) (map[string]string, error)
}

// Host is what the manager made for a sandbox before it is created;
// the first three are empty for a backend that brings its own network.
type Host struct {
	NetNS     string // the network namespace's path
	Workspace string // mounted at /home/sandgate/workspace
	Console   string // where the sandbox's console output goes
	// Env is the environment of every process in the sandbox.
	Env []string
	// Deadline is the latest the session may ever run to (created, plus
	// its tenant's longest TTL, which bounds every extension). A backend
	// that can end the sandbox then by itself does, so that it ends even
	// when no gateway is left to stop it (a Pod's activeDeadlineSeconds).
	Deadline time.Time
	// Step is told as each part of the start is done (containerd:
	// "container", "task"), for the session's started event; a backend
	// calls Done.
	Step func(name string)
}

// Done tells Step, if set, that a part of the start is done.
func (h Host) Done(step string) {
	if h.Step != nil {
		h.Step(step)
	}
}

// Sandbox is one session's sandbox.
type Sandbox interface {
	ID() string
	// Addr is where the sandbox's services answer when the backend gave
	// it its network (a Pod's IP); invalid when the manager did.
	Addr() netip.Addr
	// Record and SetRecord read and change the session's record kept
	// with the sandbox (labels); SetRecord changes only the keys given.
	Record(ctx context.Context) (map[string]string, error)
	SetRecord(ctx context.Context, record map[string]string) (map[string]string, error)
	// Running tells whether the sandbox's processes run; an error
	// wrapping ErrSandboxGone when it has none any more.
	Running(ctx context.Context) (bool, error)
	// Wait returns a channel that receives the sandbox's exit once; an
	// Exit with Err set means the wait itself was lost (the backend went
	// away), not that the sandbox ended. An error wrapping
	// ErrSandboxGone when it has no processes any more.
	Wait(ctx context.Context) (<-chan Exit, error)
	// Exec starts a command in the sandbox (see ExecSpec); env is the
	// environment it gets beyond the sandbox's own.
	Exec(ctx context.Context, spec ExecSpec, env []string) (ExecProc, error)
	// Freeze stops the sandbox's processes; Thaw resumes them (a thaw of
	// a sandbox that is not frozen does nothing).
	Freeze(ctx context.Context) error
	Thaw(ctx context.Context) error
	// CPU is the CPU time the sandbox has used so far; false when the
	// backend cannot tell.
	CPU() (time.Duration, bool)
	// Remove stops the sandbox and removes it and what it holds; a
	// sandbox already gone counts as removed.
	Remove(ctx context.Context) error
}

// Exit is how a sandbox or a command in it ended.
type Exit struct {
	Code int
	// Err: the wait was lost, not the process; Code means nothing then.
	Err error
}

// ErrSandboxGone: the sandbox, or its processes, no longer exist. A
// backend wraps it in the errors of Running, Wait and SetRecord.
var ErrSandboxGone = errors.New("the sandbox is gone")

// ErrRecordUnreadable is returned for a sandbox whose record is there
// but cannot be read as one (not for a store that does not answer).
var ErrRecordUnreadable = errors.New("the sandbox's record cannot be read")

// ExecProc is a command a backend runs in a sandbox; Process (exec.go)
// gives it the same behaviour under every backend.
type ExecProc interface {
	// Exited receives the command's exit once.
	Exited() <-chan Exit
	// Copied is closed once the command's output has all been copied;
	// CancelIO cuts that copy short.
	Copied() <-chan struct{}
	CancelIO()
	Signal(ctx context.Context, sig syscall.Signal) error
	Resize(ctx context.Context, cols, rows uint16) error
	// Delete removes the command, killing it if it still runs.
	Delete(ctx context.Context) error
}
