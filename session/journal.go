package session

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"time"
)

// TrailStore keeps each session's audit trail off the gateway's host
// while the session runs, so that a gateway that loses its host (a
// replica on a node that died, a host disk gone) loses at most the last
// flush interval of it. The trail is stored as pieces: the piece at
// start holds the trail's events from index start on, one JSON object a
// line. The artifact store (recordings.Store) is one.
type TrailStore interface {
	// PutTrail stores one piece; storing a piece again replaces it.
	PutTrail(ctx context.Context, tenant, id string, start int, lines []byte) error
	// ReadTrail calls each with the session's pieces, in order of start.
	ReadTrail(ctx context.Context, tenant, id string, each func(start int, r io.Reader) error) error
	// DropTrail removes the session's pieces.
	DropTrail(ctx context.Context, tenant, id string) error
}

// Bounds of the stored trail.
const (
	// DefaultTrailFlush is how long an event waits, at most, before its
	// piece is written, unless the store is away.
	DefaultTrailFlush = time.Second
	maxPieceEvents    = 1000
	// journalBackoff bounds the wait between attempts while the store is
	// away.
	maxJournalBackoff = 30 * time.Second
	// trailReadTimeout bounds reading a session's stored trail.
	trailReadTimeout = 20 * time.Second
)

// journalOn tells whether the manager stores trails as they are written.
func (m *Manager) journalOn() bool { return m.cfg.Trails != nil }

// kickJournal asks the journal to flush soon; it never blocks, so it may
// be called with m.mu held.
func (m *Manager) kickJournal() {
	select {
	case m.journalKick <- struct{}{}:
	default:
	}
}

// journal writes the sessions' new events to the store, a flush interval
// after the first of them, and again with backoff while the store is away.
func (m *Manager) journal() {
	defer m.wg.Done()
	wait := m.cfg.TrailFlush
	retry := time.Duration(0)
	for {
		var again <-chan time.Time
		if retry > 0 {
			again = time.After(retry)
		}
		select {
		case <-m.base.Done():
			return
		case <-m.journalKick:
		case <-again:
		}
		// Gather what comes in the interval into one piece.
		select {
		case <-m.base.Done():
			return
		case <-time.After(wait):
		}
		if m.flushTrails(m.base) {
			retry = 0
		} else {
			retry = min(max(2*retry, time.Second), maxJournalBackoff)
		}
	}
}

// flushTrails writes every session's pending events; false if any could
// not be written.
func (m *Manager) flushTrails(ctx context.Context) bool {
	m.mu.Lock()
	var work []*sess
	for _, s := range m.sessions {
		if s.trail.journal && (len(s.trail.pending) > 0 || !s.trail.synced) {
			work = append(work, s)
		}
	}
	m.mu.Unlock()
	ok := true
	for _, s := range work {
		if err := m.flushTrail(ctx, s); err != nil {
			ok = false
			m.log.Warn("audit trail not stored yet; retrying", "session", s.info.ID, "err", err)
		}
	}
	return ok
}

