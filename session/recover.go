package session

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sandgate/sandgate/ids"
)

// recover adopts the running, unexpired sessions of known tenants that a
// previous gateway left in containerd, and removes everything else it
// owns: other containers, namespaces and workspaces nobody holds.
func (m *Manager) recover(ctx context.Context) error {
	boxes, err := m.backend.List(ctx)
	if err != nil {
		return err
	}
	kept := map[string]bool{}
	for _, sb := range boxes {
		if m.takeOver(ctx, sb) {
			kept[sb.ID()] = true
		}
	}
	if m.net == nil {
		m.sweep()
		return nil
	}
	for _, id := range m.net.leftovers() {
		if !kept[id] {
			m.log.Info("removing orphaned network namespace", "session", id)
			if err := m.net.remove(ctx, id); err != nil {
				m.log.Error("remove orphan netns", "session", id, "err", err)
			}
		}
	}
	entries, _ := os.ReadDir(filepath.Join(m.cfg.StateDir, "sessions"))
	for _, e := range entries {
		if !kept[e.Name()] && ids.IsSession(e.Name()) {
			// A workspace without a container: also release any address
			// its namespace may still hold.
			if err := m.net.remove(ctx, e.Name()); err != nil {
				m.log.Error("release orphan address", "session", e.Name(), "err", err)
			}
			if err := m.removeWorkspace(e.Name()); err != nil {
				m.log.Error("remove orphan workspace", "session", e.Name(), "err", err)
			}
		}
	}
	m.sweep() // those of containers an earlier gateway's runtime left
	return nil
}

// takeOver adopts what sb holds, or removes it when it cannot be
// adopted, as recover does; kept says it is adopted (or left to the
// replica that starts it, startingAlone).
func (m *Manager) takeOver(ctx context.Context, sb Sandbox) (kept bool) {
	id := sb.ID()
	log := m.log.With("session", id)
	m.mu.Lock()
	if m.sessions[id] != nil || m.adopting[id] || m.orphaning[id] {
		m.mu.Unlock()
		// Held, or being adopted (adoptCreatedAlone), or its trail file
		// is being finalised (a sandbox whose removal failed: its
		// record's next change brings it here again).
		return true
	}
	if m.adopting == nil {
		m.adopting = map[string]bool{}
	}
	m.adopting[id] = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.adopting, id)
		m.mu.Unlock()
	}()
	s, exited, why := m.adopt(ctx, sb)
	if why == whyStartingAlone {
		// Its creator answers for it until it runs: it is adopted
		// then (adoptCreatedAlone), or removed once overdue.
		log.Info("a gateway replica is starting this session (created while no leader answered): it is adopted once it runs, or removed if it does not by its due time")
		m.overdueAlone(id)
		return true
	}
	if s == nil {
		m.dropAloneHold(id)
		log.Info("removing orphaned session", "reason", why)
		tenant, hasFile := m.recoverStoredTrail(ctx, sb)
		// Bounded: a Pod on a lost node can stay terminating for
		// good, and the gateway must start all the same.
		rctx, cancel := context.WithTimeout(ctx, orphanRemoval)
		if err := sb.Remove(rctx); err != nil {
			log.Error("remove orphan sandbox; the next start tries again", "backend", m.backend.Name(), "err", err)
		}
		cancel()
		// Its trail file is finalised by Observe's pass (endOrphanTrails)
		// if the gateway has not observed the manager yet; once it has
		// (a session a replica created alone, adopted apart from the
		// start and not adoptable), here. Either way exactly once: the
		// pass skips it until it is no longer being adopted.
		m.mu.Lock()
		delete(m.adopting, id)
		o := m.observer
		claimed := hasFile && o != nil && m.claimOrphanLocked(id)
		m.mu.Unlock()
		if claimed {
			m.endOrphanFile(o, tenant, id)
		}
		return false
	}
	m.mu.Lock()
	m.holdAdoptedLocked(s, log)
	m.mu.Unlock()
	if _, ok := m.backend.(RecordWatcher); ok {
		// What another replica wrote while the session was adopted
		// (a delete, an extension while no leader answered) was
		// not told: the session was not held yet.
		if rec, err := sb.Record(ctx); err == nil {
			m.recordChanged(rec)
		} else {
			log.Warn("the record of an adopted session could not be read again: a change another replica made while it was adopted may be missed", "err", err)
		}
	}
	log.Info("adopted session", "tenant", s.info.Tenant, "expires_at", s.info.ExpiresAt)
	m.wg.Add(1)
	go m.watch(s, exited)
	if s.resumeStop {
		log.Info("the session's stop had begun before this gateway took it over: it is stopped")
		m.stopAsync(s, StateStopped, "")
	}
	return true
}

