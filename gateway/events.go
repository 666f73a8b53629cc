package gateway

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
)

// events serves the session's audit trail.
func (s *Server) events(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	evs, err := s.sessions.Events(tenantOf(c), id)
	if err == nil {
		return c.JSON(fiber.Map{"events": evs})
	}
	// A session this gateway no longer holds: its stored trail.
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	logs, lerr := s.store.ListKind(ctx, tenantOf(c), id, recordings.KindLog)
	if lerr != nil || len(logs) == 0 {
		return err
	}
	var b bytes.Buffer
	if ferr := s.store.Fetch(ctx, tenantOf(c), logs[len(logs)-1].ID, &b); ferr != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: ferr}
	}
	stored := []session.Event{}
	dec := json.NewDecoder(&b)
	for dec.More() {
		var ev session.Event
		if dec.Decode(&ev) != nil {
			break
		}
		stored = append(stored, ev)
	}
	return c.JSON(fiber.Map{"events": stored})
}
