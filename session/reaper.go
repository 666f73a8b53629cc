package session

import (
	"time"
)

// running returns the sessions that are running now.
func (m *Manager) running() []*sess {
	m.mu.Lock()
	defer m.mu.Unlock()
	var live []*sess
	for _, s := range m.sessions {
		if s.info.State == StateRunning {
			live = append(live, s)
		}
	}
	return live
}

// reap ends sessions past their TTL or idle timeout, and probes their
// health.
func (m *Manager) reap() {
	defer m.wg.Done()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	health := time.NewTicker(probeEvery)
	defer health.Stop()
	for {
		select {
		case <-m.base.Done():
			return
		case <-health.C:
			m.probe()
		case now := <-tick.C:
			var due []*sess
			var why []string
			m.mu.Lock()
			for _, s := range m.sessions {
				if s.info.State != StateRunning {
					continue
				}
				switch {
				case now.After(s.info.ExpiresAt):
					due, why = append(due, s), append(why, "ttl")
				case s.info.IdleTimeout > 0 && now.Sub(s.lastActive) > time.Duration(s.info.IdleTimeout)*time.Second:
					due, why = append(due, s), append(why, "idle timeout")
				}
			}
			m.mu.Unlock()
			for i, s := range due {
				m.log.Info("reaping session", "session", s.info.ID, "tenant", s.info.Tenant, "reason", why[i])
				m.stop(m.base, s, StateStopped, "")
			}
		}
	}
}
