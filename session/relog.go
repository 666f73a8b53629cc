package session

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// TrailRestorer is an Observer that stores a finalised session's trail
// again, whole, in place of the log it stored at the end. The session
// is finalised, but a few things are still recorded in its trail after
// that (a review link issued or revoked). The reviewer reads the stored
// log, so those events must reach it.
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
	if !s.relogging {
		s.relogging = true
		go m.relog(s)
	}
}

// relog stores s's trail again until the store has every event in it,
// with backoff while the store is away. The marker stays while the
// store lacks any event, and goes once it has them all.
func (m *Manager) relog(s *sess) {
	for wait := finaliseBackoff; ; wait = min(2*wait, maxFinaliseBackoff) {
		m.mu.Lock()
		s.relog = false // an event recorded from here on asks again
		info, o := copyInfo(s.info), m.observer
		m.mu.Unlock()
		r, _ := o.(TrailRestorer)
		var err error
		// A trail read as empty (its file gone) would store a log
		// emptier than the one it replaces.
		if events := m.trailEvents(s); len(events) > 0 {
			ctx, cancel := context.WithTimeout(m.base, relogTimeout)
			err = r.StoreTrail(ctx, info, events)
			cancel()
		}
		m.mu.Lock()
		if err != nil {
			s.relog = true
		}
		if !s.relog {
			s.relogging = false
			os.Remove(m.trailPath(info.Tenant, info.ID) + relogSuffix)
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
		if err == nil {
			continue // events came while it was stored
		}
		m.log.Warn("the audit trail's events since the session's end are not stored yet; retrying", "session", info.ID, "in", wait, "err", err)
		select {
		case <-m.base.Done():
			m.mu.Lock()
			s.relogging = false
			m.mu.Unlock()
			return // the marker stays: the next gateway stores the trail
		case <-time.After(wait):
		}
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
