package gateway

import (
	"context"
	"slices"
	"time"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/tenant"
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
		s.sweepRecordings(ctx)
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
			m, err := s.recorder.Finish(ctx, p[0], p[1], time.Now())
			if err != nil {
				s.log.Warn("finalise leftover recording", "session", p[1], "err", err)
				continue
			}
			s.noteFinished(ctx, p[0], p[1], m)
		}
	}
}

// sweepAfter: a placed recording whose session this gateway does not
// know, this long after it was placed, is left over (its session ended
// while no replica led, or its end's collection failed).
const sweepAfter = 2 * time.Minute

// sweepRecordings stops and finishes the recordings placed with the
// replicas whose sessions this gateway does not know, so that no replica
// records one for ever and no lease is left.
func (s *Server) sweepRecordings(ctx context.Context) {
	if s.recShare == nil {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	placed, err := s.recShare.Placed(lctx)
	cancel()
	if err != nil {
		s.log.Warn("cannot list the recordings placed with the replicas", "err", err)
		return
	}
	for _, p := range placed {
		tn := p.Params["tenant"]
		if time.Since(p.Created) < sweepAfter || !ids.IsSession(p.Session) {
			continue
		}
		if _, err := s.sessions.Get(tn, p.Session); err == nil {
			continue
		}
		log := s.log.With("session", p.Session, "tenant", tn)
		if _, err := s.collectRecording(ctx, p.Session, collectWait); err != nil {
			continue // the next round
		}
		if s.recorder == nil || !tenant.ValidName(tn) {
			log.Warn("a left-over recording was stopped; nothing here can finish it")
			continue
		}
		fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		m, err := s.recorder.Finish(fctx, tn, p.Session, time.Now())
		cancel()
		switch {
		case err != nil:
			log.Warn("finish a left-over recording", "err", err)
		case m != nil:
			log.Info("finished a left-over recording", "artifact", m.Recording, "segments", len(m.Segments))
			s.noteFinished(ctx, tn, p.Session, m)
		}
	}
}

// noteFinished puts recording_finalised in the audit trail of a session
// whose recording the janitor finished (the session's end noted only
// that it failed, or nothing: it ended while no gateway ran): in the
// trail the manager still holds, which stores it again, or else in the
// stored log. A reviewer reads there what became of the recording.
func (s *Server) noteFinished(ctx context.Context, tenant, id string, m *recordings.Manifest) {
	if m == nil {
		return
	}
	f := finalisedFields(m)
	if _, err := s.sessions.Get(tenant, id); err == nil && s.sessions.Record(id, "recording_finalised", f) {
		s.durable(id)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ev := session.Event{Time: time.Now().UTC(), Type: "recording_finalised", Fields: f}
	if err := s.recordStored(ctx, tenant, id, ev); err != nil {
		s.log.Warn("a left-over recording was finished, but its audit log could not say so", "session", id, "tenant", tenant, "err", err)
	}
}

// finalisedFields are recording_finalised's fields.
func finalisedFields(m *recordings.Manifest) map[string]any {
	return map[string]any{"artifact": m.Recording, "duration_seconds": m.Duration, "segments": len(m.Segments), "size": m.Size, "sha256": m.SHA256}
}
