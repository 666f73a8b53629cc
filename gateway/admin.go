package gateway

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/tenant"
)

// The admin API (/admin/v1, with an admin key, never a tenant's):
// tenants and their API keys at runtime. A tenant's key is refused here
// and an admin key is refused under /v1.

// WithTenants makes the gateway authenticate with r and serve the admin
// API over it. Without it, Config.APIKeys is a fixed set of keys.
func WithTenants(r *tenant.Registry) Option { return func(s *Server) { s.tenants = r } }

func (s *Server) adminRoutes() {
	adm := s.app.Group("/admin/v1", s.authenticateAdmin)
	adm.Get("/tenants", s.adminListTenants)
	adm.Post("/tenants", s.adminCreateTenant)
	adm.Get("/tenants/:name", s.adminGetTenant)
	adm.Patch("/tenants/:name", s.adminUpdateTenant)
	adm.Get("/tenants/:name/keys", s.adminListKeys)
	adm.Post("/tenants/:name/keys", s.adminIssueKey)
	adm.Delete("/tenants/:name/keys/:kid", s.adminRevokeKey)
}

// authenticateAdmin admits only the config's admin keys.
func (s *Server) authenticateAdmin(c *fiber.Ctx) error {
	key, ok := strings.CutPrefix(c.Get(fiber.HeaderAuthorization), "Bearer ")
	if !ok || key == "" {
		return errUnauthenticated("an admin key is required: Authorization: Bearer <admin-key>")
	}
	if len(s.cfg.AdminKeys) == 0 {
		return errDenied("the admin API is off: the config names no admin_key_sha256")
	}
	if !s.cfg.AdminKeys[tenant.Digest(key)] {
		return errUnauthenticated("the admin key is not valid")
	}
	return c.Next()
}

// tenantView is a tenant as the admin API shows it.
type tenantView struct {
	Name              string        `json:"name"`
	Source            string        `json:"source"`
	Disabled          bool          `json:"disabled"`
	CreatedAt         time.Time     `json:"created_at"`
	MaxSessions       int           `json:"max_sessions"`
	MaxCPUs           float64       `json:"max_cpus"`
	MaxMemoryMB       int           `json:"max_memory_mb"`
	MaxRecordings     int           `json:"max_recordings"`
	MaxCreatesPerMin  int           `json:"max_creates_per_minute"`
	MaxArtifactBytes  int64         `json:"max_artifact_bytes"`
	DefaultTTLSeconds int64         `json:"default_ttl_seconds"`
	MaxTTLSeconds     int64         `json:"max_ttl_seconds"`
	MaxIdleSeconds    int64         `json:"max_idle_seconds"`
	AllowRoot         bool          `json:"allow_root"`
	MaxFileBytes      int64         `json:"max_file_bytes"`
	EgressAllow       []string      `json:"egress_allow"`
	Usage             session.Usage `json:"usage"`
}

// tenantsIn is what the admin API's reads show: a registry (the
// leader's, or a replica's copy of the stored one, adminAlone) and a
// tenant's usage.
type tenantsIn struct {
	reg   tenant.Reader
	usage func(name string) session.Usage
}

// tenantsHere is the leader's.
func (s *Server) tenantsHere() tenantsIn {
	in := tenantsIn{reg: s.tenants, usage: func(string) session.Usage { return session.Usage{} }}
	if s.sessions != nil {
		in.usage = s.sessions.Usage
	}
	return in
}

func (s *Server) viewTenant(t tenant.Tenant) tenantView { return s.tenantsHere().view(t) }

func (in tenantsIn) view(t tenant.Tenant) tenantView {
	v := tenantView{Name: t.Name, Source: t.Source, Disabled: t.Disabled, CreatedAt: t.CreatedAt,
		MaxSessions: t.MaxSessions, MaxCPUs: t.MaxCPUs, MaxMemoryMB: t.MaxMemoryMB,
		MaxRecordings: t.MaxRecordings, MaxCreatesPerMin: t.MaxCreatesPerMinute, MaxArtifactBytes: t.MaxArtifactBytes,
		DefaultTTLSeconds: int64(t.DefaultTTL / time.Second), MaxTTLSeconds: int64(t.MaxTTL / time.Second),
		MaxIdleSeconds: int64(t.MaxIdle / time.Second), AllowRoot: t.AllowRoot, MaxFileBytes: t.MaxFileBytes,
		EgressAllow: t.EgressAllow}
	if v.EgressAllow == nil {
		v.EgressAllow = []string{}
	}
	v.Usage = in.usage(t.Name)
	return v
}

