package gateway

import (
	"context"
	"slices"
	"time"
)

// WithRetention sets how long each tenant's artifacts are kept (zero:
// forever) and how often the janitor looks.
func WithRetention(perTenant map[string]time.Duration, every time.Duration) Option {
	return func(s *Server) { s.retention, s.janitorEvery = perTenant, every }
}

// janitor removes artifacts past their tenant's retention and finalises
// recordings whose session ended while they could not be finalised.
func (s *Server) janitor(ctx context.Context) {
	every := s.janitorEvery
	if every <= 0 {
		every = time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for tenant, keep := range s.retention {
			if keep <= 0 {
				continue
			}
			n, err := s.store.Expire(ctx, tenant, time.Now().Add(-keep))
			if err != nil {
				s.log.Warn("retention", "tenant", tenant, "err", err)
			} else if n > 0 {
				s.log.Info("retention removed artifacts", "tenant", tenant, "count", n)
			}
			if s.profiles == nil {
				continue
			}
			// A profile keeps its current version whatever its age.
			if n, err := s.profiles.Expire(ctx, tenant, time.Now().Add(-keep)); err != nil {
				s.log.Warn("retention of profiles", "tenant", tenant, "err", err)
			} else if n > 0 {
				s.log.Info("retention removed profile versions", "tenant", tenant, "count", n)
			}
		}
		if s.recorder == nil {
			continue
		}
		// Recordings whose finish failed, and those of sessions this
		// gateway does not know (they ended while no gateway ran).
		for _, p := range s.recorder.Pending(false) {
			if _, err := s.sessions.Get(p[0], p[1]); err == nil && !slices.Contains(s.recorder.Pending(true), p) {
				continue
			}
			if _, err := s.recorder.Finish(ctx, p[0], p[1], time.Now()); err != nil {
				s.log.Warn("finalise leftover recording", "session", p[1], "err", err)
			}
		}
	}
}
