package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
)

var (
	sessionIDPattern = regexp.MustCompile(`^s-[0-9a-f]{16}$`)
	previewIDPattern = regexp.MustCompile(`^p-[0-9a-f]{16}$`)
)

// maxSeconds bounds every *_seconds field before it becomes a Duration.
const maxSeconds = 10 * 365 * 24 * 3600

// decode reads a JSON body strictly: unknown fields and trailing data are
// errors, and the message says what was wrong without echoing input.
func decode(c *fiber.Ctx, v any) error {
	body := c.Body()
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return errInvalid(fmt.Sprintf("malformed JSON at byte %d", se.Offset))
		case errors.As(err, &te):
			return errInvalid(fmt.Sprintf("field %q must be of type %s", te.Field, te.Type))
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return errInvalid("unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field "))
		default:
			return errInvalid("malformed JSON body")
		}
	}
	if _, err := dec.Token(); err != io.EOF {
		return errInvalid("unexpected data after the JSON body")
	}
	return nil
}

func seconds(name string, v *int64) (time.Duration, error) {
	if v == nil {
		return 0, nil
	}
	if *v <= 0 || *v > maxSeconds {
		return 0, errInvalid(name + " must be a positive number of seconds")
	}
	return time.Duration(*v) * time.Second, nil
}

type createRequest struct {
	Kind      string             `json:"kind"`
	Runtime   string             `json:"runtime"`
	TTL       *int64             `json:"ttl_seconds"`
	Idle      *int64             `json:"idle_timeout_seconds"`
	Resources *session.Resources `json:"resources"`
	Screen    *session.Screen    `json:"screen"`
	Record    bool               `json:"record"`
	Egress    *struct {
		Allow []string `json:"allow"`
	} `json:"egress"`
	Credentials []egress.Binding  `json:"credentials"`
	Labels      map[string]string `json:"labels"`
}

func (s *Server) createSession(c *fiber.Ctx) error {
	var req createRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	ttl, err := seconds("ttl_seconds", req.TTL)
	if err != nil {
		return err
	}
	idle, err := seconds("idle_timeout_seconds", req.Idle)
	if err != nil {
		return err
	}
	if req.Record && s.recorder == nil {
		return errInvalid("recording is not available on this gateway (ffmpeg is missing)")
	}
	var allow []string
	if req.Egress != nil {
		allow = req.Egress.Allow
	}
	eg, err := s.egressSpec(c, allow, req.Credentials)
	if err != nil {
		return err
	}
	spec := session.Spec{
		Tenant: tenantOf(c), Kind: session.Kind(req.Kind), Runtime: req.Runtime,
		TTL: ttl, IdleTimeout: idle, Labels: req.Labels, Egress: eg, Record: req.Record,
	}
	if req.Resources != nil {
		spec.Resources = *req.Resources
	}
	if req.Screen != nil {
		spec.Screen = *req.Screen
	}
	wait := c.Query("wait", "true") != "false"
	ctx, cancel := reqCtx(c, 2*time.Minute)
	defer cancel()
	info, err := s.sessions.Create(ctx, spec, wait)
	if err != nil {
		return err
	}
	return c.Status(fiber.StatusCreated).JSON(info)
}

func (s *Server) sessionID(c *fiber.Ctx) (string, error) {
	id := c.Params("id")
	if !sessionIDPattern.MatchString(id) {
		return "", errNotFound("no such session")
	}
	return id, nil
}

func (s *Server) listSessions(c *fiber.Ctx) error {
	return c.JSON(fiber.Map{"sessions": s.sessions.List(tenantOf(c))})
}

func (s *Server) listRuntimes(c *fiber.Ctx) error {
	return c.JSON(fiber.Map{"default": s.sessions.DefaultRuntime(), "runtimes": s.sessions.Runtimes()})
}

func (s *Server) getSession(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	info, err := s.sessions.Get(tenantOf(c), id)
	if err != nil {
		return err
	}
	return c.JSON(info)
}

func (s *Server) extendSession(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	var req struct {
		TTL *int64 `json:"ttl_seconds"`
	}
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.TTL == nil {
		return errInvalid("ttl_seconds is required")
	}
	ttl, err := seconds("ttl_seconds", req.TTL)
	if err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 10*time.Second)
	defer cancel()
	info, err := s.sessions.Extend(ctx, tenantOf(c), id, ttl)
	if err != nil {
		return err
	}
	return c.JSON(info)
}

func (s *Server) deleteSession(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, time.Minute)
	defer cancel()
	info, err := s.sessions.Delete(ctx, tenantOf(c), id)
	if err != nil {
		return err
	}
	return c.JSON(info)
}

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
	if !previewIDPattern.MatchString(pid) {
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

func (s *Server) screenshot(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	tenant := tenantOf(c)
	info, err := s.sessions.Get(tenant, id)
	if err != nil {
		return err
	}
	ep, err := s.sessions.Endpoint(tenant, id)
	if err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	var png []byte
	if info.Kind == session.KindBrowser {
		png, err = browser.Screenshot(ctx, ep.CDP, info.Screen.Width, info.Screen.Height)
	} else {
		png, err = screenPNG(ctx, ep, info.Screen)
	}
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the session did not deliver a screenshot", err: err}
	}
	a, err := s.storeScreenshot(ctx, tenant, id, png)
	if err != nil {
		return err
	}
	return c.Status(fiber.StatusCreated).JSON(a)
}

func (s *Server) storeScreenshot(ctx context.Context, tenant, id string, png []byte) (recordings.Artifact, error) {
	name := "screenshot-" + time.Now().UTC().Format("20060102T150405.000Z") + ".png"
	a, err := s.store.Put(ctx, tenant, id, recordings.KindScreenshot, name, "image/png", png)
	if err != nil {
		return a, &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
	}
	s.sessions.Record(id, "screenshot", map[string]any{"artifact": a.ID, "size": a.Size, "sha256": a.SHA256})
	return a, nil
}

func (s *Server) listArtifacts(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	tenant := tenantOf(c)
	_, known := s.sessions.Get(tenant, id)
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	as, err := s.store.List(ctx, tenant, id)
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
	}
	if known != nil && len(as) == 0 {
		return errNotFound("no such session")
	}
	return c.JSON(fiber.Map{"artifacts": as})
}

func (s *Server) getArtifact(c *fiber.Ctx) error {
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	u, err := s.store.PresignedURL(ctx, tenantOf(c), c.Params("id"))
	if errors.Is(err, recordings.ErrNotFound) {
		return errNotFound("no such artifact")
	}
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Redirect(u.String(), fiber.StatusFound)
}