// tenantRequest creates a tenant or, in a PATCH, changes the fields it
// names.
type tenantRequest struct {
	Name              *string  `json:"name"`
	MaxSessions       *int     `json:"max_sessions"`
	MaxCPUs           *float64 `json:"max_cpus"`
	MaxMemoryMB       *int     `json:"max_memory_mb"`
	MaxRecordings     *int     `json:"max_recordings"`
	MaxCreatesPerMin  *int     `json:"max_creates_per_minute"`
	MaxArtifactBytes  *int64   `json:"max_artifact_bytes"`
	DefaultTTLSeconds *int64   `json:"default_ttl_seconds"`
	MaxTTLSeconds     *int64   `json:"max_ttl_seconds"`
	MaxIdleSeconds    *int64   `json:"max_idle_seconds"`
	AllowRoot         *bool    `json:"allow_root"`
	MaxFileBytes      *int64   `json:"max_file_bytes"`
	EgressAllow       []string `json:"egress_allow"`
	Disabled          *bool    `json:"disabled"`
}

// limits applies the request's limit fields to l; changed says whether
// it named any.
func (r *tenantRequest) limits(l tenant.Limits) (out tenant.Limits, changed bool, err error) {
	set := func(ok bool) { changed = changed || ok }
	if v := r.MaxSessions; v != nil {
		if *v < 0 || *v > 10000 {
			return l, false, errInvalid("max_sessions must be between 0 (no limit) and 10000")
		}
		l.MaxSessions = *v
		set(true)
	}
	if v := r.MaxCPUs; v != nil {
		if *v < 0 || *v > 4096 {
			return l, false, errInvalid("max_cpus must be between 0 (no limit) and 4096")
		}
		l.MaxCPUs = *v
		set(true)
	}
	if v := r.MaxMemoryMB; v != nil {
		if *v < 0 || *v > 64<<20 {
			return l, false, errInvalid("max_memory_mb must be between 0 (no limit) and 67108864")
		}
		l.MaxMemoryMB = *v
		set(true)
	}
	for _, f := range []struct {
		name string
		v    *int
		to   *int
	}{{"max_recordings", r.MaxRecordings, &l.MaxRecordings}, {"max_creates_per_minute", r.MaxCreatesPerMin, &l.MaxCreatesPerMinute}} {
		if f.v == nil {
			continue
		}
		if *f.v < 0 || *f.v > 100000 {
			return l, false, errInvalid(f.name + " must be between 0 (no limit) and 100000")
		}
		*f.to = *f.v
		set(true)
	}
	if v := r.MaxArtifactBytes; v != nil {
		if *v < 0 {
			return l, false, errInvalid("max_artifact_bytes must not be negative (0: no limit)")
		}
		l.MaxArtifactBytes = *v
		set(true)
	}
	for _, f := range []struct {
		name string
		v    *int64
		to   *time.Duration
	}{{"default_ttl_seconds", r.DefaultTTLSeconds, &l.DefaultTTL}, {"max_ttl_seconds", r.MaxTTLSeconds, &l.MaxTTL}, {"max_idle_seconds", r.MaxIdleSeconds, &l.MaxIdle}} {
		if f.v == nil {
			continue
		}
		if *f.v < 0 || *f.v > maxSeconds {
			return l, false, errInvalid(fmt.Sprintf("%s must be between 0 (the default) and %d", f.name, maxSeconds))
		}
		*f.to = time.Duration(*f.v) * time.Second
		set(true)
	}
	if eff := l.MaxTTL; l.DefaultTTL > 0 && l.DefaultTTL > max(eff, 0) && (eff > 0 || l.DefaultTTL > session.DefaultMaxTTL) {
		return l, false, errInvalid(fmt.Sprintf("default_ttl_seconds must not be over max_ttl_seconds (%d when not set)", int64(session.DefaultMaxTTL/time.Second)))
	}
	if r.AllowRoot != nil {
		l.AllowRoot = *r.AllowRoot
		set(true)
	}
	if v := r.MaxFileBytes; v != nil {
		if *v < 0 {
			return l, false, errInvalid("max_file_bytes must not be negative (0: the default)")
		}
		l.MaxFileBytes = *v
		set(true)
	}
	if r.EgressAllow != nil {
		if len(r.EgressAllow) > 64 {
			return l, false, errInvalid("egress_allow holds at most 64 patterns")
		}
		for _, p := range r.EgressAllow {
			if _, err := egress.ParsePattern(p); err != nil {
				return l, false, errInvalid("egress_allow: " + err.Error())
			}
		}
		l.EgressAllow = r.EgressAllow
		set(true)
	}
	return l, changed, nil
}

// saved handles a change the registry made but could not write yet: it
// took effect, so the answer is the change's, with a warning, and the
// registry retries the write.
func (s *Server) saved(c *fiber.Ctx, err error) error {
	if errors.Is(err, tenant.ErrNotSaved) {
		s.log.Error("admin: change not written yet; retrying in the background", "err", err)
		c.Set("Warning", `199 sandgate "the change took effect but is not written to disk yet"`)
		return nil
	}
	return err
}

