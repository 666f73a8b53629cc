package session

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// TrailRestorer is an Observer that stores a finalised session's trail
// again. The session is finalised, but a few things are still recorded
// in its trail after that (a review link issued or revoked, a preview
// connection cut as it stopped). The reviewer reads the stored log, so
// those events must reach it. StoreTrail adds to the stored log the
// events it lacks and never removes one: a trail read short (its file
// gone) cannot make the log shorter.
type TrailRestorer interface {
	StoreTrail(ctx context.Context, info Info, events []Event) error
}

// relogSuffix marks a finalised trail whose stored log lacks events
// recorded since. The marker is an empty file beside the trail's. It
// outlives the gateway, so the next one stores the trail (relogLeft)
// before it drops the ended trails.
const relogSuffix = ".relog"

// relogTimeout bounds one attempt to store a trail again.
const relogTimeout = 30 * time.Second

// lateEvent notes that s's stored log lacks an event just recorded, and
// has it stored again; the caller holds m.mu.
func (m *Manager) lateEvent(s *sess) {
	if _, ok := m.observer.(TrailRestorer); !ok {
		return
	}
	if !s.relog {
		s.relog = true
		if f, err := os.Create(m.trailPath(s.info.Tenant, s.info.ID) + relogSuffix); err == nil {
			f.Close()
		}
	}
	if !s.relogging && m.base.Err() == nil {
		s.relogging = true
		m.wg.Add(1)
		go m.relog(s)
	}
}

// relogOnce stores s's trail again if an event is waiting for it. The
// marker goes once the store has every event; stored says whether it
// has.
func (m *Manager) relogOnce(ctx context.Context, s *sess) (stored bool, err error) {
	s.relogMu.Lock()
	defer s.relogMu.Unlock()
	m.mu.Lock()
	if !s.relog {
		m.mu.Unlock()
		return true, nil
	}
	s.relog = false // an event recorded from here on asks again
	info := copyInfo(s.info)
	r, ok := m.observer.(TrailRestorer)
	m.mu.Unlock()
	if ok {
		err = r.StoreTrail(ctx, info, m.trailEvents(s))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		s.relog = true
		return false, err
	}
	if s.relog {
		return false, nil // events came while it was stored
	}
	os.Remove(m.trailPath(info.Tenant, info.ID) + relogSuffix)
	return true, nil
}

// relog stores s's trail again until the store has every event in it,
// with backoff while the store is away. The marker stays while the
// store lacks any event.
func (m *Manager) relog(s *sess) {
	defer m.wg.Done()
	defer func() {
		m.mu.Lock()
		s.relogging = false
		m.mu.Unlock()
	}()
	for wait := finaliseBackoff; ; {
		ctx, cancel := context.WithTimeout(m.base, relogTimeout)
		stored, err := m.relogOnce(ctx, s)
		cancel()
		if stored {
			m.mu.Lock()
			again := s.relog
			if !again {
				s.relogging = false
			}
			m.mu.Unlock()
			if !again {
				return
			}
			continue
		}
		if err == nil {
			continue // events came while it was stored
		}
		m.log.Warn("the audit trail's events since the session's end are not stored yet; retrying", "session", s.info.ID, "in", wait, "err", err)
		select {
		case <-m.base.Done():
			return // the marker stays: the next gateway stores the trail
		case <-time.After(wait):
		}
		wait = min(2*wait, maxFinaliseBackoff)
	}
}

// relogLeft stores the trails a previous gateway finalised and had
// events added to after that, but did not store again before it
// stopped. Then their files go, as every ended trail's does. A trail
// that cannot be stored now stays for the next start.
func (m *Manager) relogLeft(o Observer) {
	r, ok := o.(TrailRestorer)
	markers, _ := filepath.Glob(filepath.Join(m.cfg.StateDir, "audit", "*", "s-*.jsonl"+relogSuffix))
	for _, marker := range markers {
		path := strings.TrimSuffix(marker, relogSuffix)
		tenant, id := filepath.Base(filepath.Dir(path)), strings.TrimSuffix(filepath.Base(path), ".jsonl")
		m.mu.Lock()
		_, live := m.sessions[id]
		m.mu.Unlock()
		if live {
			continue // the session is this gateway's: its trail is
		}
		if events := readTrail(path + endedSuffix); ok && len(events) > 0 {
			ctx, cancel := context.WithTimeout(m.base, relogTimeout)
			err := r.StoreTrail(ctx, Info{ID: id, Tenant: tenant, State: StateStopped}, events)
			cancel()
			if err != nil {
				m.log.Error("the audit trail's events since the session's end were not stored; kept for the next start", "session", id, "err", err)
				continue
			}
		}
		os.Remove(path + endedSuffix)
		os.Remove(marker)
	}
}
