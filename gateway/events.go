package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	stored, found, serr := s.storedEvents(ctx, tenantOf(c), id)
	if serr != nil {
		return serr
	}
	if !found {
		return err
	}
	return c.JSON(fiber.Map{"events": stored})
}

// storedEvents is session id's trail as its stored log has it, and
// whether there is one (a 503 when the store cannot say).
func (s *Server) storedEvents(ctx context.Context, tenant, id string) ([]session.Event, bool, error) {
	if s.store == nil {
		return nil, false, &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable"}
	}
	logs, err := s.store.ListKind(ctx, tenant, id, recordings.KindLog)
	if errors.Is(err, recordings.ErrNotFound) || err == nil && len(logs) == 0 {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
	}
	// Read whole into memory: a few at a time (apart from StoreTrail's
	// merges, which a reader cannot hold up), each within what a log
	// may hold.
	select {
	case s.logReads <- struct{}{}:
		defer func() { <-s.logReads }()
	case <-ctx.Done():
		return nil, false, &apiError{status: 503, code: "unavailable", msg: "too many stored audit logs are being read now; retry", err: ctx.Err()}
	}
	b := boundedBuffer{max: maxLogMerge}
	if err := s.store.Fetch(ctx, tenant, logs[len(logs)-1].ID, &b); err != nil {
		return nil, false, &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
	}
	stored := []session.Event{}
	dec := json.NewDecoder(&b.buf)
	for dec.More() {
		var ev session.Event
		if dec.Decode(&ev) != nil {
			break
		}
		stored = append(stored, ev)
	}
	return stored, true, nil
}

// boundedBuffer is a buffer that takes at most max bytes, and fails past
// them. (It has Write alone: an embedded bytes.Buffer's ReadFrom would
// let io.Copy past the bound.)
type boundedBuffer struct {
	buf bytes.Buffer
	max int
}

var errTooLarge = errors.New("larger than the gateway reads")

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if b.buf.Len()+len(p) > b.max {
		return 0, errTooLarge
	}
	return b.buf.Write(p)
}
