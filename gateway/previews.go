package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
)

type previewResponse struct {
	ID  string `json:"id"`
	URL string `json:"url"`
	// WSURL, for a CDP preview, is the browser's WebSocket endpoint: what
	// Puppeteer's browserWSEndpoint or Playwright's connectOverCDP take,
	// with no discovery request first.
	WSURL     string    `json:"ws_url,omitempty"`
	ExpiresAt time.Time `json:"expires_at"`
	Scope     string    `json:"scope"`
	ViewOnly  bool      `json:"view_only"`
}

// previewRequest asks for a preview URL, alone or with a create.
type previewRequest struct {
	Scope    string `json:"scope"`
	TTL      *int64 `json:"ttl_seconds"`
	ViewOnly bool   `json:"view_only"`
}

// check validates the request and returns its TTL.
func (s *Server) checkPreview(req previewRequest) (time.Duration, error) {
	switch req.Scope {
	case ScopeCDP, ScopeVNC, ScopeView, ScopeReview:
	default:
		return 0, errInvalid(`scope must be one of "cdp", "vnc", "view", "review"`)
	}
	ttl, err := seconds("ttl_seconds", req.TTL)
	if err != nil {
		return 0, err
	}
	if ttl == 0 {
		ttl = 5 * time.Minute
	}
	if req.ViewOnly && req.Scope == ScopeCDP {
		return 0, errInvalid("view_only applies to vnc and view previews; CDP cannot be made read-only")
	}
	if req.ViewOnly && req.Scope == ScopeReview {
		return 0, errInvalid("view_only applies to vnc and view previews")
	}
	if ttl > s.cfg.MaxPreviewTTL {
		return 0, errInvalid(fmt.Sprintf("ttl_seconds must be at most %d", int(s.cfg.MaxPreviewTTL.Seconds())))
	}
	return ttl, nil
}

// issuePreview signs a preview of a session the caller owns and records
// it in the session's trail.
func (s *Server) issuePreview(tenant, id string, req previewRequest, ttl time.Duration) (previewResponse, error) {
	out, _, ev, err := s.signPreview(tenant, id, req, ttl)
	if err != nil {
		return previewResponse{}, err
	}
	s.sessions.Record(id, ev.Type, ev.Fields)
	s.durable(id)
	return out, nil
}

// signPreview makes a preview of the session, its token and the event
// that records its issue.
func (s *Server) signPreview(tenant, id string, req previewRequest, ttl time.Duration) (previewResponse, string, session.Event, error) {
	now := time.Now().UTC().Truncate(time.Second)
	pid := newPreviewID()
	claims := previewClaims{Session: id, Tenant: tenant, Scope: req.Scope, ViewOnly: req.ViewOnly}
	claims.ID = pid
	claims.ExpiresAt = jwtTime(now.Add(ttl))
	claims.IssuedAt = jwtTime(now)
	tok, err := s.tokens.issue(claims)
	if err != nil {
		return previewResponse{}, "", session.Event{}, fmt.Errorf("sign preview: %w", err)
	}
	ev := session.Event{Time: time.Now().UTC(), Type: "preview_issued", Fields: issuedFields(&claims)}
	out := previewResponse{
		ID: pid, URL: s.cfg.PublicURL.String() + "/" + req.Scope + "/" + tok,
		ExpiresAt: now.Add(ttl), Scope: req.Scope, ViewOnly: req.ViewOnly,
	}
	if req.Scope == ScopeCDP {
		ws := *s.cfg.PublicURL
		ws.Scheme = s.wsScheme
		out.WSURL = ws.String() + "/cdp/" + tok
	}
	return out, tok, ev, nil
}

// issuedFields are the fields of a preview's preview_issued event, from
// its claims.
func issuedFields(c *previewClaims) map[string]any {
	return map[string]any{"preview": c.ID, "scope": c.Scope, "view_only": c.ViewOnly, "expires_at": c.ExpiresAt.Time.UTC()}
}

