package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/tenant"
)

// RecordingShare spreads recordings over gateway replicas (backend
// kubernetes): the leader places a session's recording, any replica
// with room records it, and another takes it over when that one dies.
type RecordingShare interface {
	// Place puts the session's recording up for a replica to take;
	// note receives what the recording replica notes for the trail (all
	// of it, when placed again by a replica that took the lead), and the
	// channel is closed once it records the display. before says it
	// was placed before (it goes on).
	Place(ctx context.Context, session string, params map[string]string, note func(typ string, at time.Time, replayed bool, f map[string]any)) (ready <-chan struct{}, before bool, err error)
	// Leave stops following here the recording that Place gave ready
	// for, without changing it: a replica standing by that placed it
	// leaves it to the leader that adopts the session.
	Leave(session string, ready <-chan struct{})
	// Stop asks the replica recording the session to stop, at once (the
	// session is stopping), without waiting.
	Stop(ctx context.Context, session string) error
	// Collect stops the session's recording wherever it runs and waits
	// until its segments are stored: the result is what RecordHeld
	// returned ("" when no replica finished it).
	Collect(ctx context.Context, session string) (string, error)
	// Placed is the recordings placed and not collected yet.
	Placed(ctx context.Context) ([]PlacedRecording, error)
}

// PlacedRecording is a recording placed with the replicas: its session,
// its params (as recordingParams made them) and when it was placed.
type PlacedRecording struct {
	Session string
	Params  map[string]string
	Created time.Time
}

// WithRecordingShare has recordings made by whichever replica takes them
// (see RecordingShare) rather than by this one; the recorder still
// finishes them here.
func WithRecordingShare(sh RecordingShare) Option { return func(s *Server) { s.recShare = sh } }

// Results of a held recording.
const (
	heldRecorded = "recorded" // the display was recorded on that replica
	heldNothing  = "nothing"  // it never answered there
	heldFailed   = "failed"   // the recording's parameters or segments failed
)

// handWait bounds how long a replica that stops a recording tries to
// store its segments.
const handWait = time.Minute

// recordingParams is what a replica needs to record a session.
func recordingParams(t recordings.Target) map[string]string {
	return map[string]string{"tenant": t.Tenant, "session": t.Session, "vnc": t.VNC,
		"width": strconv.Itoa(t.Width), "height": strconv.Itoa(t.Height)}
}

// maxRecordedSide bounds a held recording's screen, whoever wrote it.
const maxRecordedSide = 8192

// heldTarget reads a recording's parameters back, checking each.
func heldTarget(session string, p map[string]string) (recordings.Target, error) {
	t := recordings.Target{Tenant: p["tenant"], Session: p["session"], VNC: p["vnc"]}
	var err1, err2 error
	t.Width, err1 = strconv.Atoi(p["width"])
	t.Height, err2 = strconv.Atoi(p["height"])
	switch {
	case t.Session != session || !ids.IsSession(t.Session):
		return t, fmt.Errorf("session %q", t.Session)
	case !tenant.ValidName(t.Tenant):
		return t, fmt.Errorf("tenant %q", t.Tenant)
	case err1 != nil || err2 != nil || t.Width <= 0 || t.Height <= 0 || t.Width > maxRecordedSide || t.Height > maxRecordedSide:
		return t, fmt.Errorf("screen %sx%s", p["width"], p["height"])
	}
	if _, err := netip.ParseAddrPort(t.VNC); err != nil {
		return t, fmt.Errorf("display address %q", t.VNC)
	}
	return t, nil
}

