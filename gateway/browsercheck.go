package gateway

import (
	"context"
	"time"

	"github.com/sandgate/sandgate/browser"
)

// checkBrowser looks at a session's browser after one of its CDP
// connections was closed from the browser's side. When the browser no
// longer answers, or another one has taken its place (the session starts
// a new Chromium when one exits, crashed or closed), the exit goes into
// the session's audit trail, once per browser, and is counted. Its
// clients were told by the closed connection; they reconnect through the
// same preview and reach the new browser.
func (s *Server) checkBrowser(tenant, id string) {
	// One check at a time per session (a browser that exits closes all
	// its connections at once); a close while one runs makes it look
	// once more when it is done.
	s.exits.mu.Lock()
	if _, running := s.exits.checking[id]; running {
		s.exits.checking[id] = true
		s.exits.mu.Unlock()
		return
	}
	s.exits.checking[id] = false
	s.exits.mu.Unlock()
	for {
		s.checkBrowserOnce(tenant, id)
		s.exits.mu.Lock()
		again := s.exits.checking[id]
		if !again {
			delete(s.exits.checking, id)
		} else {
			s.exits.checking[id] = false
		}
		s.exits.mu.Unlock()
		if !again {
			return
		}
	}
}

func (s *Server) checkBrowserOnce(tenant, id string) {
	ep, err := s.sessions.Endpoint(tenant, id)
	if err != nil {
		return // the session ended: its end is in the trail already
	}
	s.versions.mu.Lock()
	kept, known := s.versions.m[id]
	s.versions.mu.Unlock()
	if !known {
		kept = ep.Version
	}
	before, err := browser.VersionID(kept)
	if err != nil || before == "" {
		return // nothing to compare with
	}
	// Chromium takes a moment to go; and a new one, to answer.
	var now string
	var last error
	for i := range 3 {
		if i > 0 {
			time.Sleep(time.Second)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		body, err := browser.Version(ctx, ep.CDP)
		cancel()
		if err == nil {
			now, err = browser.VersionID(body)
		}
		if last = err; err == nil && now != before {
			break
		}
	}
	if last == nil && now == before {
		return // one target closed (a page, say); the browser is the same
	}
	s.exits.mu.Lock()
	if s.exits.reported[id] == before {
		s.exits.mu.Unlock()
		return
	}
	// Kept only while the session runs (forgetVersion drops it at the
	// end; a check that ends after that keeps nothing).
	if _, err := s.sessions.Endpoint(tenant, id); err == nil {
		s.exits.reported[id] = before
	}
	s.exits.total++
	s.exits.mu.Unlock()
	s.staleVersion(tenant, id)
	fields := map[string]any{"browser": before}
	if last == nil {
		fields["replaced_by"] = now
	} else {
		fields["answering"] = false
	}
	s.sessions.Record(id, "browser_exited", fields)
	s.log.Warn("the session's browser exited (crashed or closed)", "session", id, "tenant", tenant, "browser", before, "replaced_by", now)
}