// previewAsked is the session and the preview a request to create one
// asks for, and its TTL, checked.
func (s *Server) previewAsked(c *fiber.Ctx) (id string, req previewRequest, ttl time.Duration, err error) {
	if id, err = s.sessionID(c); err != nil {
		return "", req, 0, err
	}
	if err = decode(c, &req); err != nil {
		return "", req, 0, err
	}
	ttl, err = s.checkPreview(req)
	return id, req, ttl, err
}

func (s *Server) createPreview(c *fiber.Ctx) error {
	id, req, ttl, err := s.previewAsked(c)
	if err != nil {
		return err
	}
	tenant := tenantOf(c)
	if req.Scope == ScopeReview {
		// A review outlives its session: it needs the session known to
		// this gateway, or artifacts of it in the store. The issue of
		// one for a forgotten session goes into its stored log before
		// the link is handed out.
		ctx, cancel := reqCtx(c, 30*time.Second)
		defer cancel()
		gone, err := s.forgotten(ctx, tenant, id)
		if err != nil {
			return err
		}
		if gone {
			out, _, ev, err := s.signPreview(tenant, id, req, ttl)
			if err != nil {
				return err
			}
			if err := s.recordStored(ctx, tenant, id, ev); err != nil {
				return &apiError{status: 503, code: "unavailable", msg: "the review link was not issued: its issue could not be added to the session's stored audit log", err: err}
			}
			return c.Status(fiber.StatusCreated).JSON(out)
		}
	} else if _, err := s.sessions.Endpoint(tenant, id); err != nil {
		return err
	}
	out, err := s.issuePreview(tenant, id, req, ttl)
	if err != nil {
		return err
	}
	return c.Status(fiber.StatusCreated).JSON(out)
}

// forgotten says whether id is a session of tenant's that this gateway
// no longer holds (forgotten after its retention) and whose artifacts
// the store still has. An error: the session is not the tenant's, or
// the store could not say.
func (s *Server) forgotten(ctx context.Context, tenant, id string) (bool, error) {
	_, err := s.sessions.Get(tenant, id)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, session.ErrNotFound) {
		return false, err
	}
	as, lerr := s.store.List(ctx, tenant, id)
	if lerr != nil {
		return false, &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: lerr}
	}
	if len(as) == 0 {
		return false, err
	}
	return true, nil
}

// recordStored adds an event to the stored audit log of a session this
// gateway no longer holds. A session whose log was never stored (its
// gateway died as it ended, after its Pod went) has its trail as the
// journal stored it while it ran: the log it gets begins with that
// trail, so that it does not hide it (a log, once there, is what the
// session's events are read from). A log that is there gets the event
// alone.
func (s *Server) recordStored(ctx context.Context, tenant, id string, ev session.Event) error {
	if s.store == nil {
		return errors.New("no artifact store")
	}
	events := []session.Event{ev}
	logs, err := s.store.ListKind(ctx, tenant, id, recordings.KindLog)
	if err != nil && !errors.Is(err, recordings.ErrNotFound) {
		return err
	}
	if len(logs) == 0 {
		trail, _, err := session.StoredTrail(ctx, s.store, tenant, id)
		if err != nil && !errors.Is(err, recordings.ErrNotFound) {
			return err
		}
		events = append(trail, ev)
	}
	return (*observer)(s).StoreTrail(ctx, session.Info{ID: id, Tenant: tenant}, events)
}

// previewNamed is the session and the preview a request names.
func (s *Server) previewNamed(c *fiber.Ctx) (id, pid string, err error) {
	if id, err = s.sessionID(c); err != nil {
		return "", "", err
	}
	if pid = c.Params("preview"); !ids.IsPreview(pid) {
		return "", "", errNotFound("no such preview")
	}
	return id, pid, nil
}

func (s *Server) revokePreview(c *fiber.Ctx) error {
	id, pid, err := s.previewNamed(c)
	if err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	tenant := tenantOf(c)
	gone, err := s.forgotten(ctx, tenant, id)
	if err != nil {
		return err
	}
	if gone {
		return s.revokeForgotten(c, ctx, tenant, id, pid)
	}
	if err := s.revokeHeld(ctx, tenant, id, pid); err != nil {
		return err
	}
	return c.SendStatus(fiber.StatusNoContent)
}

