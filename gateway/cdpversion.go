package gateway

import (
	"context"
	"sync"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/session"
)

// versions keeps each session's /json/version answer, so that a client's
// discovery and its upgrade to the browser target cost no round trip into
// the sandbox (under gVisor each is tens of milliseconds). A kept answer
// is the session's word as much as a fresh one, and is checked the same
// way each time it is used. It goes stale when Chromium restarts (its
// browser id changes): an upgrade to an id the kept answer does not have,
// or one whose upstream dial fails, fetches again.
type versions struct {
	mu sync.Mutex
	// m holds the answer last fetched; a nil one means fetch, whatever
	// the session's readiness answer was.
	m map[string][]byte
}

// browserVersion returns the session's /json/version: the one kept, the
// one it gave at readiness, or a fresh one.
func (s *Server) browserVersion(ctx context.Context, tenant, id string, ep session.Endpoint) ([]byte, error) {
	s.versions.mu.Lock()
	body, known := s.versions.m[id]
	s.versions.mu.Unlock()
	if body != nil {
		return body, nil
	}
	if !known && ep.Version != nil {
		return ep.Version, nil
	}
	return s.fetchVersion(ctx, tenant, id, ep)
}

// fetchVersion asks the session's Chromium and keeps its answer.
func (s *Server) fetchVersion(ctx context.Context, tenant, id string, ep session.Endpoint) ([]byte, error) {
	body, err := browser.Version(ctx, ep.CDP)
	if err != nil {
		return nil, err
	}
	s.keepVersion(tenant, id, body)
	return body, nil
}

// staleVersion makes the next use of the session's answer fetch it.
func (s *Server) staleVersion(tenant, id string) { s.keepVersion(tenant, id, nil) }

// keepVersion keeps body (nil: fetch next time) for a session that is
// still running. The check is made under the lock that forgetVersion
// takes, and a session is no longer running when it is finalised, so
// nothing is kept for a session that ended.
func (s *Server) keepVersion(tenant, id string, body []byte) {
	s.versions.mu.Lock()
	defer s.versions.mu.Unlock()
	if s.live.running(tenant, id) {
		s.versions.m[id] = body
	}
}

// forgetVersion drops what is kept for an ended session.
func (s *Server) forgetVersion(id string) {
	s.versions.mu.Lock()
	delete(s.versions.m, id)
	s.versions.mu.Unlock()
	s.exits.mu.Lock()
	delete(s.exits.reported, id)
	s.exits.mu.Unlock()
}

// browserExits counts the browsers that exited under running sessions.
type browserExits struct {
	mu       sync.Mutex
	reported map[string]string // session id: the browser id last reported
	checking map[string]bool   // sessions whose browser is being checked: true, once more
	total    int64
}
