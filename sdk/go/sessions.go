package sandgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Resources are a session's limits.
type Resources struct {
	CPUs     float64 `json:"cpus,omitempty"`
	MemoryMB int     `json:"memory_mb,omitempty"`
	Pids     int     `json:"pids,omitempty"`
}

// Screen is a session's display size.
type Screen struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

// Egress is what a session may reach: host:port patterns, and the vault
// credentials the gateway adds to requests for bound destinations.
type Egress struct {
	Allow       []string  `json:"allow"`
	Credentials []Binding `json:"credentials,omitempty"`
}

// Binding ties a vault credential to a destination. Fill "value" lets
// fill_credential type the real secret; the default types a placeholder
// that the egress proxy swaps for the secret on the way out.
type Binding struct {
	Credential string `json:"credential"`
	Scheme     string `json:"scheme"`
	Host       string `json:"host"`
	Port       int    `json:"port,omitempty"`
	PathPrefix string `json:"path_prefix,omitempty"`
	Fill       string `json:"fill,omitempty"`
}

// SessionRequest creates a session. Zero fields take the gateway's
// defaults.
type SessionRequest struct {
	Kind        string            `json:"kind,omitempty"` // browser (default) or desktop
	Runtime     string            `json:"runtime,omitempty"`
	TTLSeconds  int               `json:"ttl_seconds,omitempty"`
	IdleSeconds int               `json:"idle_timeout_seconds,omitempty"`
	Resources   *Resources        `json:"resources,omitempty"`
	Screen      *Screen           `json:"screen,omitempty"`
	Record      bool              `json:"record,omitempty"`
	Egress      *EgressRequest    `json:"egress,omitempty"`
	Credentials []Binding         `json:"credentials,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// WaitSeconds lets a create over the tenant's quotas or the
	// gateway's capacity wait in line this long for room (at most 600);
	// 0 is refused at once (IsQuotaExceeded, with Error.RetryAfter).
	WaitSeconds int `json:"wait_seconds,omitempty"`
	// Profile starts the session with a browser profile (CreateProfile);
	// with Persist it writes the profile back when it ends cleanly and
	// holds it alone meanwhile (another create gets a 409 conflict, or
	// waits up to WaitSeconds).
	Profile *ProfileUse `json:"profile,omitempty"`
	// Snapshot starts the session from a workspace snapshot
	// (CreateSnapshot): its files, not its processes.
	Snapshot string `json:"snapshot,omitempty"`
	// Preview issues a preview URL with the session (Session.Preview),
	// saving a request before the client connects. Not with NoWait.
	Preview *PreviewRequest `json:"preview,omitempty"`
	// NoWait returns as soon as the session is created, in state
	// "starting"; WaitRunning waits for it.
	NoWait bool `json:"-"`
}

// EgressRequest lists the destinations a new session may reach.
type EgressRequest struct {
	Allow []string `json:"allow"`
}

// Session is one session as the gateway shows it.
type Session struct {
	ID          string            `json:"id"`
	Kind        string            `json:"kind"`
	Runtime     string            `json:"runtime"`
	Isolation   string            `json:"isolation"`
	State       string            `json:"state"` // starting, running, stopping, stopped, failed
	CreatedAt   time.Time         `json:"created_at"`
	ExpiresAt   time.Time         `json:"expires_at"`
	IdleSeconds int               `json:"idle_timeout_seconds,omitempty"`
	Resources   Resources         `json:"resources"`
	Screen      Screen            `json:"screen"`
	Record      bool              `json:"record"`
	Labels      map[string]string `json:"labels"`
	Egress      Egress            `json:"egress"`
	Start       string            `json:"start"` // warm (from a pool) or cold
	Profile     *ProfileUse       `json:"profile,omitempty"`
	Snapshot    string            `json:"snapshot,omitempty"`
	Failure     string            `json:"failure,omitempty"`
	// Preview is the preview SessionRequest.Preview asked for; only in
	// CreateSession's answer.
	Preview *Preview `json:"preview,omitempty"`
}

// ProfileUse names the profile a session starts with.
type ProfileUse struct {
	ID      string `json:"id"`
	Persist bool   `json:"persist"`
}

// CreateSession creates a session and, unless req.NoWait, returns once
// its browser and display answer.
func (c *Client) CreateSession(ctx context.Context, req SessionRequest) (*Session, error) {
	path := "/v1/sessions"
	if req.NoWait {
		path += "?wait=false"
	}
	var s Session
	if err := c.call(ctx, "POST", path, req, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// WaitRunning polls a session until it leaves "starting" and returns it
// running, or an error naming why it is not.
func (c *Client) WaitRunning(ctx context.Context, id string) (*Session, error) {
	for {
		s, err := c.GetSession(ctx, id)
		if err != nil {
			return nil, err
		}
		switch s.State {
		case "running":
			return s, nil
		case "starting":
		default:
			return s, fmt.Errorf("session %s is %s: %s", id, s.State, s.Failure)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ListSessions lists the tenant's sessions.
func (c *Client) ListSessions(ctx context.Context) ([]Session, error) {
	var out struct {
		Sessions []Session `json:"sessions"`
	}
	err := c.call(ctx, "GET", "/v1/sessions", nil, &out)
	return out.Sessions, err
}

// GetSession returns one session.
func (c *Client) GetSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	if err := c.call(ctx, "GET", "/v1/sessions/"+url.PathEscape(id), nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ExtendSession sets the session to expire ttl from now (bounded by
// the tenant's maximum).
func (c *Client) ExtendSession(ctx context.Context, id string, ttl time.Duration) (*Session, error) {
	var s Session
	in := map[string]int64{"ttl_seconds": int64(ttl / time.Second)}
	if err := c.call(ctx, "POST", "/v1/sessions/"+url.PathEscape(id)+"/extend", in, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteSession stops a session and returns it as it ended. Its
// artifacts stay.
func (c *Client) DeleteSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	if err := c.call(ctx, "DELETE", "/v1/sessions/"+url.PathEscape(id), nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// PreviewRequest asks for a preview URL: scope cdp, vnc, view or review.
type PreviewRequest struct {
	Scope      string `json:"scope"`
	TTLSeconds int    `json:"ttl_seconds,omitempty"`
	ViewOnly   bool   `json:"view_only,omitempty"`
}

// Preview is a signed, expiring URL for one capability of a session.
// For scope cdp, URL is the endpoint a CDP client connects to, and WSURL
// the browser's WebSocket endpoint (no discovery request first); for
// view, URL is a page a person opens in their browser.
type Preview struct {
	ID        string    `json:"id"`
	URL       string    `json:"url"`
	WSURL     string    `json:"ws_url,omitempty"`
	ExpiresAt time.Time `json:"expires_at"`
	Scope     string    `json:"scope"`
	ViewOnly  bool      `json:"view_only"`
}

// CreatePreview returns a new preview URL of a session.
func (c *Client) CreatePreview(ctx context.Context, id string, req PreviewRequest) (*Preview, error) {
	var p Preview
	if err := c.call(ctx, "POST", "/v1/sessions/"+url.PathEscape(id)+"/previews", req, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// RevokePreview revokes a preview; its live connections close.
func (c *Client) RevokePreview(ctx context.Context, id, previewID string) error {
	return c.call(ctx, "DELETE", "/v1/sessions/"+url.PathEscape(id)+"/previews/"+url.PathEscape(previewID), nil, nil)
}

// Runtime is one runtime handler of the gateway.
type Runtime struct {
	Name      string `json:"name"`
	Isolation string `json:"isolation"`
	Usable    bool   `json:"usable"`
	Reason    string `json:"reason,omitempty"`
	Version   string `json:"version,omitempty"`
}

// Runtimes lists the gateway's runtime handlers and names the default.
func (c *Client) Runtimes(ctx context.Context) (def string, rts []Runtime, err error) {
	var out struct {
		Default  string    `json:"default"`
		Runtimes []Runtime `json:"runtimes"`
	}
	err = c.call(ctx, "GET", "/v1/runtimes", nil, &out)
	return out.Default, out.Runtimes, err
}

// Pool is one warm pool and its counters.
type Pool struct {
	Key              string    `json:"key"`
	Kind             string    `json:"kind"`
	Runtime          string    `json:"runtime"`
	Screen           Screen    `json:"screen"`
	Resources        Resources `json:"resources"`
	Size             int       `json:"size"`
	Available        int       `json:"available"`
	Starting         int       `json:"starting"`
	Frozen           int       `json:"frozen"`
	Settling         int       `json:"settling"`
	Claims           int64     `json:"claims"`
	Misses           int64     `json:"misses"`
	Refills          int64     `json:"refills"`
	RefillErrors     int64     `json:"refill_errors"`
	RefillAvgMs      int64     `json:"refill_avg_ms"`
	LastRefillMs     int64     `json:"last_refill_ms"`
	RefillsPerMinute float64   `json:"refills_per_minute"`
}

// Usage is what the tenant holds against its quotas (0: no limit).
type Usage struct {
	Sessions            int     `json:"sessions"`
	CPUs                float64 `json:"cpus"`
	MemoryMB            int     `json:"memory_mb"`
	Recordings          int     `json:"recordings"`
	CreatesLastMinute   int     `json:"creates_last_minute"`
	ArtifactBytes       int64   `json:"artifact_bytes"` // -1: the store did not answer
	Queued              int     `json:"queued"`         // creates waiting for room
	MaxSessions         int     `json:"max_sessions"`
	MaxCPUs             float64 `json:"max_cpus"`
	MaxMemoryMB         int     `json:"max_memory_mb"`
	MaxRecordings       int     `json:"max_recordings"`
	MaxCreatesPerMinute int     `json:"max_creates_per_minute"`
	MaxArtifactBytes    int64   `json:"max_artifact_bytes"`
}

// Usage returns what the tenant holds against its quotas.
func (c *Client) Usage(ctx context.Context) (*Usage, error) {
	var u Usage
	if err := c.call(ctx, "GET", "/v1/usage", nil, &u); err != nil {
		return nil, err
	}
	return &u, nil
}

// Pools lists the gateway's warm pools.
func (c *Client) Pools(ctx context.Context) ([]Pool, error) {
	var out struct {
		Pools []Pool `json:"pools"`
	}
	err := c.call(ctx, "GET", "/v1/pools", nil, &out)
	return out.Pools, err
}

// BrowserWebSocketURL returns the browser's WebSocket URL behind a cdp
// preview (from its /json/version, with the token in its path): what
// clients that take a WebSocket URL (chromedp, rod) connect to.
func (c *Client) BrowserWebSocketURL(ctx context.Context, p *Preview) (string, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", p.URL+"/json/version", nil)
	if err != nil {
		return "", err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s/json/version: %s", p.Scope, resp.Status)
	}
	var v struct {
		WebSocketDebuggerURL string `json:"webSocketDebuggerUrl"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxErrorBody)).Decode(&v); err != nil {
		return "", err
	}
	if v.WebSocketDebuggerURL == "" {
		return "", errors.New("the preview's /json/version names no browser WebSocket")
	}
	return v.WebSocketDebuggerURL, nil
}
