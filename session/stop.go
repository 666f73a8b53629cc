package session

import (
	"context"
	"time"
)

// Delete stops a session and returns its final state once its artifacts
// are final, or once ctx ends while they are still being finalised (the
// finalisation goes on). Deleting a stopped session returns it unchanged.
func (m *Manager) Delete(ctx context.Context, tenant, id string) (Info, error) {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return Info{}, err
	}
	m.mu.Lock()
	state, cancel := s.info.State, s.cancel
	m.mu.Unlock()
	if state == StateStarting && cancel != nil {
		cancel() // the start rolls back by itself
		select {
		case <-s.done:
		case <-ctx.Done():
			return Info{}, ctx.Err()
		}
		m.mu.Lock()
		s.info.State, s.info.Failure = StateStopped, ""
		m.mu.Unlock()
		return m.snapshot(s), nil
	}
	m.stop(ctx, s, StateStopped, "")
	select {
	case <-s.final:
	case <-ctx.Done():
	}
	return m.snapshot(s), nil
}

// stop tears a session down and returns once it has: live connections,
// task, container, snapshot, network namespace and workspace. Its
// finalisation runs on by itself. It is idempotent.
func (m *Manager) stop(ctx context.Context, s *sess, final State, failure string) {
	if !m.beginStop(s) {
		<-s.done
		return
	}
	m.teardown(ctx, s, final, failure)
}

// stopAsync is stop for the reaper, the probe and the watcher: the
// teardown runs in a goroutine of its own, so one slow session never
// holds up the stop of another.
func (m *Manager) stopAsync(s *sess, final State, failure string) {
	if !m.beginStop(s) {
		return
	}
	m.teardownAsync(s, final, failure)
}

// teardownAsync tears a session whose stop began (beginStop) down in a
// goroutine of its own.
func (m *Manager) teardownAsync(s *sess, final State, failure string) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.teardown(m.base, s, final, failure)
	}()
}

// beginStop marks a running session stopping and closes its live
// connections; false if it is not running (another stop has it).
func (m *Manager) beginStop(s *sess) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.beginStopLocked(s, nil)
}

// beginStopLocked is beginStop with m.mu held; asked, when not nil, is
// the stop_requested recorded with it, so that no other stop comes
// between the request and the stop it asks for.
func (m *Manager) beginStopLocked(s *sess, asked map[string]any) bool {
	if s.info.State != StateRunning {
		return false
	}
	if asked != nil {
		s.record("stop_requested", asked)
	}
	s.info.State = StateStopping
	closeConns(s, "")
	return true
}

func (m *Manager) teardown(ctx context.Context, s *sess, final State, failure string) {
	m.mu.Lock()
	sb := s.box
	m.mu.Unlock()
	log := m.log.With("session", s.info.ID, "tenant", s.info.Tenant)
	// Not while a pooled session's pause is under way: it is finished
	// first, and Remove thaws what it froze.
	s.freezeMu.Lock()
	defer s.freezeMu.Unlock()
	// Stored with the sandbox first: a replica that admits by the
	// record while no leader answers refuses the session from now on.
	if err := m.markState(context.WithoutCancel(ctx), s, sb, StateStopping); err != nil {
		log.Warn("the session's stop could not be stored with its sandbox: a replica standing by may admit it while no leader answers, until it is removed", "err", err)
	}
	// A clean end writes the session's profile back first, within its own
	// bound; the removal's bound starts after it.
	m.save(ctx, s, sb, final)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	m.stopping(s.info.ID)
	if err := sb.Remove(ctx); err != nil {
		log.Error("remove sandbox", "backend", m.backend.Name(), "err", err)
	}
	if err := m.removeHostParts(ctx, s.info.ID); err != nil {
		log.Error("remove network and workspace", "err", err)
	}
	m.settle(s, final, failure)
	log.Info("session stopped", "state", final, "failure", failure)
}

// settle records that a session has ended, in state final, and starts
// its finalisation apart from the caller.
func (m *Manager) settle(s *sess, final State, failure string) {
	m.mu.Lock()
	s.info.State = final
	s.info.Failure = failure
	s.endedAt = time.Now()
	m.wakeLocked()
	if m.byAddr[s.addr] == s {
		delete(m.byAddr, s.addr)
	}
	s.record(string(final), map[string]any{"failure": failure})
	release := s.releaseProfile
	s.releaseProfile = nil
	m.mu.Unlock()
	if release != nil {
		release()
	}
	close(s.done)
	m.wg.Add(1)
	go m.finalise(s)
}

// finalise tells the observer the session is over, with its trail, once
// one of the Finalisers slots is free. A store that is away makes this
// wait; it never holds a stop, the reaper or the probe.
func (m *Manager) finalise(s *sess) {
	defer m.wg.Done()
	defer close(s.final)
	select {
	case m.finals <- struct{}{}:
		defer func() { <-m.finals }()
	case <-m.base.Done():
		// The trail file stays: the next gateway reports the session.
		return
	}
	m.ended(s)
}
