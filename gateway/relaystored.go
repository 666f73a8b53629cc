package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
)

// What a relay answers alone from the artifact store while no leader
// answers (see RelayAlone): a session's trail as stored, its artifacts,
// an artifact's link, and review links. A reviewer's work does not wait
// for the next leader: all of it is in the store, which every replica
// reads. A review's use is added to an ended session's stored log,
// which takes several writers (StoreTrail), before it is served, as
// the leader adds it; a running session's is kept for the next leader,
// which holds its trail (keepReview).

// eventsAlone answers GET /v1/sessions/:id/events as the leader would
// (events) from the store: an ended session's stored log, or a running
// one's trail as the journal last stored it (each second). The events
// since, and those this replica keeps for the next leader's trail, are
// not in it. A session whose Pod is the tenant's but that has neither
// waits for a leader (503).
func (s *Server) eventsAlone(c *fiber.Ctx, tenantName string) error {
	id := c.Params("id")
	if !ids.IsSession(id) {
		return errNotFound("no such session")
	}
	ctx, cancel := context.WithTimeout(c.Context(), 10*time.Second)
	defer cancel()
	evs, found, err := s.storedEvents(ctx, tenantName, id)
	if err != nil {
		return err
	}
	if !found {
		evs, _, err = session.StoredTrail(ctx, s.store, tenantName, id)
		if err != nil && !errors.Is(err, recordings.ErrNotFound) {
			return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
		}
		found = len(evs) > 0
	}
	if found {
		return c.JSON(fiber.Map{"events": evs})
	}
	if err := s.live.(*relayLive).ownPod(ctx, tenantName, id); err != nil {
		return err
	}
	return relayUnavailableFor(errors.New("the session's audit trail is not stored yet"))
}

// artifactsAlone answers GET /v1/sessions/:id/artifacts as the leader
// would (listArtifacts): the stored artifacts (storedAlone).
func (s *Server) artifactsAlone(c *fiber.Ctx, tenantName string) error {
	as, err := s.storedAlone(c, tenantName, func(ctx context.Context, id string) ([]recordings.Artifact, error) {
		return s.store.List(ctx, tenantName, id)
	})
	if err != nil {
		return err
	}
	return c.JSON(fiber.Map{"artifacts": as})
}

// snapshotsAlone answers GET /v1/sessions/:id/snapshots as the leader
// would (listSnapshots): the stored snapshots (storedAlone).
func (s *Server) snapshotsAlone(c *fiber.Ctx, tenantName string) error {
	as, err := s.storedAlone(c, tenantName, func(ctx context.Context, id string) ([]recordings.Artifact, error) {
		return s.store.ListKind(ctx, tenantName, id, recordings.KindSnapshot)
	})
	if err != nil {
		return err
	}
	return c.JSON(fiber.Map{"snapshots": viewSnapshots(as)})
}

// storedAlone is what list finds stored of the request's session (its
// id param) for tenantName, within 10 s: none for a session whose Pod
// is the tenant's, 404 for any other; 503 while the store does not
// answer.
func (s *Server) storedAlone(c *fiber.Ctx, tenantName string, list func(ctx context.Context, id string) ([]recordings.Artifact, error)) ([]recordings.Artifact, error) {
	id := c.Params("id")
	if !ids.IsSession(id) {
		return nil, errNotFound("no such session")
	}
	if s.store == nil {
		return nil, &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable"}
	}
	ctx, cancel := context.WithTimeout(c.Context(), 10*time.Second)
	defer cancel()
	as, err := list(ctx, id)
	if err != nil {
		return nil, &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
	}
	if len(as) == 0 {
		if err := s.live.(*relayLive).ownPod(ctx, tenantName, id); err != nil {
			return nil, err
		}
	}
	return as, nil
}

// artifactAlone answers GET /v1/artifacts/:id as the leader does
// (getArtifact): a presigned link to one of the tenant's artifacts.
func (s *Server) artifactAlone(c *fiber.Ctx, tenantName string) error {
	if s.store == nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable"}
	}
	c.Locals(localTenant, tenantName)
	return s.getArtifact(c)
}

