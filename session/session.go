// Package session owns the life of sandbox sessions: their state, the
// backend that runs their sandboxes (Backend; containerd containers under
// a runtime handler by default), their network namespaces, the reaper
// that ends them and the recovery that rebuilds them after a gateway
// restart. It knows nothing of HTTP.
package session

import (
	"errors"
	"net/netip"
	"time"

	"github.com/sandgate/sandgate/egress"
)

// Error classes. Callers wrap them with %w; the gateway maps each class to
// one HTTP status in one place.
var (
	ErrInvalid            = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrConflict           = errors.New("conflict")
	ErrUnavailableRuntime = errors.New("unavailable runtime")
	ErrQuota              = errors.New("quota exceeded")
	ErrUnavailable        = errors.New("unavailable")
	ErrDenied             = errors.New("permission denied")
)

// PublicError is an error whose message may be shown to API clients. The
// wrapped error stays internal.
type PublicError struct {
	Class error  // one of the Err* classes
	Msg   string // safe to show
	Err   error  // internal cause, may be nil
	// RetryAfter (seconds; 0 none): nothing was done, and the request
	// may be sent again after it (a quota that may fit by then, a
	// gateway that drains).
	RetryAfter int
}

func (e *PublicError) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *PublicError) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Class, e.Err}
	}
	return []error{e.Class}
}

func publicf(class error, msg string, cause error) error {
	return &PublicError{Class: class, Msg: msg, Err: cause}
}

// Kind is what a session shows.
type Kind string

const (
	KindBrowser Kind = "browser"
	KindDesktop Kind = "desktop"
)

// State of a session.
type State string

const (
	StateStarting State = "starting"
	StateRunning  State = "running"
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
	StateFailed   State = "failed"
)

// Resources are a session's limits.
type Resources struct {
	CPUs     float64 `json:"cpus"`
	MemoryMB int     `json:"memory_mb"`
	Pids     int     `json:"pids"`
}

// Screen is the size of the session's display.
type Screen struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

// Spec is what a session is created from. The gateway fills it from a
// validated request; Manager.Create checks it again against its limits.
type Spec struct {
	Tenant      string
	Kind        Kind
	Runtime     string // empty: the manager's default
	TTL         time.Duration
	IdleTimeout time.Duration // zero: none
	Resources   Resources
	Screen      Screen
	Record      bool
	Labels      map[string]string
	Egress      Egress
	// Wait is how long a create over the tenant's quotas or the
	// gateway's capacity, or for its profile, may wait (0: refused at
	// once).
	Wait time.Duration
	// Profile is the browser profile the session starts with (nil: a
	// fresh one); Snapshot the workspace snapshot it starts from (empty:
	// none). The observer, a Keeper, writes both in.
	Profile  *ProfileUse
	Snapshot string
}

// ProfileUse names the browser profile a session starts with and says
// whether the session writes it back when it ends cleanly. A session
// that writes it back holds the profile alone; sessions that only read
// it may share it.
type ProfileUse struct {
	ID      string `json:"id"`
	Persist bool   `json:"persist"`
}

// Egress is what a session may reach through the egress proxy, and which
// credentials the proxy adds to its requests. The gateway validates it
// with the egress package; nothing else leaves a session.
type Egress struct {
	Allow       []string         `json:"allow"`
	Credentials []egress.Binding `json:"credentials,omitempty"`
}

// Info is a snapshot of one session, safe to hand out.
type Info struct {
	ID          string            `json:"id"`
	Tenant      string            `json:"-"`
	Kind        Kind              `json:"kind"`
	Runtime     string            `json:"runtime"`
	Isolation   string            `json:"isolation"`
	State       State             `json:"state"`
	CreatedAt   time.Time         `json:"created_at"`
	ExpiresAt   time.Time         `json:"expires_at"`
	IdleTimeout int               `json:"idle_timeout_seconds,omitempty"`
	Resources   Resources         `json:"resources"`
	Screen      Screen            `json:"screen"`
	Record      bool              `json:"record"`
	Labels      map[string]string `json:"labels"`
	Egress      Egress            `json:"egress"`
	// Start is how the session was started: "warm" (claimed from a warm
	// pool) or "cold".
	Start    string      `json:"start"`
	Profile  *ProfileUse `json:"profile,omitempty"`
	Snapshot string      `json:"snapshot,omitempty"`
	Failure  string      `json:"failure,omitempty"`
}

// Endpoint is where a running session's services answer, reachable from
// the gateway's host only.
type Endpoint struct {
	Addr netip.Addr
	CDP  netip.AddrPort
	VNC  netip.AddrPort
	// Version is Chromium's /json/version as the session answered it
	// when it became ready (nil when unknown): the session's word,
	// unchecked, which the gateway checks as it would a fresh answer.
	// It spares a claimed session's first client a round trip into the
	// sandbox.
	Version []byte
}

// CDPHost is the Host header of the readiness check's /json/version
// request: the one the gateway's CDP code sends (browser.UpstreamHost,
// which a gateway test holds equal), so that the answer kept in
// Endpoint.Version names Chromium's own address.
const CDPHost = "localhost:9222"

// Ports inside every session.
const (
	CDPPort = 9222
	VNCPort = 5900
)