// holdAdoptedLocked makes the manager hold an adopted session; the
// caller holds mu.
func (m *Manager) holdAdoptedLocked(s *sess, log *slog.Logger) {
	m.sessions[s.info.ID] = s
	m.byAddr[s.addr] = s
	m.keepHoldLocked(s, log)
	if s.trail.journal && (!s.trail.synced || s.trail.unstored()) {
		// Its adopted event, recorded before it was held, may have been
		// passed over by a flush that looked meanwhile.
		m.kickJournal()
	}
}

// keepHoldLocked gives an adopted session its profile's hold: the one
// taken for it as a replica started it alone (holdStartingAlone), or
// its own again. The caller holds mu.
func (m *Manager) keepHoldLocked(s *sess, log *slog.Logger) {
	if drop := m.aloneHolds[s.info.ID]; drop != nil {
		delete(m.aloneHolds, s.info.ID)
		s.releaseProfile = func() { m.mu.Lock(); drop(); m.mu.Unlock() }
		return
	}
	p := s.info.Profile
	if p == nil {
		return
	}
	// Its hold goes on: nothing else may take the profile first.
	if m.takeProfileLocked(s.info.Tenant, p) {
		tenant, use := s.info.Tenant, *p
		s.releaseProfile = func() { m.mu.Lock(); m.dropProfileLocked(tenant, &use); m.mu.Unlock() }
	} else {
		// Two writers of one profile (an earlier gateway's teardown
		// that failed): the one adopted first keeps the hold, and this
		// one's end does not drop it.
		log.Warn("adopted a second session holding the same profile; only the first keeps the hold", "profile", p.ID)
	}
}

// orphanRemoval bounds the removal of one orphan at startup.
const orphanRemoval = 30 * time.Second

