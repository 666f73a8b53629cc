package gateway

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/vault"
)

// WithVault enables the credential API, credential bindings and the
// fill_credential action.
func WithVault(v *vault.Vault) Option { return func(s *Server) { s.vault = v } }

func (s *Server) needVault() error {
	if s.vault == nil {
		return errNoVault()
	}
	return nil
}

func errNoVault() error {
	return &apiError{status: 503, code: "unavailable", msg: "this gateway has no credential vault (vault.key is not configured)"}
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

// withVault answers a credential request of the leader's: its tenant's,
// with the gateway's vault.
func (s *Server) withVault(answer func(c *fiber.Ctx, v *vault.Vault, tenant string) error) fiber.Handler {
	return func(c *fiber.Ctx) error {
		if err := s.needVault(); err != nil {
			return err
		}
		return answer(c, s.vault, tenantOf(c))
	}
}

// createCredential: POST /v1/credentials.
func (s *Server) createCredential(c *fiber.Ctx, v *vault.Vault, tenant string) error {
	var n vault.New
	if err := decode(c, &n); err != nil {
		return err
	}
	if len(n.Destinations) > vault.MaxDestinations {
		return errInvalid("destinations: at most 16 entries")
	}
	for i := range n.Destinations {
		d, err := credentialDestination(n.Destinations[i])
		if err != nil {
			return errInvalid(fmt.Sprintf("destinations[%d]: %s", i, strings.TrimPrefix(err.Error(), egress.ErrInvalid.Error()+": ")))
		}
		n.Destinations[i] = d
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	m, err := v.Create(ctx, tenant, n)
	if err != nil {
		return vaultError(err)
	}
	s.log.Info("credential created", "tenant", tenant, "credential", m.ID, "kind", m.Kind)
	return c.Status(fiber.StatusCreated).JSON(m)
}

// listCredentials: GET /v1/credentials.
func listCredentials(c *fiber.Ctx, v *vault.Vault, tenant string) error {
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	ms, err := v.List(ctx, tenant)
	if err != nil {
		return vaultError(err)
	}
	return c.JSON(fiber.Map{"credentials": ms})
}

// getCredential: GET /v1/credentials/:cid.
func getCredential(c *fiber.Ctx, v *vault.Vault, tenant string) error {
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	m, err := v.Get(ctx, tenant, c.Params("cid"))
	if err != nil {
		return vaultError(err)
	}
	return c.JSON(m)
}

// deleteCredential: DELETE /v1/credentials/:cid.
func (s *Server) deleteCredential(c *fiber.Ctx, v *vault.Vault, tenant string) error {
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	if err := v.Delete(ctx, tenant, c.Params("cid")); err != nil {
		return vaultError(err)
	}
	s.log.Info("credential deleted", "tenant", tenant, "credential", c.Params("cid"))
	return c.SendStatus(fiber.StatusNoContent)
}

// credentialDestination checks one of a credential's destinations with
// the egress rules and fills its defaults (the scheme's port, "/").
func credentialDestination(d vault.Destination) (vault.Destination, error) {
	b := destinationBinding(d)
	if err := egress.CheckDestination(&b); err != nil {
		return vault.Destination{}, err
	}
	port := ":" + strconv.Itoa(int(b.Port))
	p, _ := egress.ParsePattern(b.Host + port)
	// The host as the egress rules write it: lower case, "*." for a
	// wildcard, brackets for IPv6.
	return vault.Destination{Scheme: b.Scheme, Host: strings.TrimSuffix(p.String(), port), Port: b.Port, PathPrefix: b.PathPrefix}, nil
}

func destinationBinding(d vault.Destination) egress.Binding {
	return egress.Binding{Scheme: d.Scheme, Host: d.Host, Port: d.Port, PathPrefix: d.PathPrefix}
}

// Destinations are a credential's destinations as the egress rules take
// them (for the proxy, and for checking a binding); one that does not
// check is left out, so it covers nothing.
func Destinations(m vault.Meta) []egress.Binding {
	var out []egress.Binding
	for _, d := range m.Destinations {
		b := destinationBinding(d)
		if egress.CheckDestination(&b) == nil {
			out = append(out, b)
		}
	}
	return out
}

// bindingAllowed is why a session may not bind a credential as b, or "":
// b must lie within one of the credential's destinations, and type the
// secret itself only where the credential allows it.
func bindingAllowed(m vault.Meta, b egress.Binding) string {
	if b.Fill == egress.FillValue && !m.AllowValueFill {
		return "its fill is value, which the credential does not allow (allow_value_fill): the agent could read the secret"
	}
	if b.WithinAny(Destinations(m)) {
		return ""
	}
	if len(m.Destinations) == 0 {
		return "the credential names no destinations (it was stored before they existed): store it again with destinations"
	}
	return "it is not within one of the credential's destinations (scheme, host, port, path_prefix)"
}