// reviewOrAlone answers a review link's request (its page, one of its
// artifacts) the Front could not pass to a leader: passOrAlone, the
// link's token read by the replica's copies (tokenAlone, as reviewAuth
// reads it), and answered by answer from the store.
func (l *relayLive) reviewOrAlone(answer fiber.Handler) fiber.Handler {
	return func(c *fiber.Ctx) error {
		token := c.Params("token")
		if token == "" || len(token) > 4096 {
			return errUnauthenticated("the preview token is missing, invalid or expired")
		}
		canAlone := l.alone != nil && l.alone.Revoked != nil && l.alone.Enabled != nil
		return l.passOrAlone(c, l.reviewAnswers, canAlone, func() error {
			claims, err := l.tokenAlone(c.Context(), token)
			if err != nil {
				return err
			}
			if claims.Scope != ScopeReview {
				return errUnauthenticated("the preview token is missing, invalid or expired")
			}
			// An ended session's review goes into its stored log, as the
			// leader adds it (noteReview). A running session's is
			// recorded in its trail, which its leader holds: kept for
			// the next one, as a preview's issue is (keepReview). One
			// whose Pod stops, or that expired, waits for a leader: the
			// next would not adopt it, and would drop what it is told.
			ctx, cancel := context.WithTimeout(c.Context(), 5*time.Second)
			rec, running, err := l.alone.Session(ctx, claims.Session)
			cancel()
			switch {
			case errors.Is(err, session.ErrSandboxGone):
			case err != nil:
				return relayUnavailableFor(err)
			default:
				if _, _, err := l.sessionOf(rec, running, nil, claims.Tenant, claims.Session); err != nil {
					return relayUnavailableFor(fmt.Errorf("the review link of a session that does not run waits for a leader: %w", err))
				}
				c.Locals(localReviewKeep, func(typ string, fields map[string]any) error {
					return l.keepReview(token, claims.Tenant, claims.ID, typ, fields)
				})
			}
			c.Locals(localClaims, claims)
			return answer(c)
		})
	}
}

// keepReview keeps a running session's review use (noteReview's typ
// and fields) of link preview for the next leader, which records it in
// the session's trail (relayEvent). What a replica keeps while no leader
// answers is bounded (a buffer whose oldest events go first): a tenant
// keeps at most maxIssuedAlone uses (as madeAlone counts), one link
// maxReviewUsesAlone of them (each artifact fetched is one: a recorded
// session has many segments), and all tenants together
// maxReviewUsesAllAlone, so that no link's holder takes a tenant's
// budget, and no tenant everyone's.
func (l *relayLive) keepReview(token, tenantName, preview, typ string, fields map[string]any) error {
	if !l.withinAlone(true, aloneBound{tenantName + "\x00review use", maxIssuedAlone},
		aloneBound{"\x00review link\x00" + preview, maxReviewUsesAlone}, aloneBound{"\x00review uses", maxReviewUsesAllAlone}) {
		return &apiError{status: 503, code: "unavailable", msg: "as many review uses as are kept while no gateway replica leads are kept; retry"}
	}
	ev := relayEvent{Token: strings.Clone(token), Type: typ} // (kept past the request)
	ev.Viewer, _ = fields["viewer"].(string)
	ev.Artifact, _ = fields["artifact"].(string)
	ev.Kind, _ = fields["kind"].(string)
	ev.Name, _ = fields["name"].(string)
	l.event(ev)
	return nil
}

// ownPod says whether session id's Pod is tenantName's: nil, 404 when
// it is not (or there is none), 503 when the API server cannot say.
func (l *relayLive) ownPod(ctx context.Context, tenantName, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, found, err := l.podOf(ctx, tenantName, id)
	if err == nil && !found {
		return errNotFound("no such session")
	}
	return err
}

// podOf is session id as its Pod's record has it (viewAlone), read from
// the API server: found false when there is no Pod; 404 when the Pod is
// another tenant's or no session's, 503 when the API server cannot say.
func (l *relayLive) podOf(ctx context.Context, tenantName, id string) (session.Info, bool, error) {
	rec, running, err := l.alone.Session(ctx, id)
	if errors.Is(err, session.ErrSandboxGone) {
		return session.Info{}, false, nil
	}
	if err != nil {
		return session.Info{}, false, relayUnavailableFor(err)
	}
	info, ok := l.viewAlone(rec, running, tenantName)
	if !ok || info.ID != id {
		return session.Info{}, false, errNotFound("no such session")
	}
	return info, true, nil
}
