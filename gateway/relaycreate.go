package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/profile"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/vault"
)

// maxCreatesAlone bounds the creates a replica carries at once (passed
// to a leader, or answered alone: createAnswers); maxCreatesAlonePerTenant
// one tenant's of those it answers alone. A create holds its turn for
// the whole cold start.
const (
	maxCreatesAlone          = 16
	maxCreatesAlonePerTenant = 4
)

// createAlone answers POST /v1/sessions that no leader takes, as the
// leader would (createSession), by RelayAlone.Create: a cold start,
// admitted by the sessions' Pods (session.Alone). What it cannot do
// alone waits for a leader (503 with a Retry-After, as before): a
// create that does not wait for its session (wait=false), one that
// binds credentials on a replica built without a vault, one from a
// snapshot on a replica without a store, one from a profile on a
// replica that opens no profile store, and one that records on a
// replica that cannot record (RecordAlone was not called). The
// bindings are checked against the replica's own vault. A snapshot is
// the tenant's, read from the replica's store and unpacked into the
// session through its Pod before it is handed out, as the leader's is;
// a profile is checked with, read from and written in from the
// replica's own profile store the same way, and held as the Pods'
// records say (session.Alone). A recording is placed with the replicas
// as the leader places it (placeAlone, awaitRecording). One over quota
// is refused at once (429 with a Retry-After), wait_seconds or not: the
// line that waits for room is the leader's; one whose profile another
// session holds is refused as the leader refuses it without
// wait_seconds (409), or with them, 503 with a Retry-After.
func (s *Server) createAlone(c *fiber.Ctx, tenantName string) error {
	l := s.live.(*relayLive)
	var req createRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	// First: what waits for a leader gets the leader's checks, there.
	var share RecordingShare
	if p := l.recordings.Load(); p != nil {
		share = *p
	}
	var leaders string
	switch {
	case req.Record && share == nil:
		leaders = "a create that records, on a replica that cannot record,"
	case len(req.Credentials) > 0 && l.alone.Vault == nil:
		leaders = "a create that binds credentials"
	case req.Profile != nil && l.alone.Profiles == nil:
		leaders = "a create from a profile, on a replica that opens no profile store,"
	case req.Snapshot != "" && s.store == nil:
		leaders = "a create from a snapshot, on a replica without an artifact store,"
	case c.Query("wait", "true") == "false":
		leaders = "a create that does not wait for its session (wait=false)"
	}
	if leaders != "" {
		return &apiError{status: 503, code: "unavailable", msg: leaders + " waits for a gateway replica to lead; retry"}
	}
	ttl, idle, err := req.lifetimes()
	if err != nil {
		return err
	}
	if w := req.WaitSeconds; w != nil && (*w < 0 || *w > maxWaitSeconds) {
		return errInvalid(fmt.Sprintf("wait_seconds must be between 0 and %d", maxWaitSeconds))
	}
	var previewTTL time.Duration
	if req.Preview != nil {
		if previewTTL, err = s.checkPreview(*req.Preview); err != nil {
			return err
		}
	}
	lim, _ := c.Locals(localAloneLimits).(session.TenantLimits)
	var allow []string
	if req.Egress != nil {
		allow = req.Egress.Allow
	}
	spec := session.Spec{Tenant: tenantName, Kind: session.Kind(req.Kind), Runtime: req.Runtime,
		TTL: ttl, IdleTimeout: idle, Labels: req.Labels, Record: req.Record}
	if w := req.WaitSeconds; w != nil {
		spec.Wait = time.Duration(*w) * time.Second // (not waited alone: session.Alone)
	}
	if spec.Egress.Allow, err = egressAllow(lim.EgressAllow, allow); err != nil {
		return err
	}
	if req.Resources != nil {
		spec.Resources = *req.Resources
	}
	if req.Screen != nil {
		spec.Screen = *req.Screen
	}
	if len(req.Credentials) > 0 {
		// Checked against the replica's own vault, as the leader checks
		// them against its own; the proxies bind them by the Pod's
		// record, this replica's now and the leader's once it adopts
		// the session.
		vctx, cancel := context.WithTimeout(c.UserContext(), 10*time.Second)
		err := checkBindings(vctx, func(ctx context.Context) (*vault.Vault, error) {
			return ownAlone(ctx, l.alone.Vault, vaultError, errNoVault)
		}, tenantName, req.Credentials)
		cancel()
		if err != nil {
			return err
		}
		spec.Egress.Credentials = req.Credentials
	}
	if err := s.checkArtifactRoom(c, tenantName, lim.MaxArtifactBytes); err != nil {
		return err
	}
	if !l.storeOK.Load() {
		// Its trail could not be stored: known before a cold start.
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store does not answer: a create waits for it, or for a gateway replica to lead; retry"}
	}
	var profiles *profile.Store
	if req.Profile != nil {
		kind := spec.Kind
		if kind == "" {
			kind = session.KindBrowser
		}
		if err := profileUseValid(kind, req.Profile, spec.Egress.Credentials); err != nil {
			return err
		}
		octx, cancel := context.WithTimeout(c.UserContext(), profileAlone)
		profiles, err = ownAlone(octx, l.alone.Profiles, relayUnavailableFor, errNoProfiles)
		cancel()
		if err != nil {
			return err
		}
		// As long as the leader's check: a version not read whole yet
		// is read whole (up to profiles.max_bytes).
		vctx, cancel := context.WithTimeout(c.UserContext(), 2*time.Minute)
		err = s.checkProfile(vctx, profiles, tenantName, req.Profile.ID)
		cancel()
		if err != nil {
			return profileError(err)
		}
		spec.Profile = req.Profile
	}
	if req.Snapshot != "" {
		sctx, cancel := context.WithTimeout(c.UserContext(), 10*time.Second)
		err := s.checkSnapshot(sctx, tenantName, req.Snapshot)
		cancel()
		if err != nil {
			return err
		}
		spec.Snapshot = req.Snapshot
	}
	release, err := l.createTurn(tenantName)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := reqCtx(c, 2*time.Minute)
	defer cancel()
	// The snapshot is unpacked, the profile written in, the recording
	// placed and the preview signed once the session answers, before its
	// trail is stored: their events are stored with the first ones (a
	// report to the next leader could come before it adopts the
	// session).
	var preview *previewResponse
	recorded := "" // the session whose recording was placed (or tried)
	extra := func(ctx context.Context, info session.Info, ep session.Endpoint) ([]session.Event, error) {
		var evs []session.Event
		// The recording is placed first: its first frame is waited for
		// while the snapshot goes in.
		var recording <-chan struct{}
		if req.Record {
			recorded = info.ID
			ready, ev, err := s.placeAlone(ctx, share, info, ep)
			if err != nil {
				return nil, err
			}
			defer share.Leave(info.ID, ready)
			recording = ready
			evs = append(evs, ev)
		}
		run := func(ctx context.Context, es session.ExecSpec) (int, error) {
			return session.RunIn(ctx, l.sandbox(info.ID), es, func(err error) { s.log.Warn("exec", "session", info.ID, "err", err) })
		}
		if spec.Snapshot != "" {
			f, err := s.unpackSnapshot(ctx, tenantName, spec.Snapshot, run)
			if err != nil {
				return nil, err
			}
			evs = append(evs, session.Event{Time: time.Now().UTC(), Type: "snapshot_restored", Fields: f})
		}
		if spec.Profile != nil {
			// After the snapshot, as the leader's restore: the browser,
			// held until then, starts on the profile.
			f, err := s.writeProfile(ctx, profiles, tenantName, *spec.Profile, run)
			if err != nil {
				return nil, err
			}
			evs = append(evs, session.Event{Time: time.Now().UTC(), Type: "profile_restored", Fields: f})
			if _, err := session.BrowserReady(ctx, ep, time.Minute); err != nil {
				return nil, err
			}
		}
		if recording != nil {
			if err := s.awaitRecording(ctx, info.ID, recording, evs[0].Time); err != nil {
				return nil, err
			}
		}
		if req.Preview != nil {
			p, _, ev, err := s.signPreview(tenantName, info.ID, *req.Preview, previewTTL)
			if err != nil {
				return nil, relayUnavailableFor(err)
			}
			preview = &p
			evs = append(evs, ev)
		}
		return evs, nil
	}
	info, err := createWatched(ctx, c, cancel, func(ctx context.Context) (session.Info, error) {
		return l.alone.Create(ctx, spec, lim, extra)
	})
	if err != nil {
		if recorded != "" {
			// Its Pod is gone: the replica recording it stops, and the
			// leader's janitor finishes what it stored.
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			serr := share.Stop(sctx, recorded)
			scancel()
			if serr != nil {
				s.log.Warn("the recording of a session whose create failed could not be stopped; the leader's janitor stops it", "session", recorded, "err", serr)
			}
		}
		return err
	}
	out := createResponse{Info: info, Preview: preview}
	return c.Status(fiber.StatusCreated).JSON(out)
}