// RecordHeld records a session on this replica, for a recording it
// holds, until ctx ends; then it stores the segments for the leader to
// finish. ready and note reach the leader.
//
// serves says whether the session's display is still at addr (its Pod
// runs, with that address): asked before each connection, so that a
// recording never goes on to whatever is given the address after the
// session.
func RecordHeld(ctx context.Context, rec *recordings.Recorder, session string, params map[string]string, takenOver bool,
	ready func(), note func(string, map[string]any), serves func(ctx context.Context, session string, addr netip.Addr) bool) string {
	t, err := heldTarget(session, params)
	if err != nil {
		note("recording_failed", map[string]any{"reason": "the recording's parameters were refused"})
		return heldFailed
	}
	if takenOver {
		note("recording_taken_over", map[string]any{"reason": "the replica recording it stopped answering"})
	}
	t.Note = note
	addr := netip.MustParseAddrPort(t.VNC).Addr() // checked by heldTarget
	t.Serves = func() bool {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return serves(cctx, session, addr)
	}
	t.Running = func() bool { return ctx.Err() == nil && t.Serves() }
	first := rec.Start(t)
	go func() {
		select {
		case <-first:
			if ctx.Err() == nil {
				ready()
			}
		case <-ctx.Done():
		}
	}()
	<-ctx.Done()
	hctx, cancel := context.WithTimeout(context.Background(), handWait)
	defer cancel()
	recorded, err := rec.Hand(hctx, t.Tenant, t.Session)
	switch {
	case err != nil:
		return heldFailed
	case recorded:
		return heldRecorded
	}
	return heldNothing
}

// HandLeftovers stores in MinIO the segments an earlier run of this
// replica left on its host (it died while it recorded: the segment it
// was writing, those it had not stored yet) of the recordings still
// placed, which another replica records now: the leader joins them into
// the recording at its end, so they are not lost. Run it before this
// replica takes any recording. placed reads, from the API server, the
// parameters of a session's recording (nil: no longer placed): the
// leader removes it before it reads the store to finish the recording,
// so segments stored while it is placed are joined. Those of a
// recording no longer placed (its session ended meanwhile, perhaps as
// they were stored) stay on the host: the janitor finishes them into a
// recording of their own, and says so in the trail, once this replica
// leads.
func HandLeftovers(ctx context.Context, rec *recordings.Recorder, placed func(ctx context.Context, session string) (map[string]string, error), log *slog.Logger) {
	for _, l := range rec.Pending(false) {
		tn, id := l[0], l[1]
		still := func(ctx context.Context) bool {
			p, err := placed(ctx, id)
			return err == nil && p != nil && p["tenant"] == tn
		}
		if !tenant.ValidName(tn) || !ids.IsSession(id) || !still(ctx) {
			continue
		}
		if err := rec.HandLeft(ctx, tn, id, still); err != nil {
			log.Warn("the recording segments an earlier run of this replica left stay on this host", "session", id, "tenant", tn, "err", err)
			continue
		}
		log.Info("stored the recording segments an earlier run of this replica left", "session", id, "tenant", tn)
	}
}

// heldNote adds a note of the replica recording the session to its
// trail. One replayed (written before this replica placed the recording
// again, on taking the lead) is added unless the trail has it: an event
// of its type at or after the note's time, as the replica that led
// before recorded it when it arrived.
func (s *Server) heldNote(tenant, session string) func(string, time.Time, bool, map[string]any) {
	return func(typ string, at time.Time, replayed bool, f map[string]any) {
		if replayed && s.hasEvent(tenant, session, typ, at) {
			return
		}
		s.sessions.Record(session, typ, f)
	}
}

// stopRecording asks the replica recording the session to stop, within
// a few seconds, without waiting for it.
func (s *Server) stopRecording(session string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.recShare.Stop(ctx, session)
}

// collectRecording stops the session's recording on the replica that
// holds it and waits for its segments (backend kubernetes): it reports
// whether nothing was recorded anywhere, as far as the holder knows.
// An error leaves the lease: the janitor collects and finishes it once
// the session is forgotten (sweepRecordings). wait bounds the wait.
func (s *Server) collectRecording(ctx context.Context, session string, wait time.Duration) (nothing bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	result, err := s.recShare.Collect(ctx, session)
	if err != nil {
		s.log.Warn("the recording's holder did not stop in time, or its lease could not be read; the janitor finishes it later", "session", session, "err", err)
	}
	return result == heldNothing, err
}

// Waits for a recording's collection: a recorded session's holder gets
// time to store its segments; any other session's (one ended while no
// replica led has no record of being recorded) is only looked for.
const (
	collectWait      = handWait + 30*time.Second
	collectQuickWait = 5 * time.Second
)
