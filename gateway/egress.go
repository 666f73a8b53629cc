package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/vault"
)

const (
	maxAllow    = 64
	maxBindings = 16
)

// egressAllow is a session's allow list: the tenant's (tenantAllow),
// then the request's, each pattern once.
func egressAllow(tenantAllow, allow []string) ([]string, error) {
	out := []string{}
	seen := map[string]bool{}
	for _, a := range append(append([]string{}, tenantAllow...), allow...) {
		p, err := egress.ParsePattern(a)
		if err != nil {
			return nil, errInvalid("egress.allow: " + strings.TrimPrefix(err.Error(), egress.ErrInvalid.Error()+": "))
		}
		if !seen[p.String()] {
			seen[p.String()] = true
			out = append(out, p.String())
		}
	}
	if len(out) > maxAllow {
		return nil, errInvalid("egress.allow: at most 64 entries")
	}
	return out, nil
}

// egressSpec checks a create request's egress and credentials against the
// egress rules and the tenant's vault, adding the tenant's default allow
// list. Every mistake is a 4xx that says which entry is wrong.
func (s *Server) egressSpec(c *fiber.Ctx, allow []string, bindings []egress.Binding) (session.Egress, error) {
	tenant := tenantOf(c)
	lim, _ := s.sessions.Limits(tenant)
	var out session.Egress
	var err error
	if out.Allow, err = egressAllow(lim.EgressAllow, allow); err != nil {
		return session.Egress{}, err
	}
	if len(bindings) == 0 {
		return out, nil
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	if err := checkBindings(ctx, func(context.Context) (*vault.Vault, error) { return s.vault, s.needVault() }, tenant, bindings); err != nil {
		return session.Egress{}, err
	}
	out.Credentials = bindings
	return out, nil
}

// checkBindings checks a create's credential bindings against the
// tenant's credentials in the vault open gives (opened only for
// bindings that could be, its error the answer): each is well formed,
// names one of the tenant's, and sends it only where its owner said it
// goes.
func checkBindings(ctx context.Context, open func(context.Context) (*vault.Vault, error), tenant string, bindings []egress.Binding) error {
	if len(bindings) > maxBindings {
		return errInvalid("credentials: at most 16 bindings")
	}
	v, err := open(ctx)
	if err != nil {
		return err
	}
	for i := range bindings {
		b := &bindings[i]
		if err := egress.CheckBinding(b); err != nil {
			return errInvalid("credentials: " + strings.TrimPrefix(err.Error(), egress.ErrInvalid.Error()+": "))
		}
		// Another tenant's credential answers exactly like a missing one.
		m, err := v.Get(ctx, tenant, b.Credential)
		if err != nil {
			if errors.Is(err, vault.ErrNotFound) {
				return errNotFound("credentials: no credential " + b.Credential)
			}
			return vaultError(err)
		}
		// Whoever may create sessions may not send a credential where
		// its owner did not say it goes: that would hand them the
		// secret (a binding to their own host, or a value fill).
		if why := bindingAllowed(m, *b); why != "" {
			return errDenied(fmt.Sprintf("credentials[%d] (%s to %s://%s:%d%s) is refused: %s", i, b.Credential, b.Scheme, b.Host, b.Port, b.PathPrefix, why))
		}
	}
	return nil
}
