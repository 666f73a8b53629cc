package session

import (
	"context"
	"os"
	"sort"
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

// reap ends sessions past their TTL or idle timeout, probes their
// health and forgets ended sessions past their retention. It never waits
// for a teardown: each runs apart (stopAsync).
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
			m.sweep()
		case now := <-tick.C:
			var due []*sess
			var why []string
			m.mu.Lock()
			for _, s := range m.sessions {
				if s.info.State != StateRunning || s.claimFor != "" || s.rechecking {
					continue // a claim in progress settles it; a recheck, too
				}
				switch {
				case now.After(s.info.ExpiresAt):
					if _, ok := m.backend.(RecordWatcher); ok {
						// Its record first, apart from the loop: another
						// replica may have extended it.
						s.rechecking = true
						m.wg.Add(1)
						go m.reapUnlessExtended(s)
						continue
					}
					due, why = append(due, s), append(why, "ttl")
				case s.info.IdleTimeout > 0 && now.Sub(s.lastActive) > time.Duration(s.info.IdleTimeout)*time.Second:
					due, why = append(due, s), append(why, "idle timeout")
				}
			}
			m.mu.Unlock()
			for i, s := range due {
				m.log.Info("reaping session", "session", s.info.ID, "tenant", s.info.Tenant, "reason", why[i])
				m.stopAsync(s, StateStopped, "")
			}
			m.forget(now)
		}
	}
}

// forget drops ended, finalised sessions past the retention, and the
// oldest of them beyond MaxEnded, with their trail files: memory is
// bounded by the live sessions (and the few whose late events the store
// does not have yet). Their artifacts stay in the store.
func (m *Manager) forget(now time.Time) {
	m.mu.Lock()
	var ended []*sess
	for _, s := range m.sessions {
		// One whose events since the end are being stored stays until
		// they are: its file holds them.
		if s.finalised && !s.relogging {
			ended = append(ended, s)
		}
	}
	over := len(ended) - m.cfg.MaxEnded
	if over > 0 {
		sort.Slice(ended, func(i, j int) bool { return ended[i].endedAt.Before(ended[j].endedAt) })
	}
	var files []string
	for i, s := range ended {
		if i < over || now.Sub(s.endedAt) > m.cfg.Retention {
			delete(m.sessions, s.info.ID)
			if s.trail.path != "" {
				files = append(files, s.trail.path)
			}
		}
	}
	m.mu.Unlock()
	for _, f := range files {
		os.Remove(f)
	}
}

// reapUnlessExtended stops a session due for its TTL, under a backend
// whose records others write (RecordWatcher), unless its record, read
// again, says otherwise: an extension another replica stored, that the
// watch has not told yet or that a late write of this manager's hid, is
// the session's, and a stop asked is carried out as asked
// (recordChanged). Read within 2 s; a record that cannot be read, as
// before, does not keep it.
func (m *Manager) reapUnlessExtended(s *sess) {
	defer m.wg.Done()
	defer func() {
		m.mu.Lock()
		s.rechecking = false
		m.mu.Unlock()
	}()
	m.mu.Lock()
	sb := s.box
	m.mu.Unlock()
	if sb != nil {
		ctx, cancel := context.WithTimeout(m.base, 2*time.Second)
		rec, err := sb.Record(ctx)
		cancel()
		if err == nil {
			m.recordChanged(rec)
		}
	}
	m.mu.Lock()
	due := s.info.State == StateRunning && time.Now().After(s.info.ExpiresAt)
	m.mu.Unlock()
	if !due {
		m.log.Info("a session due for its TTL was extended or stopped through another gateway replica", "session", s.info.ID, "expires_at", s.info.ExpiresAt)
		return
	}
	m.log.Info("reaping session", "session", s.info.ID, "tenant", s.info.Tenant, "reason", "ttl")
	m.stopAsync(s, StateStopped, "")
}