// flushTrail writes one session's pending events as pieces. One flush at
// a time (journalMu), so pieces are written in order and a session's
// pieces are not written after they were dropped.
func (m *Manager) flushTrail(ctx context.Context, s *sess) error {
	m.journalMu.Lock()
	defer m.journalMu.Unlock()
	m.mu.Lock()
	if !s.trail.journal {
		m.mu.Unlock()
		return nil
	}
	if !s.trail.synced {
		m.mu.Unlock()
		if err := m.syncTrail(ctx, s); err != nil {
			return err
		}
		m.mu.Lock()
	}
	tenant, id := s.info.Tenant, s.info.ID
	for s.trail.journal && len(s.trail.pending) > 0 {
		start, batch := s.trail.stored, s.trail.pending[:min(len(s.trail.pending), maxPieceEvents)]
		m.mu.Unlock()
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		for _, ev := range batch {
			enc.Encode(ev)
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := m.cfg.Trails.PutTrail(pctx, tenant, id, start, b.Bytes())
		cancel()
		if err != nil {
			return err
		}
		m.mu.Lock()
		s.trail.stored += len(batch)
		s.trail.pending = append([]Event(nil), s.trail.pending[len(batch):]...)
	}
	m.mu.Unlock()
	return nil
}

// readStoredTrail reads what the store holds of a session's trail: its
// pieces in order, up to the first gap, within the trail's bounds.
func (m *Manager) readStoredTrail(ctx context.Context, tenant, id string) ([]Event, error) {
	ctx, cancel := context.WithTimeout(ctx, trailReadTimeout)
	defer cancel()
	var out []Event
	gap := false
	err := m.cfg.Trails.ReadTrail(ctx, tenant, id, func(start int, r io.Reader) error {
		if gap || start != len(out) {
			// A piece that does not follow on: what comes after a gap
			// cannot be placed, so the trail stops at it.
			gap = true
			return nil
		}
		out = append(out, readEventsFrom(r, trailLimit()-len(out))...)
		return nil
	})
	if gap {
		m.log.Warn("the stored audit trail has a gap; read up to it", "session", id, "events", len(out))
	}
	return out, err
}

// syncTrail matches an adopted session's trail with what the store has
// of it. The store holds a prefix of the trail: when the host file holds
// more (the last interval before a gateway died), the rest is pending;
// when it holds less (a gateway on another host, or a lost file), the
// store's events are written into the host file first.
func (m *Manager) syncTrail(ctx context.Context, s *sess) error {
	m.mu.Lock()
	tenant, id := s.info.Tenant, s.info.ID
	m.mu.Unlock()
	stored, err := m.readStoredTrail(ctx, tenant, id)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t := &s.trail
	have := t.events()
	if len(stored) > len(have) {
		// The host is missing the end the store has. What was
		// recorded here since (the adoption) follows it.
		merged := append(append([]Event(nil), stored...), have[min(len(have), t.fileBase):]...)
		t.rewrite(merged)
		t.stored, t.pending = len(stored), append([]Event(nil), merged[len(stored):]...)
	} else {
		t.stored, t.pending = len(stored), append([]Event(nil), have[len(stored):]...)
	}
	t.synced = true
	return nil
}

// rewrite replaces the trail's host file (or memory) with events and
// counts them again.
func (t *trail) rewrite(events []Event) {
	t.mem, t.kept, t.noisy = nil, 0, map[string]int{}
	if t.path != "" {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		for _, ev := range events {
			enc.Encode(ev)
		}
		if os.WriteFile(t.path+".new", b.Bytes(), 0o600) != nil || os.Rename(t.path+".new", t.path) != nil {
			os.Remove(t.path + ".new")
			t.mem = append(t.mem, events...)
		}
	} else {
		t.mem = append(t.mem, events...)
	}
	t.count(events)
}

// dropStoredTrail removes a finalised session's pieces: the log artifact
// holds the whole trail now.
func (m *Manager) dropStoredTrail(s *sess) {
	if !m.journalOn() {
		return
	}
	m.journalMu.Lock()
	defer m.journalMu.Unlock()
	m.mu.Lock()
	s.trail.journal, s.trail.pending = false, nil
	tenant, id := s.info.Tenant, s.info.ID
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(m.base, 30*time.Second)
	defer cancel()
	if err := m.cfg.Trails.DropTrail(ctx, tenant, id); err != nil {
		m.log.Warn("the stored pieces of a finalised audit trail were not removed", "session", id, "err", err)
	}
}

// lastFlush writes what is pending before the manager closes, within a
// short bound: the next gateway finds it in the store even if this host
// is gone by then.
func (m *Manager) lastFlush() {
	if !m.journalOn() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m.flushTrails(ctx)
}

// recoverStoredTrail gives a sandbox that was not adopted (it ended while
// no gateway ran) a host trail file from the store when the host has
// none, so that it is reported and finalised like any ended session's.
func (m *Manager) recoverStoredTrail(ctx context.Context, sb Sandbox) {
	if !m.journalOn() {
		return
	}
	labels, err := sb.Record(ctx)
	if err != nil || labels[labelPool] != "" {
		return
	}
	info, err := infoFromLabels(labels)
	if err != nil {
		return
	}
	p := m.trailPath(info.Tenant, info.ID)
	if _, err := os.Stat(p); err == nil {
		return
	}
	events, err := m.readStoredTrail(ctx, info.Tenant, info.ID)
	if err != nil || len(events) == 0 {
		if err != nil {
			m.log.Warn("the stored audit trail of an ended session could not be read", "session", info.ID, "err", err)
		}
		return
	}
	t := m.openTrail(info.Tenant, info.ID)
	t.rewrite(events)
}

func trailLimit() int { return maxEvents + len(noisyEvents)*maxNoisy + maxDropTypes + 16 }