// createOrAlone answers POST /v1/sessions that the Front could not pass
// to a leader: passed to the leader if one answers now (given as long
// as a create may take), else answered alone by answer (createAlone),
// the key checked by the copy of the tenants.
func (l *relayLive) createOrAlone(answer func(c *fiber.Ctx, tenant string) error) fiber.Handler {
	return func(c *fiber.Ctx) error {
		key, err := boundedKey(c)
		if err != nil {
			return err
		}
		canAlone := l.alone != nil && l.alone.Create != nil
		return l.passOrAloneWithin(c, l.createAnswers, createPassFor, canAlone, func() error {
			return l.answerAlone(c, key, answer)
		})
	}
}

// createPassFor is how long a create passed to the leader may take: its
// longest wait for room, and a cold start.
const createPassFor = maxWaitSeconds*time.Second + 2*time.Minute

// createTurn takes one of the tenant's turns of creates answered alone;
// release gives it back. None free: 503.
func (l *relayLive) createTurn(tenantName string) (release func(), err error) {
	return l.tenantTurn(l.createsBy, tenantName, maxCreatesAlonePerTenant, "too many of the tenant's creates are under way while no gateway replica leads; retry")
}

// placeAlone places the recording of a session created alone with the
// replicas (sh), as the leader's observer places a session's recording
// (SessionRunning); awaitRecording waits for its first frame. The
// caller then leaves the recording to the leader that adopts the
// session (sh.Leave), which places it again and is replayed what its
// holder noted meanwhile. The event is the session's recording_started.
func (s *Server) placeAlone(ctx context.Context, sh RecordingShare, info session.Info, ep session.Endpoint) (<-chan struct{}, session.Event, error) {
	t := recordings.Target{Tenant: info.Tenant, Session: info.ID, VNC: ep.VNC.String(), Width: info.Screen.Width, Height: info.Screen.Height}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	ready, _, err := sh.Place(pctx, info.ID, recordingParams(t), func(string, time.Time, bool, map[string]any) {})
	cancel()
	if err != nil {
		s.log.Warn("the recording of a session created alone could not be placed with the replicas", "session", info.ID, "err", err)
		return nil, session.Event{}, &apiError{status: 503, code: "unavailable", msg: "the session's recording could not be placed with the gateway replicas; retry"}
	}
	return ready, session.Event{Time: time.Now().UTC(), Type: "recording_started"}, nil
}

// awaitRecording waits until the recording placed at placed has its
// first frame, as long as the leader would (recordingStartWait from
// then) or as ctx's deadline lets it, handing the session out regardless
// after that; a client that went away (ctx cancelled) fails the create.
func (s *Server) awaitRecording(ctx context.Context, id string, ready <-chan struct{}, placed time.Time) error {
	timer := time.NewTimer(time.Until(placed.Add(recordingStartWait)))
	defer timer.Stop()
	select {
	case <-ready:
		return nil
	case <-timer.C:
	case <-ctx.Done():
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return ctx.Err() // the client went away
		}
	}
	s.log.Warn("recording has not started yet; the session is handed out all the same", "session", id, "waited", time.Since(placed).Round(time.Millisecond))
	return nil
}
