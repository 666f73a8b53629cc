package gateway

import (
	"fmt"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/sandgate/sandgate/ids"
)

type previewResponse struct {
	ID        string    `json:"id"`
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
	Scope     string    `json:"scope"`
	ViewOnly  bool      `json:"view_only"`
}

func (s *Server) createPreview(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	var req struct {
		Scope    string `json:"scope"`
		TTL      *int64 `json:"ttl_seconds"`
		ViewOnly bool   `json:"view_only"`
	}
	if err := decode(c, &req); err != nil {
		return err
	}
	switch req.Scope {
	case ScopeCDP, ScopeVNC, ScopeView, ScopeReview:
	default:
		return errInvalid(`scope must be one of "cdp", "vnc", "view", "review"`)
	}
	ttl, err := seconds("ttl_seconds", req.TTL)
	if err != nil {
		return err
	}
	if ttl == 0 {
		ttl = 5 * time.Minute
	}
	if req.ViewOnly && req.Scope == ScopeCDP {
		return errInvalid("view_only applies to vnc and view previews; CDP cannot be made read-only")
	}
	if ttl > s.cfg.MaxPreviewTTL {
		return errInvalid(fmt.Sprintf("ttl_seconds must be at most %d", int(s.cfg.MaxPreviewTTL.Seconds())))
	}
	tenant := tenantOf(c)
	if req.Scope == ScopeReview {
		if req.ViewOnly {
			return errInvalid("view_only applies to vnc and view previews")
		}
		// A review outlives its session: it needs the session known to
		// this gateway, or artifacts of it in the store.
		if _, err := s.sessions.Get(tenant, id); err != nil {
			ctx, cancel := reqCtx(c, 30*time.Second)
			defer cancel()
			as, lerr := s.store.List(ctx, tenant, id)
			if lerr != nil {
				return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: lerr}
			}
			if len(as) == 0 {
				return err
			}
		}
	} else if _, err := s.sessions.Endpoint(tenant, id); err != nil {
		return err
	}
	now := time.Now().UTC().Truncate(time.Second)
	pid := newPreviewID()
	claims := previewClaims{Session: id, Tenant: tenant, Scope: req.Scope, ViewOnly: req.ViewOnly}
	claims.ID = pid
	claims.ExpiresAt = jwtTime(now.Add(ttl))
	claims.IssuedAt = jwtTime(now)
	tok, err := s.tokens.issue(claims)
	if err != nil {
		return fmt.Errorf("sign preview: %w", err)
	}
	s.sessions.Record(id, "preview_issued", map[string]any{"preview": pid, "scope": req.Scope, "view_only": req.ViewOnly, "expires_at": now.Add(ttl)})
	return c.Status(fiber.StatusCreated).JSON(previewResponse{
		ID: pid, URL: s.cfg.PublicURL.String() + "/" + req.Scope + "/" + tok,
		ExpiresAt: now.Add(ttl), Scope: req.Scope, ViewOnly: req.ViewOnly,
	})
}

func (s *Server) revokePreview(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	pid := c.Params("preview")
	if !ids.IsPreview(pid) {
		return errNotFound("no such preview")
	}
	ctx, cancel := reqCtx(c, 10*time.Second)
	defer cancel()
	// RevokePreview answers 404 for another tenant's session: the trail
	// is written only once the caller is known to own it. A revocation
	// that holds in memory but could not be stored is still recorded.
	err = s.sessions.RevokePreview(ctx, tenantOf(c), id, pid, time.Now().Add(s.cfg.MaxPreviewTTL))
	if _, err := s.sessions.Get(tenantOf(c), id); err != nil {
		return err
	}
	s.sessions.Record(id, "preview_revoked", map[string]any{"preview": pid, "stored": err == nil})
	if err != nil {
		return err
	}
	return c.SendStatus(fiber.StatusNoContent)
}
