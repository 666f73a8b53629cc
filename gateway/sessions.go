package gateway

import (
	"context"
	"fmt"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/session"
)

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
	// WaitSeconds is how long a create over quota or capacity, or for its
	// profile, may wait (0, the default: refused at once).
	WaitSeconds *int64 `json:"wait_seconds"`
	// Profile is the browser profile to start with; Snapshot the
	// workspace snapshot to start from.
	Profile  *session.ProfileUse `json:"profile"`
	Snapshot string              `json:"snapshot"`
	// Preview asks for a preview URL in the answer, saving the client a
	// request before it connects.
	Preview *previewRequest `json:"preview"`
}

// lifetimes are the TTL and idle timeout a create asks for (0: the
// tenant's defaults), checked.
func (req createRequest) lifetimes() (ttl, idle time.Duration, err error) {
	if ttl, err = seconds("ttl_seconds", req.TTL); err != nil {
		return 0, 0, err
	}
	idle, err = seconds("idle_timeout_seconds", req.Idle)
	return ttl, idle, err
}

// createResponse is the session, with the preview asked for.
type createResponse struct {
	session.Info
	Preview *previewResponse `json:"preview,omitempty"`
}

// maxWaitSeconds bounds wait_seconds.
const maxWaitSeconds = 600

func (s *Server) createSession(c *fiber.Ctx) error {
	var req createRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	ttl, idle, err := req.lifetimes()
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
	if w := req.WaitSeconds; w != nil {
		if *w < 0 || *w > maxWaitSeconds {
			return errInvalid(fmt.Sprintf("wait_seconds must be between 0 and %d", maxWaitSeconds))
		}
		spec.Wait = time.Duration(*w) * time.Second
	}
	wait := c.Query("wait", "true") != "false"
	var previewTTL time.Duration
	if req.Preview != nil {
		if previewTTL, err = s.checkPreview(*req.Preview); err != nil {
			return err
		}
		if !wait {
			return errInvalid("a preview comes with a create that waits for the session (not with wait=false)")
		}
	}
	if err := s.checkArtifactQuota(c, spec.Tenant); err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 2*time.Minute+spec.Wait)
	defer cancel()
	if req.Profile != nil || req.Snapshot != "" {
		kind := spec.Kind
		if kind == "" {
			kind = session.KindBrowser
		}
		if err := s.keepSpec(ctx, spec.Tenant, kind, req.Profile, req.Snapshot, eg.Credentials); err != nil {
			return err
		}
		spec.Profile, spec.Snapshot = req.Profile, req.Snapshot
	}
	info, err := createWatched(ctx, c, cancel, func(ctx context.Context) (session.Info, error) {
		return s.sessions.Create(ctx, spec, wait)
	})
	if err != nil {
		return err
	}
	out := createResponse{Info: info}
	if req.Preview != nil {
		p, err := s.issuePreview(info.Tenant, info.ID, *req.Preview, previewTTL)
		if err != nil {
			// Nobody would know of the session: it goes.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			s.sessions.Delete(dctx, info.Tenant, info.ID)
			return err
		}
		out.Preview = &p
	}
	return c.Status(fiber.StatusCreated).JSON(out)
}

// createWatched is create within ctx, which cancel ends when the client
// hangs up (watchPeer): it leaves the line, and its cold start rolls
// back, rather than getting a session nobody receives. Its failure
// then is not the gateway's: 499.
func createWatched(ctx context.Context, c *fiber.Ctx, cancel func(), create func(ctx context.Context) (session.Info, error)) (session.Info, error) {
	stopWatch, gone := watchPeer(c, cancel)
	defer stopWatch()
	info, err := create(ctx)
	if err != nil && gone() {
		return info, &apiError{status: 499, code: "unavailable", msg: "the client went away", err: err}
	}
	return info, err
}

func (s *Server) sessionID(c *fiber.Ctx) (string, error) {
	id := c.Params("id")
	if !ids.IsSession(id) {
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

// listPools shows the warm pools. They belong to nobody, so every tenant
// sees the same figures (shapes and counts, never a session id).
func (s *Server) listPools(c *fiber.Ctx) error {
	return c.JSON(fiber.Map{"pools": s.sessions.Pools()})
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
	id, ttl, err := s.extendAsked(c)
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

// extendAsked is the session and the TTL an extension asks for.
func (s *Server) extendAsked(c *fiber.Ctx) (string, time.Duration, error) {
	id, err := s.sessionID(c)
	if err != nil {
		return "", 0, err
	}
	var req struct {
		TTL *int64 `json:"ttl_seconds"`
	}
	if err := decode(c, &req); err != nil {
		return "", 0, err
	}
	if req.TTL == nil {
		return "", 0, errInvalid("ttl_seconds is required")
	}
	ttl, err := seconds("ttl_seconds", req.TTL)
	return id, ttl, err
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

// usage is what the caller's tenant holds against its quotas.
func (s *Server) usage(c *fiber.Ctx) error {
	u := s.sessions.Usage(tenantOf(c))
	s.storedBytes(c, tenantOf(c), &u)
	return c.JSON(u)
}

// storedBytes sets u's artifact bytes, the tenant's in the store: -1
// when the store did not answer; none without a store.
func (s *Server) storedBytes(c *fiber.Ctx, tenant string, u *session.Usage) {
	if s.store == nil {
		return
	}
	ctx, cancel := reqCtx(c, 10*time.Second)
	defer cancel()
	if n, err := s.artifactBytes(ctx, tenant); err == nil {
		u.ArtifactBytes = n
	} else {
		u.ArtifactBytes = -1 // the store did not answer
	}
}
