package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/tenant"
)

// RelayAlone is what a replica that stands by admits the shells,
// commands, files, actions and screenshots it carries by while no leader
// answers: after a leader's death, until its lease runs out and another
// replica has taken over (15 s and the adoption), an agent's commands
// go on. Preview connections (CDP, VNC) still wait for a leader: their
// revocations are the leader's word.
//
// What it admits is what the leader would have, as of the copies this
// replica keeps: the API key's tenant (the registry stored in MinIO,
// read again every few seconds, not used once out of date), and the
// session's Pod (its record, running and not being deleted, and its
// expiry), from the watch of the session Pods. The ticket it signs
// itself, with the gateway's keys, and the events it keeps until a
// leader answers its report, which records them as it does the
// leader-admitted ones'.
type RelayAlone struct {
	// Tenant is the API key's tenant and its limits (the gateway's
	// defaults applied): tenant.ErrNotFound, tenant.ErrDisabled, or
	// another error when the copy cannot say (tenant.ErrStale).
	Tenant func(key string) (string, session.TenantLimits, error)
	// Session is the session's record and whether its sandbox runs
	// (session.ErrSandboxGone: there is none).
	Session func(ctx context.Context, id string) (map[string]string, bool, error)
}

// AdmitAlone makes a relay (NewRelay) admit by a while no leader
// answers; called before it serves.
func (s *Server) AdmitAlone(a RelayAlone) {
	if l, ok := s.live.(*relayLive); ok && a.Tenant != nil && a.Session != nil {
		l.alone = &a
	}
}

// admitAlone admits a request to session id with key as the leader
// would have (relayShell), by the replica's copies (RelayAlone).
func (l *relayLive) admitAlone(c *fiber.Ctx, id, key string) (*previewClaims, relayAdmitAnswer, error) {
	var none relayAdmitAnswer
	if l.aloneSince.CompareAndSwap(0, time.Now().UnixNano()) {
		l.log.Warn("no leader answers: this replica admits the shells, commands, files and actions it carries by its copy of the tenants and its watch of the session Pods until one does")
	}
	name, lim, err := l.alone.Tenant(key)
	switch {
	case errors.Is(err, tenant.ErrDisabled):
		return nil, none, errDenied("the tenant is disabled")
	case errors.Is(err, tenant.ErrNotFound):
		return nil, none, errUnauthenticated("the API key is not valid")
	case err != nil:
		return nil, none, &apiError{status: 503, code: "unavailable", msg: "the gateway cannot check the request now; retry", err: err}
	case !ids.IsSession(id):
		return nil, none, errNotFound("no such session")
	}
	ctx, cancel := context.WithTimeout(c.Context(), 5*time.Second)
	defer cancel()
	rec, running, err := l.alone.Session(ctx, id)
	if errors.Is(err, session.ErrSandboxGone) {
		return nil, none, errNotFound("no such session")
	}
	if err != nil {
		return nil, none, &apiError{status: 503, code: "unavailable", msg: "the gateway cannot check the request now; retry", err: err}
	}
	info, ep, err := session.FromRecord(rec)
	switch {
	case err != nil:
		var pe *session.PublicError
		if !errors.As(err, &pe) {
			l.log.Warn("a session Pod's record cannot be read", "session", id, "err", err)
		}
		return nil, none, errNotFound("no such session")
	case info.Tenant != name:
		return nil, none, errNotFound("no such session")
	case !running || !time.Now().Before(info.ExpiresAt):
		return nil, none, &apiError{status: 409, code: "conflict", msg: "the session is not running"}
	}
	// The ticket lasts as the leader's does (relayShell).
	until := info.CreatedAt.Add(lim.MaxTTL)
	if info.ExpiresAt.After(until) {
		until = info.ExpiresAt
	}
	until = until.Add(time.Minute)
	claims := shellClaims(name, id, "")
	claims.ExpiresAt = jwtTime(until)
	ticket, err := l.signer.issue(*claims)
	if err != nil {
		return nil, none, &apiError{status: 503, code: "unavailable", msg: "the gateway cannot check the request now; retry", err: err}
	}
	ans := relayAdmitAnswer{Session: id, Tenant: name, Scope: scopeShell, Preview: claims.ID, Expires: until.Unix(), Ticket: ticket,
		AllowRoot: lim.AllowRoot, MaxFileBytes: max(lim.MaxFileBytes, 0),
		CDP: ep.CDP.String(), VNC: ep.VNC.String(), Screen: info.Screen, Kind: info.Kind}
	l.mu.Lock()
	l.admitted[id] = time.Now()
	l.mu.Unlock()
	claims = shellClaims(name, id, ticket)
	claims.allowRoot, claims.maxFileBytes = ans.AllowRoot, ans.MaxFileBytes
	return claims, ans, nil
}
