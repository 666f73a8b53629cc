package gateway

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/vault"
)

// Option configures a Server.
type Option func(*Server)

// WithVault enables the credential API, credential bindings and the
// fill_credential action.
func WithVault(v *vault.Vault) Option { return func(s *Server) { s.vault = v } }

const (
	maxAllow    = 64
	maxBindings = 16
)

func (s *Server) needVault() error {
	if s.vault == nil {
		return &apiError{status: 503, code: "unavailable", msg: "this gateway has no credential vault (vault.key is not configured)"}
	}
	return nil
}

func vaultError(err error) error {
	switch {
	case errors.Is(err, vault.ErrNotFound):
		return errNotFound("no such credential")
	case errors.Is(err, vault.ErrInvalid):
		return errInvalid(strings.TrimPrefix(err.Error(), vault.ErrInvalid.Error()+": "))
	default:
		return &apiError{status: 503, code: "unavailable", msg: "the credential vault is not answering", err: err}
	}
}

func (s *Server) createCredential(c *fiber.Ctx) error {
	if err := s.needVault(); err != nil {
		return err
	}
	var n vault.New
	if err := decode(c, &n); err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	m, err := s.vault.Create(ctx, tenantOf(c), n)
	if err != nil {
		return vaultError(err)
	}
	s.log.Info("credential created", "tenant", tenantOf(c), "credential", m.ID, "kind", m.Kind)
	return c.Status(fiber.StatusCreated).JSON(m)
}

func (s *Server) listCredentials(c *fiber.Ctx) error {
	if err := s.needVault(); err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	ms, err := s.vault.List(ctx, tenantOf(c))
	if err != nil {
		return vaultError(err)
	}
	return c.JSON(fiber.Map{"credentials": ms})
}

func (s *Server) getCredential(c *fiber.Ctx) error {
	if err := s.needVault(); err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	m, err := s.vault.Get(ctx, tenantOf(c), c.Params("cid"))
	if err != nil {
		return vaultError(err)
	}
	return c.JSON(m)
}

func (s *Server) deleteCredential(c *fiber.Ctx) error {
	if err := s.needVault(); err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	if err := s.vault.Delete(ctx, tenantOf(c), c.Params("cid")); err != nil {
		return vaultError(err)
	}
	s.log.Info("credential deleted", "tenant", tenantOf(c), "credential", c.Params("cid"))
	return c.SendStatus(fiber.StatusNoContent)
}

// egressSpec checks a create request's egress and credentials against the
// egress rules and the tenant's vault, adding the tenant's default allow
// list. Every mistake is a 4xx that says which entry is wrong.
func (s *Server) egressSpec(c *fiber.Ctx, allow []string, bindings []egress.Binding) (session.Egress, error) {
	tenant := tenantOf(c)
	lim, _ := s.sessions.Limits(tenant)
	out := session.Egress{Allow: []string{}}
	seen := map[string]bool{}
	for _, a := range append(append([]string{}, lim.EgressAllow...), allow...) {
		p, err := egress.ParsePattern(a)
		if err != nil {
			return session.Egress{}, errInvalid("egress.allow: " + strings.TrimPrefix(err.Error(), egress.ErrInvalid.Error()+": "))
		}
		if !seen[p.String()] {
			seen[p.String()] = true
			out.Allow = append(out.Allow, p.String())
		}
	}
	if len(out.Allow) > maxAllow {
		return session.Egress{}, errInvalid("egress.allow: at most 64 entries")
	}
	if len(bindings) == 0 {
		return out, nil
	}
	if len(bindings) > maxBindings {
		return session.Egress{}, errInvalid("credentials: at most 16 bindings")
	}
	if err := s.needVault(); err != nil {
		return session.Egress{}, err
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	for i := range bindings {
		b := &bindings[i]
		if err := egress.CheckBinding(b); err != nil {
			return session.Egress{}, errInvalid("credentials: " + strings.TrimPrefix(err.Error(), egress.ErrInvalid.Error()+": "))
		}
		// Another tenant's credential answers exactly like a missing one.
		if _, err := s.vault.Get(ctx, tenant, b.Credential); err != nil {
			if errors.Is(err, vault.ErrNotFound) {
				return session.Egress{}, errNotFound("credentials: no credential " + b.Credential)
			}
			return session.Egress{}, vaultError(err)
		}
	}
	out.Credentials = bindings
	return out, nil
}

type fillRequest struct {
	Action     string `json:"action"`
	Credential string `json:"credential"`
	Selector   string `json:"selector"`
	// Field is what to type: "secret" (default) or "username".
	Field string `json:"field"`
}

// fillCredential types a credential's username or secret into a page
// field through the gateway's own CDP connection. The audit trail gets
// the credential id and the selector; the value goes nowhere else.
func (s *Server) fillCredential(c *fiber.Ctx, tenant, id string) error {
	var req fillRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if err := s.needVault(); err != nil {
		return err
	}
	if !egress.ValidCredentialID(req.Credential) {
		return errInvalid("credential must be a credential id")
	}
	if req.Selector == "" || len(req.Selector) > 1024 {
		return errInvalid("selector must be a CSS selector of 1-1024 bytes")
	}
	if req.Field == "" {
		req.Field = "secret"
	}
	if req.Field != "secret" && req.Field != "username" {
		return errInvalid("field must be secret or username")
	}
	info, err := s.sessions.Get(tenant, id)
	if err != nil {
		return err
	}
	if info.Kind != session.KindBrowser {
		return &apiError{status: 409, code: "conflict", msg: "fill_credential needs a browser session"}
	}
	ep, err := s.sessions.Endpoint(tenant, id)
	if err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	cred, err := s.vault.Open(ctx, tenant, req.Credential)
	if err != nil {
		return vaultError(err)
	}
	text := cred.Secret
	if req.Field == "username" {
		if cred.Username == "" {
			return errInvalid("the credential has no username")
		}
		text = cred.Username
	}
	start := time.Now()
	fctx, cancel2 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel2()
	if err := browser.Fill(fctx, ep.CDP, req.Selector, text); err != nil {
		s.sessions.Record(id, "fill_credential_failed", map[string]any{"credential": req.Credential, "selector": req.Selector, "field": req.Field})
		s.log.Warn("fill_credential failed", "session", id, "tenant", tenant, "credential", req.Credential, "err", err)
		return &apiError{status: 409, code: "conflict", msg: "no visible field matched the selector on the session's page in time", err: err}
	}
	s.sessions.Touch(id)
	s.sessions.Record(id, "fill_credential", map[string]any{"credential": req.Credential, "selector": req.Selector, "field": req.Field})
	return c.JSON(actionResponse{Action: "fill_credential", TookMS: time.Since(start).Milliseconds()})
}