// tenantErr maps the registry's errors to the contract.
func tenantErr(err error) error {
	msg := err.Error()
	switch {
	case errors.Is(err, tenant.ErrNotFound):
		return errNotFound("no such tenant or key")
	case errors.Is(err, tenant.ErrInvalid):
		return errInvalid(strings.TrimPrefix(msg, tenant.ErrInvalid.Error()+": "))
	case errors.Is(err, tenant.ErrConflict):
		return &apiError{status: 409, code: "conflict", msg: strings.TrimPrefix(msg, tenant.ErrConflict.Error()+": ")}
	}
	return &apiError{status: 503, code: "unavailable", msg: "the tenant registry could not be written", err: err}
}

func (s *Server) adminListTenants(c *fiber.Ctx) error { return listTenantsIn(c, s.tenantsHere()) }

func listTenantsIn(c *fiber.Ctx, in tenantsIn) error {
	out := []tenantView{}
	for _, t := range in.reg.List() {
		out = append(out, in.view(t))
	}
	return c.JSON(fiber.Map{"tenants": out})
}

func (s *Server) adminGetTenant(c *fiber.Ctx) error { return getTenantIn(c, s.tenantsHere()) }

func getTenantIn(c *fiber.Ctx, in tenantsIn) error {
	t, err := in.reg.Get(c.Params("name"))
	if err != nil {
		return tenantErr(err)
	}
	return c.JSON(in.view(t))
}

func (s *Server) adminCreateTenant(c *fiber.Ctx) error {
	var req tenantRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.Name == nil {
		return errInvalid("name is required")
	}
	lim, _, err := req.limits(tenant.Limits{})
	if err != nil {
		return err
	}
	t := tenant.Tenant{Name: *req.Name, Limits: lim}
	if req.Disabled != nil {
		t.Disabled = *req.Disabled
	}
	t, err = s.tenants.Create(t)
	if err = s.saved(c, err); err != nil {
		return tenantErr(err)
	}
	s.log.Info("admin: tenant created", "tenant", t.Name)
	return c.Status(fiber.StatusCreated).JSON(s.viewTenant(t))
}

// adminUpdateTenant changes limits or disables a tenant. Disabling stops
// its sessions (their previews close with them) and refuses its keys;
// their artifacts stay for review.
func (s *Server) adminUpdateTenant(c *fiber.Ctx) error {
	var req tenantRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.Name != nil {
		return errInvalid("a tenant cannot be renamed")
	}
	t, err := s.tenants.Get(c.Params("name"))
	if err != nil {
		return tenantErr(err)
	}
	lim, changed, err := req.limits(t.Limits)
	if err != nil {
		return err
	}
	var limits *tenant.Limits
	if changed {
		limits = &lim
	}
	t, err = s.tenants.Update(t.Name, limits, req.Disabled)
	if err = s.saved(c, err); err != nil {
		return tenantErr(err)
	}
	if t.Disabled && s.sessions != nil {
		n := s.sessions.StopTenant(t.Name, "the tenant was disabled")
		s.log.Info("admin: tenant disabled", "tenant", t.Name, "sessions_stopped", n)
	} else {
		s.log.Info("admin: tenant updated", "tenant", t.Name, "disabled", t.Disabled)
	}
	return c.JSON(s.viewTenant(t))
}

func (s *Server) adminListKeys(c *fiber.Ctx) error { return listKeysIn(c, s.tenantsHere()) }

func listKeysIn(c *fiber.Ctx, in tenantsIn) error {
	keys, err := in.reg.Keys(c.Params("name"))
	if err != nil {
		return tenantErr(err)
	}
	return c.JSON(fiber.Map{"keys": keys})
}

func (s *Server) adminIssueKey(c *fiber.Ctx) error {
	var req struct {
		Name string `json:"name"`
	}
	if err := decode(c, &req); err != nil {
		return err
	}
	key, rec, err := s.tenants.Issue(c.Params("name"), req.Name)
	if err != nil {
		return tenantErr(err)
	}
	s.log.Info("admin: API key issued", "tenant", rec.Tenant, "key_id", rec.ID)
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Status(fiber.StatusCreated).JSON(struct {
		tenant.Key
		APIKey string `json:"api_key"`
	}{rec, key})
}

func (s *Server) adminRevokeKey(c *fiber.Ctx) error {
	if err := s.saved(c, s.tenants.Revoke(c.Params("name"), c.Params("kid"))); err != nil {
		return tenantErr(err)
	}
	s.log.Info("admin: API key revoked", "tenant", c.Params("name"), "key_id", c.Params("kid"))
	return c.SendStatus(fiber.StatusNoContent)
}
