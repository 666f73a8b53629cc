package session

import (
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

// record appends an event; the caller holds m.mu.
func (s *sess) record(typ string, fields map[string]any) {
	if len(s.events) >= maxEvents {
		s.dropped++
		return
	}
	s.events = append(s.events, Event{Time: time.Now().UTC(), Type: typ, Fields: fields})
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
