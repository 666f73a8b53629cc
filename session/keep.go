package session

import (
	"context"
	"fmt"
	"time"
)

// What a session keeps between runs, on request: a browser profile it
// starts with and writes back when it ends cleanly, and a workspace
// snapshot it starts from. The manager decides when (after the session
// is ready and before it is handed out; before the container goes, on a
// clean stop) and who may use a profile at once; the observer, a Keeper,
// moves the bytes.

// Keeper is an Observer that moves kept state into and out of sessions.
type Keeper interface {
	// Restore writes the session's profile and snapshot (Info.Profile,
	// Info.Snapshot) into it, once it is ready and before it is handed
	// out. An error fails the create. Restoring a profile restarts the
	// session's browser on it; the manager waits for the browser again.
	Restore(ctx context.Context, info Info, in *Inside) error
	// Save writes the profile of a session that ends cleanly (stopped,
	// not failed) back, before its container goes. It says in the
	// session's trail what it did.
	Save(ctx context.Context, info Info, in *Inside)
}

// Inside runs commands in one session's sandbox whatever the session's
// state, for a Keeper.
type Inside struct {
	m  *Manager
	sb Sandbox
	id string
	ep Endpoint
}

// Endpoint is where the session's services answer.
func (in *Inside) Endpoint() Endpoint { return in.ep }

// Run runs spec in the session and returns its exit code once it has
// exited and its output is copied.
func (in *Inside) Run(ctx context.Context, spec ExecSpec) (int, error) {
	return RunIn(ctx, in.sb, spec, func(err error) { in.m.log.Warn("exec", "session", in.id, "err", err) })
}

// SaveTimeout bounds the save of a profile at a session's end.
const SaveTimeout = 2 * time.Minute

func (m *Manager) keeper() (Keeper, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k, ok := m.observer.(Keeper)
	return k, ok
}

// restore has the Keeper write a starting session's profile and
// snapshot in and, when a profile restarted the browser, waits for it
// again and returns its new /json/version answer.
func (m *Manager) restore(ctx context.Context, info Info, sb Sandbox, ep Endpoint) ([]byte, error) {
	k, ok := m.keeper()
	if !ok {
		return nil, publicf(ErrUnavailable, "this gateway keeps no profiles or snapshots", nil)
	}
	if err := k.Restore(ctx, info, &Inside{m: m, sb: sb, id: info.ID, ep: ep}); err != nil {
		return nil, err
	}
	if info.Profile == nil {
		return ep.Version, nil
	}
	return BrowserReady(ctx, ep, m.cfg.ReadyTimeout)
}

// BrowserReady waits, within ctx and limit, until the browser of a
// session started for a profile answers CDP once the profile is in,
// and returns the browser's version (/json/version).
func BrowserReady(ctx context.Context, ep Endpoint, limit time.Duration) ([]byte, error) {
	_, version, err := waitReady(ctx, ep, true, nil, limit)
	if err != nil {
		return nil, fmt.Errorf("the browser did not start again on its profile: %w", err)
	}
	return version, nil
}

// save has the Keeper write a cleanly stopped session's profile back.
func (m *Manager) save(ctx context.Context, s *sess, sb Sandbox, final State) {
	m.mu.Lock()
	info, ep := copyInfo(s.info), s.ep
	m.mu.Unlock()
	if final != StateStopped || info.Profile == nil || !info.Profile.Persist || sb == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), SaveTimeout)
	defer cancel()
	k, ok := m.keeperWithin(ctx)
	if !ok {
		m.log.Warn("a session's profile was not saved: the gateway keeps no profiles, or did not observe the sessions in time", "session", info.ID)
		return
	}
	k.Save(ctx, info, &Inside{m: m, sb: sb, id: info.ID, ep: ep})
}

// keeperWithin is the Keeper, waited for within ctx while the gateway
// has not observed the manager yet (Observe): a session adopted as the
// manager starts (its stop resumed, or expired) may stop before that.
func (m *Manager) keeperWithin(ctx context.Context) (Keeper, bool) {
	m.mu.Lock()
	o, observed := m.observer, m.observed
	m.mu.Unlock()
	if o == nil && observed != nil {
		select {
		case <-observed:
		case <-ctx.Done():
		case <-m.base.Done():
		}
	}
	return m.keeper()
}

// Profile holds: a session that writes its profile back holds it alone;
// sessions that only read it share it. A hold lasts until the session
// has ended (its profile saved).

type profileHold struct {
	writer  bool
	readers int
}

func profileKey(tenant, id string) string { return tenant + "/" + id }

// takeProfileLocked takes a hold on the profile if it is free for use;
// the caller holds m.mu.
func (m *Manager) takeProfileLocked(tenant string, p *ProfileUse) bool {
	k := profileKey(tenant, p.ID)
	h := m.profiles[k]
	if h == nil {
		h = &profileHold{}
		m.profiles[k] = h
	}
	switch {
	case h.writer, p.Persist && h.readers > 0:
		return false
	case p.Persist:
		h.writer = true
	default:
		h.readers++
	}
	return true
}

// holdProfile takes a hold on the spec's profile, waiting up to
// spec.Wait for it, and returns its release (to be called once).
func (m *Manager) holdProfile(ctx context.Context, spec Spec) (func(), error) {
	p := spec.Profile
	if p == nil {
		return func() {}, nil
	}
	deadline := time.NewTimer(spec.Wait)
	defer deadline.Stop()
	for {
		m.mu.Lock()
		if m.takeProfileLocked(spec.Tenant, p) {
			m.mu.Unlock()
			released := false
			return func() {
				m.mu.Lock()
				defer m.mu.Unlock()
				if !released {
					released = true
					m.dropProfileLocked(spec.Tenant, p)
				}
			}, nil
		}
		freed := m.profileFreed
		m.mu.Unlock()
		if spec.Wait <= 0 {
			return nil, publicf(ErrConflict, fmt.Sprintf("profile %s is in use by another session (a session that writes a profile back holds it alone); try again once it has ended, or set wait_seconds", p.ID), nil)
		}
		select {
		case <-freed:
		case <-deadline.C:
			return nil, publicf(ErrConflict, fmt.Sprintf("profile %s was still in use by another session after waiting %s", p.ID, spec.Wait.Round(time.Second)), nil)
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for profile %s: %w", p.ID, ctx.Err())
		}
	}
}

// dropProfileLocked drops a hold and wakes the creates waiting for a
// profile; the caller holds m.mu.
func (m *Manager) dropProfileLocked(tenant string, p *ProfileUse) {
	k := profileKey(tenant, p.ID)
	h := m.profiles[k]
	if h == nil {
		return
	}
	if p.Persist {
		h.writer = false
	} else if h.readers > 0 {
		h.readers--
	}
	if !h.writer && h.readers == 0 {
		delete(m.profiles, k)
	}
	close(m.profileFreed)
	m.profileFreed = make(chan struct{})
}

// ProfileInUse tells whether a live session of the tenant holds the
// profile (it cannot be deleted or rolled back then).
func (m *Manager) ProfileInUse(tenant, id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.profiles[profileKey(tenant, id)] != nil
}
