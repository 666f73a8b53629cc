package gateway

import (
	"context"
	"io"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/session"
)

// previewLive is what the preview routes (CDP and VNC) need of a
// session while they carry its connections: the session manager's word
// on the replica that runs the sessions (managerLive), the leader's on
// a replica that stands by and carries the connections it is sent
// itself (relayLive, relay.go).
type previewLive interface {
	// admit reads a preview token and checks that its session runs,
	// its preview was not revoked and its tenant is enabled; it
	// returns the token's claims, where the session serves and its
	// record (the screen's size). Every refusal is errUnauthenticated's,
	// so a client learns nothing of other sessions; a leader that
	// cannot be asked is 503.
	admit(token string) (*previewClaims, session.Endpoint, session.Info, error)
	// running reports whether the session runs, as far as this replica
	// knows (what it keeps of it may go).
	running(tenant, id string) bool
	// track registers a connection of the preview: closer ends it when
	// the preview is revoked, the session ends or its tenant is
	// disabled. Bounded per session and per preview.
	track(c *previewClaims, closer io.Closer) (release func(), err error)
	// record adds an event of the connection to the session's trail:
	// preview_connected, preview_closed or message_too_big.
	record(c *previewClaims, typ string, fields map[string]any)
	// touch says the session's client is active (the idle timeout).
	touch(c *previewClaims)
	// changed says the request changed its session (an upload, a
	// screenshot): what it recorded is stored before it is answered.
	changed(c *previewClaims)
	// left says a CDP client left; browserGone when the browser closed
	// the connection (the session's browser is checked).
	left(c *previewClaims, browserGone bool)
	// spares: whether this replica keeps spare browser connections
	// (it sees the sessions end, and drops them then).
	spares() bool
}

// shellLive is what the shell and exec routes need besides
// previewLive, whose track, record and touch take the claims openShell
// returns.
type shellLive interface {
	// openShell checks that the request may run commands in session
	// id (its API key, on a replica that stands by) and that the
	// session runs. The claims name the tenant and the session, with
	// scopeShell and shellPreview (the bound on a session's shells),
	// and whether the tenant may run commands as root.
	openShell(c *fiber.Ctx, id string) (*previewClaims, error)
	// startShell starts a command (a shell's, or exec's) in the
	// session.
	startShell(ctx context.Context, c *previewClaims, spec session.ExecSpec) (*session.Process, error)
	// openSession is openShell with where the session serves and its
	// record (its kind and screen), for actions and screenshots.
	openSession(c *fiber.Ctx, id string) (*previewClaims, session.Endpoint, session.Info, error)
}

// A shell's claims: a scope no preview token has (a preview route
// refuses it), and the name its connections are bounded under, per
// session.
const (
	scopeShell   = "shell"
	shellPreview = "shell"
)

func shellClaims(tenant, id, ticket string) *previewClaims {
	c := &previewClaims{Session: id, Tenant: tenant, Scope: scopeShell, raw: ticket}
	c.ID = shellPreview
	return c
}

// managerLive answers from this gateway's session manager.
type managerLive struct{ s *Server }

func (l managerLive) admit(token string) (*previewClaims, session.Endpoint, session.Info, error) {
	s := l.s
	bad := errUnauthenticated("the preview token is missing, invalid or expired")
	c, err := s.tokens.verify(token, time.Now())
	if err != nil {
		return nil, session.Endpoint{}, session.Info{}, bad
	}
	ep, err := s.sessions.Endpoint(c.Tenant, c.Session)
	if err != nil || s.sessions.Revoked(c.Session, c.ID) || !s.tenants.Enabled(c.Tenant) {
		return nil, session.Endpoint{}, session.Info{}, bad
	}
	info, err := s.sessions.Get(c.Tenant, c.Session)
	if err != nil {
		return nil, session.Endpoint{}, session.Info{}, bad
	}
	return c, ep, info, nil
}

func (l managerLive) running(tenant, id string) bool {
	_, err := l.s.sessions.Endpoint(tenant, id)
	return err == nil
}

func (l managerLive) track(c *previewClaims, closer io.Closer) (func(), error) {
	return l.s.sessions.Track(c.Tenant, c.Session, c.ID, closer)
}

func (l managerLive) record(c *previewClaims, typ string, fields map[string]any) {
	l.s.sessions.Record(c.Session, typ, fields)
}

func (l managerLive) touch(c *previewClaims) { l.s.sessions.Touch(c.Session) }

// changed: the routes' middleware stores the trail (routes).
func (l managerLive) changed(*previewClaims) {}

func (l managerLive) spares() bool { return true }

func (l managerLive) left(c *previewClaims, browserGone bool) {
	if browserGone {
		go l.s.checkBrowser(c.Tenant, c.Session)
	}
	l.s.clientLeft(c.Session)
}

// openShell: the API key was checked by the route's middleware.
func (l managerLive) openShell(c *fiber.Ctx, id string) (*previewClaims, error) {
	if _, err := l.s.sessions.Endpoint(tenantOf(c), id); err != nil {
		return nil, err
	}
	return l.claims(tenantOf(c), id), nil
}

// claims are a shell's claims in the tenant's session id, with the
// tenant's limits.
func (l managerLive) claims(tenant, id string) *previewClaims {
	claims := shellClaims(tenant, id, "")
	lim, _ := l.s.sessions.Limits(tenant)
	claims.allowRoot = lim.AllowRoot
	claims.maxFileBytes = lim.MaxFileBytes
	claims.maxArtifactBytes, claims.quotaSaid = max(lim.MaxArtifactBytes, 0), true
	return claims
}

// openSession looks the session up once (an agent's every action
// comes this way).
func (l managerLive) openSession(c *fiber.Ctx, id string) (*previewClaims, session.Endpoint, session.Info, error) {
	ep, err := l.s.sessions.Endpoint(tenantOf(c), id)
	if err != nil {
		return nil, session.Endpoint{}, session.Info{}, err
	}
	info, err := l.s.sessions.Get(tenantOf(c), id)
	if err != nil {
		return nil, session.Endpoint{}, session.Info{}, err
	}
	return l.claims(tenantOf(c), id), ep, info, nil
}

func (l managerLive) startShell(ctx context.Context, c *previewClaims, spec session.ExecSpec) (*session.Process, error) {
	return l.s.sessions.Start(ctx, c.Tenant, c.Session, spec)
}
