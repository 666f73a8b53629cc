package session

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Event is one entry of a session's audit trail. Fields never hold
// secrets: callers record names and sizes, not values.
type Event struct {
	Time   time.Time      `json:"time"`
	Type   string         `json:"type"`
	Fields map[string]any `json:"fields,omitempty"`
}

// maxEvents bounds a session's in-memory trail; older entries are
// counted, not kept.
const maxEvents = 10000

// Record appends an event to the session's audit trail.
func (m *Manager) Record(id, typ string, fields map[string]any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return
	}
	s.record(typ, fields)
}

// record appends an event; the caller holds m.mu. Each event is also
// appended to the session's trail file on the host, so a restarted
// gateway keeps the trail of the sessions it adopts.
func (s *sess) record(typ string, fields map[string]any) {
	if len(s.events) >= maxEvents {
		s.dropped++
		return
	}
	ev := Event{Time: time.Now().UTC(), Type: typ, Fields: fields}
	s.events = append(s.events, ev)
	if s.trail != nil {
		if line, err := json.Marshal(ev); err == nil {
			s.trail.Write(append(line, '\n'))
		}
	}
}

func (m *Manager) trailPath(tenant, id string) string {
	return filepath.Join(m.cfg.StateDir, "audit", tenant, id+".jsonl")
}

// openTrail opens (appending) the session's trail file and returns the
// events already in it.
func (m *Manager) openTrail(tenant, id string) (*os.File, []Event) {
	p := m.trailPath(tenant, id)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		m.log.Error("audit trail dir", "err", err)
		return nil, nil
	}
	var old []Event
	if f, err := os.Open(p); err == nil {
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() && len(old) < maxEvents {
			var ev Event
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				old = append(old, ev)
			}
		}
		f.Close()
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		m.log.Error("audit trail file", "session", id, "err", err)
		return nil, old
	}
	return f, old
}

// closeTrail closes and removes the trail file; the observer has stored
// the trail by then. The caller holds m.mu.
func (m *Manager) closeTrail(s *sess) {
	if s.trail != nil {
		s.trail.Close()
		s.trail = nil
	}
	os.Remove(m.trailPath(s.info.Tenant, s.info.ID))
}

// Observer hears of sessions that became ready and of sessions that
// ended, with their whole audit trail. The recorder, the download watcher
// and the audit log store hang off it. SessionEnded runs before a stop
// returns, so a DELETE answers once the artifacts are final.
type Observer interface {
	SessionRunning(info Info, ep Endpoint)
	SessionEnded(info Info, events []Event)
}

// Observe sets the observer and tells it of the sessions already running
// (those adopted after a restart).
func (m *Manager) Observe(o Observer) {
	m.mu.Lock()
	m.observer = o
	m.mu.Unlock()
	for _, s := range m.running() {
		m.mu.Lock()
		info, ep := copyInfo(s.info), s.ep
		m.mu.Unlock()
		o.SessionRunning(info, ep)
	}
	m.endOrphanTrails(o)
}

// endOrphanTrails reports the sessions that ended while no gateway ran:
// their trail files are left, their sessions are not.
func (m *Manager) endOrphanTrails(o Observer) {
	files, _ := filepath.Glob(filepath.Join(m.cfg.StateDir, "audit", "*", "s-*.jsonl"))
	for _, f := range files {
		tenant := filepath.Base(filepath.Dir(f))
		id := strings.TrimSuffix(filepath.Base(f), ".jsonl")
		m.mu.Lock()
		_, live := m.sessions[id]
		m.mu.Unlock()
		if live || !sessionIDPattern.MatchString(id) {
			continue
		}
		s := &sess{info: Info{ID: id, Tenant: tenant, State: StateStopped, Labels: map[string]string{},
			Failure: "the session ended while no gateway was running"}}
		trail, old := m.openTrail(tenant, id)
		s.trail, s.events = trail, old
		m.mu.Lock()
		s.record("ended_unobserved", map[string]any{"note": "the session ended while no gateway was running"})
		m.mu.Unlock()
		o.SessionEnded(copyInfo(s.info), s.events)
		m.mu.Lock()
		m.closeTrail(s)
		m.mu.Unlock()
	}
}

// ended tells the observer a session is over and drops its trail file.
func (m *Manager) ended(s *sess) {
	m.mu.Lock()
	o := m.observer
	info := copyInfo(s.info)
	events := append([]Event(nil), s.events...)
	m.mu.Unlock()
	if o != nil {
		o.SessionEnded(info, events)
	}
	m.mu.Lock()
	m.closeTrail(s)
	m.mu.Unlock()
}

// Events returns the session's audit trail, oldest first.
func (m *Manager) Events(tenant, id string) ([]Event, error) {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Event, len(s.events))
	copy(out, s.events)
	return out, nil
}
