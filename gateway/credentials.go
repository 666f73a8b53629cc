package gateway

import (
	"errors"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/vault"
)

// WithVault enables the credential API, credential bindings and the
// fill_credential action.
func WithVault(v *vault.Vault) Option { return func(s *Server) { s.vault = v } }

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
