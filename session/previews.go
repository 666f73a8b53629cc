package session

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"
)

// Track registers a live connection of a preview on its session, so that
// the session's end or the preview's revocation closes it. The returned
// func unregisters it.
func (m *Manager) Track(tenant, id, preview string, c io.Closer) (func(), error) {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.info.State != StateRunning {
		return nil, publicf(ErrConflict, "the session is "+string(s.info.State), nil)
	}
	if _, ok := s.revoked[preview]; ok {
		return nil, publicf(ErrNotFound, "the preview was revoked", nil)
	}
	t := &tracked{preview: preview, c: c}
	s.conns[t] = struct{}{}
	return func() {
		m.mu.Lock()
		delete(s.conns, t)
		m.mu.Unlock()
	}, nil
}

// closeConns closes the session's tracked connections, all of them or
// those of one preview. The caller holds m.mu.
func closeConns(s *sess, preview string) {
	for t := range s.conns {
		if preview == "" || t.preview == preview {
			go t.c.Close()
			delete(s.conns, t)
		}
	}
}

// RevokePreview marks a preview revoked until its expiry and closes its
// live connections. Revocations are stored on the container, so they
// survive a gateway restart.
func (m *Manager) RevokePreview(ctx context.Context, tenant, id, preview string, until time.Time) error {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return err
	}
	m.mu.Lock()
	s.revoked[preview] = until
	closeConns(s, preview)
	c := s.container
	m.mu.Unlock()
	if c != nil {
		if _, err := c.SetLabels(m.ctx(ctx), map[string]string{labelRevoked + preview: strconv.FormatInt(until.Unix(), 10)}); err != nil {
			return fmt.Errorf("store revocation: %w", err)
		}
	}
	return nil
}

// Revoked tells whether a preview of the session was revoked.
func (m *Manager) Revoked(id, preview string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return false
	}
	_, r := s.revoked[preview]
	return r
}