// revokeHeld revokes a preview of a session this gateway holds, and
// records it in the session's trail.
func (s *Server) revokeHeld(ctx context.Context, tenant, id, pid string) error {
	// A revocation lasts as long as its preview would have: the trail
	// says when that is. An id the trail does not know is revoked for
	// the longest a preview may live: the trail may lack its issue (a
	// gateway killed before it stored the event, a trail that dropped
	// issues past its bound), and a link that might be out there is
	// refused rather than left open. A session holds a bounded number.
	until := time.Now().Add(s.cfg.MaxPreviewTTL)
	if evs, err := s.sessions.Events(tenant, id); err == nil {
		expires, _ := previewIssued(evs, pid)
		switch {
		case !expires.IsZero() && !expires.After(time.Now()):
			s.sessions.Record(id, "preview_revoked", map[string]any{"preview": pid, "expired": true})
			s.durable(id)
			return nil // it no longer opens anything
		case !expires.IsZero():
			until = expires
		}
	}
	// RevokePreview answers 404 for another tenant's session: the trail
	// is written only once the caller is known to own it. A revocation
	// that holds in memory but could not be stored is still recorded.
	err := s.sessions.RevokePreview(ctx, tenant, id, pid, until)
	if _, err := s.sessions.Get(tenant, id); err != nil {
		return err
	}
	if errors.Is(err, session.ErrQuota) {
		return err // not revoked: the session holds as many as it may
	}
	s.sessions.Record(id, "preview_revoked", map[string]any{"preview": pid, "stored": err == nil})
	s.durable(id)
	return err
}

// revokeForgotten revokes a preview (a review link) of a session this
// gateway no longer holds. The revocation lasts the longest a preview
// may live (the trail that says how long this one does is in the store,
// not read here), and goes into the session's stored log.
func (s *Server) revokeForgotten(c *fiber.Ctx, ctx context.Context, tenant, id, pid string) error {
	err := s.sessions.RevokeForgotten(ctx, id, pid, time.Now().Add(s.cfg.MaxPreviewTTL))
	if errors.Is(err, session.ErrQuota) {
		return err
	}
	ev := session.Event{Time: time.Now().UTC(), Type: "preview_revoked", Fields: map[string]any{"preview": pid, "stored": err == nil}}
	if aerr := s.recordStored(ctx, tenant, id, ev); aerr != nil {
		s.log.Error("a revocation of a forgotten session's preview is not in its stored audit log", "session", id, "preview", pid, "err", aerr)
		if err == nil {
			return &apiError{status: 503, code: "unavailable", msg: "the preview is revoked, but its revocation could not be added to the session's stored audit log; revoke it again", err: aerr}
		}
	}
	if err != nil {
		return err
	}
	return c.SendStatus(fiber.StatusNoContent)
}

// previewIssued finds when a preview of the session's trail expires
// (zero if the trail has no issue of it), and whether the trail dropped
// preview issues past its bound.
func previewIssued(evs []session.Event, pid string) (expires time.Time, truncated bool) {
	for _, ev := range evs {
		switch ev.Type {
		case "preview_issued":
			if ev.Fields["preview"] != pid {
				continue
			}
			switch v := ev.Fields["expires_at"].(type) {
			case time.Time:
				expires = v
			case string:
				expires, _ = time.Parse(time.RFC3339Nano, v)
			}
			if expires.IsZero() {
				truncated = true // unreadable: taken as the longest
			}
		case "audit_truncated":
			if t := ev.Fields["type"]; t == "preview_issued" || t == "other" {
				truncated = true
			}
		}
	}
	return expires, truncated
}

// durable stores the session's trail now, so that the preview just
// issued or revoked is in it if this gateway dies the moment after (a
// replica that takes over then knows the preview, and can revoke it).
// A store that does not answer in time leaves it to the journal.
func (s *Server) durable(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := s.sessions.Durable(ctx, id); err != nil {
		s.log.Warn("the audit trail could not be stored at once; the journal tries again", "session", id, "err", err)
	}
}