// adopt rebuilds a session from its sandbox, or says why it cannot.
func (m *Manager) adopt(ctx context.Context, sb Sandbox) (*sess, <-chan Exit, string) {
	labels, err := sb.Record(ctx)
	if err != nil {
		return nil, nil, "labels unreadable"
	}
	if labels[labelPool] != "" {
		// Claimed by a gateway that died before containerd had the claim
		// (storeClaim): the claim record finishes it.
		claimed, err := m.readClaim(sb.ID())
		if err != nil {
			// Nobody claimed it: a pooled session is never adopted, so
			// that nothing an earlier gateway started is handed out unseen.
			return nil, nil, "a warm pool session of an earlier gateway"
		}
		claimed[labelPool] = "" // cleared whatever the record says
		if labels, err = sb.SetRecord(ctx, claimed); err != nil {
			return nil, nil, "its claim could not be stored"
		}
		os.Remove(filepath.Join(m.workspaceDir(sb.ID()), claimFile))
		m.log.Info("finished the claim of a warm session an earlier gateway handed out", "session", sb.ID())
	}
	if _, starting := m.startingAlone(labels, time.Now()); starting {
		// Its profile is held for it meanwhile, by its record as read.
		m.holdStartingAlone(sb.ID(), labels)
		return nil, nil, whyStartingAlone
	} else if labels[RecordCreatedAlone] != "" && State(labels[labelState]) == StateStarting {
		// Its creator died before the session was answered: nobody
		// has it.
		return nil, nil, "its start, by a gateway replica while none led, did not finish in time"
	}
	info, err := infoFromLabels(labels)
	if err != nil {
		return nil, nil, err.Error()
	}
	if _, ok := m.Limits(info.Tenant); !ok {
		return nil, nil, "tenant no longer configured"
	}
	// A session whose stop had begun (or was asked by a replica while
	// no leader answered) is adopted to be stopped, expired or not: its
	// profile is saved and its trail records the stop. So is one that
	// expired while no gateway held it, if it writes its profile back:
	// the reaper stops it as any that expired (unless its record, read
	// again, says another replica extended it), and its profile is
	// saved once the gateway observes the manager (keeperWithin).
	if time.Now().After(info.ExpiresAt) && State(labels[labelState]) != StateStopping && (info.Profile == nil || !info.Profile.Persist) {
		return nil, nil, "expired"
	}
	rt, ok := m.runtimes[info.Runtime]
	if !ok || !rt.Usable {
		return nil, nil, "runtime no longer usable"
	}
	addr, err := netip.ParseAddr(labels[labelAddr])
	if err != nil {
		return nil, nil, "no address"
	}
	running, err := sb.Running(ctx)
	switch {
	case errors.Is(err, ErrSandboxGone):
		return nil, nil, "no processes"
	case err != nil:
		return nil, nil, "state unreadable"
	case !running:
		return nil, nil, "not running"
	}
	exited, err := sb.Wait(m.base)
	if err != nil {
		return nil, nil, "cannot be watched"
	}
	ep := endpointOf(addr)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, version, err := waitReady(rctx, ep, info.Kind == KindBrowser, exited, 10*time.Second)
	ep.Version = version
	if err != nil {
		var pe *PublicError
		if errors.As(err, &pe) {
			return nil, nil, pe.Msg
		}
		return nil, nil, "not answering"
	}
	info.State = StateRunning
	info.Isolation = rt.Isolation
	if info.Labels == nil {
		info.Labels = map[string]string{}
	}
	s := newSess(info)
	s.addr, s.ep, s.box = addr, ep, sb
	// Containers of gateways before the revocations file kept their
	// revocations in labels.
	for preview, until := range revokedFromLabels(labels) {
		if until.After(time.Now()) && !m.revocations.has(info.ID, preview, time.Now()) {
			m.revocations.add(info.ID, preview, until, time.Now())
		}
	}
	s.trail = m.liveTrail(info.Tenant, info.ID, false)
	if m.journalOn() {
		// Before the first new event: a host that lost the file gets
		// the trail back from the store. If the store does not answer,
		// the journal tries again before its first flush.
		if err := m.syncTrail(ctx, s); err != nil {
			m.log.Warn("the stored audit trail of an adopted session could not be read yet", "session", info.ID, "err", err)
		}
	}
	adopted := map[string]any{"note": "the gateway restarted and took the session over"}
	if labels[RecordCreatedAlone] != "" {
		adopted["note"] = "a gateway replica created the session while none led; this one leads now and took it over"
	}
	if tag := m.scopeTag(); tag != "" {
		// A session made before created events carried the tag is this
		// gateway's from here on.
		adopted["scope"] = tag
	}
	s.record("adopted", adopted)
	if labels[RecordCreatedAlone] != "" {
		// Its create counts against the tenant's creates per minute, as
		// one this manager admitted.
		if time.Since(info.CreatedAt) < time.Minute {
			m.mu.Lock()
			if m.creates != nil {
				ts := m.creates[info.Tenant]
				i, _ := slices.BinarySearchFunc(ts, info.CreatedAt, time.Time.Compare)
				m.creates[info.Tenant] = slices.Insert(ts, i, info.CreatedAt)
			}
			m.mu.Unlock()
		}
		// Held by a leader from here on: a later one adopts it as any.
		if _, err := sb.SetRecord(ctx, map[string]string{RecordCreatedAlone: ""}); err != nil {
			m.log.Warn("the creator of an adopted session could not be cleared from its record", "session", info.ID, "err", err)
		}
	}
	switch State(labels[labelState]) {
	case StateRunning:
		s.marked = StateRunning // stored already
	case StateStopping:
		// The gateway before died while it stopped the session, or a
		// replica stopped it by its record while no leader answered
		// (its delete): the stop is finished (recover), not undone.
		s.marked, s.stopMarked, s.resumeStop = StateStopping, true, true
		if at, err := time.Parse(time.RFC3339Nano, labels[RecordStopAsked]); err == nil {
			s.record("stop_requested", map[string]any{"happened_at": at.UTC().Format(time.RFC3339Nano),
				"reason": "deleted through a gateway replica while none led"})
			// Recorded: a later adoption (should this gateway die
			// before the stop is done) does not record it again.
			if _, err := sb.SetRecord(ctx, map[string]string{RecordStopAsked: ""}); err != nil {
				m.log.Warn("the stop asked of an adopted session could not be cleared from its record: a later adoption records it again", "session", info.ID, "err", err)
			}
		}
	default:
		m.markRunning(s, sb)
	}
	return s, exited, ""
}
