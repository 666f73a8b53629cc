package gateway

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
)

// artifactBytesFor is how old a tenant's count of artifact bytes may be:
// counting lists the tenant's objects in the store.
const artifactBytesFor = 30 * time.Second

type artifactCounts struct {
	mu sync.Mutex
	m  map[string]artifactCount
}

type artifactCount struct {
	bytes int64
	err   error // the store did not answer: kept for artifactErrFor
	at    time.Time
}

// artifactErrFor is how long a store that did not answer is not asked
// again, so that a store away does not slow every create.
const artifactErrFor = 5 * time.Second

// artifactBytes is what the tenant's artifacts take in the store, counted
// at most artifactBytesFor ago.
func (s *Server) artifactBytes(ctx context.Context, tenant string) (int64, error) {
	s.artifacts.mu.Lock()
	c, ok := s.artifacts.m[tenant]
	s.artifacts.mu.Unlock()
	switch {
	case ok && c.err != nil && time.Since(c.at) < artifactErrFor:
		return 0, c.err
	case ok && c.err == nil && time.Since(c.at) < artifactBytesFor:
		return c.bytes, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	n, err := s.store.TenantBytes(ctx, tenant)
	count := s.profileBytes
	if s.profiles != nil {
		count = s.profiles.TenantBytes
	}
	if err == nil && count != nil {
		// Profiles count with artifacts.
		var p int64
		p, err = count(ctx, tenant)
		n += p
	}
	s.artifacts.mu.Lock()
	s.artifacts.m[tenant] = artifactCount{bytes: n, err: err, at: time.Now()}
	s.artifacts.mu.Unlock()
	return n, err
}

// WithProfileBytes counts the tenant's profiles with its artifacts
// where the gateway has no profiles of its own (WithProfiles): a
// replica that stands by, which takes snapshots within the quota.
func WithProfileBytes(count func(ctx context.Context, tenant string) (int64, error)) Option {
	return func(s *Server) { s.profileBytes = count }
}

// checkArtifactQuota refuses a create while the tenant's artifacts take
// its whole quota (every session adds to them). A store that does not
// answer refuses nothing: a session's artifacts wait on the host for it.
func (s *Server) checkArtifactQuota(c *fiber.Ctx, tenant string) error {
	lim, _ := s.sessions.Limits(tenant)
	return s.checkArtifactRoom(c, tenant, lim.MaxArtifactBytes)
}

// checkArtifactRoom is checkArtifactQuota with the tenant's quota
// (bytes; 0 or less: none).
func (s *Server) checkArtifactRoom(c *fiber.Ctx, tenant string, quota int64) error {
	if quota <= 0 || s.store == nil {
		return nil
	}
	ctx, cancel := reqCtx(c, 10*time.Second)
	defer cancel()
	n, err := s.artifactBytes(ctx, tenant)
	if err != nil {
		s.log.Warn("artifact quota not checked: the store did not answer", "tenant", tenant, "err", err)
		return nil
	}
	if n >= quota {
		return overArtifactQuota(c, fmt.Sprintf("the tenant's artifacts take %d bytes of its %d", n, quota))
	}
	return nil
}

// overArtifactQuota is the answer to a request the tenant's artifact
// quota has no room for: 429, retried once the count is read again.
func overArtifactQuota(c *fiber.Ctx, why string) error {
	c.Set(fiber.HeaderRetryAfter, fmt.Sprint(int(artifactBytesFor/time.Second)))
	return &apiError{status: 429, code: "quota_exceeded", msg: "over quota: " + why + "; delete some or let retention remove them"}
}

// invalidateArtifactBytes makes the next count of the tenant's stored
// bytes ask the store (after a profile or snapshot changed them).
func (s *Server) invalidateArtifactBytes(tenant string) {
	s.artifacts.mu.Lock()
	delete(s.artifacts.m, tenant)
	s.artifacts.mu.Unlock()
}
