package session

import (
	"context"
	"net"
	"time"
)

// Health probing: a session whose VNC port stops accepting connections
// for probeMisses probes in a row has lost its sandbox (a gVisor sandbox
// killed by its memory limit, say, whose task containerd still reports
// running); it is stopped and reported failed.
const (
	probeEvery  = 3 * time.Second
	probeMisses = 3
)

func (m *Manager) probe() {
	for _, s := range m.running() {
		m.mu.Lock()
		frozen := s.frozen
		m.mu.Unlock()
		if frozen {
			// A frozen pooled session cannot answer; its claim checks
			// that it does once thawed.
			continue
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			ctx, cancel := context.WithTimeout(m.base, 2*time.Second)
			defer cancel()
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", s.ep.VNC.String())
			if c != nil {
				c.Close()
			}
			if m.base.Err() != nil {
				return
			}
			m.mu.Lock()
			if err == nil {
				s.misses = 0
				m.mu.Unlock()
				return
			}
			s.misses++
			dead := s.misses >= probeMisses && s.info.State == StateRunning
			m.mu.Unlock()
			if dead {
				m.log.Warn("session stopped answering", "session", s.info.ID, "tenant", s.info.Tenant, "err", err)
				m.stopAsync(s, StateFailed, "the session stopped answering: its display server is gone (the sandbox may have run out of memory)")
			}
		}()
	}
}
