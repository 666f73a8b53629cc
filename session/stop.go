package session

import (
	"context"
	"time"
)

// Delete stops a session and returns its final state. Deleting a stopped
// session returns it unchanged.
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
	m.stop(m.ctx(ctx), s, StateStopped, "")
	return m.snapshot(s), nil
}

// stop tears a session down: live connections, task, container, snapshot,
// network namespace and workspace. It is idempotent.
func (m *Manager) stop(ctx context.Context, s *sess, final State, failure string) {
	m.mu.Lock()
	if s.info.State != StateRunning {
		m.mu.Unlock()
		<-s.done
		return
	}
	s.info.State = StateStopping
	closeConns(s, "")
	c := s.container
	m.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	log := m.log.With("session", s.info.ID, "tenant", s.info.Tenant)
	if err := removeContainer(ctx, c); err != nil {
		log.Error("remove container", "err", err)
	}
	if err := m.net.remove(ctx, s.info.ID); err != nil {
		log.Error("remove network", "err", err)
	}
	if err := m.removeWorkspace(s.info.ID); err != nil {
		log.Error("remove workspace", "err", err)
	}
	m.mu.Lock()
	s.info.State = final
	s.info.Failure = failure
	s.record(string(final), map[string]any{"failure": failure})
	m.mu.Unlock()
	m.ended(s)
	close(s.done)
	log.Info("session stopped", "state", final, "failure", failure)
}
