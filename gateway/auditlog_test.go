package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/session"
)

// A stored log keeps every line it had, in its order, and gets only the
// events it lacks, after them; events it holds (a time and a type, read
// back from JSON or straight from the clock) are not added again.
func TestMergeLog(t *testing.T) {
	t0 := time.Now() // with a monotonic reading, as a live event has
	ev := func(i int, typ string) session.Event {
		return session.Event{Time: t0.Add(time.Duration(i) * time.Microsecond), Type: typ}
	}
	var old bytes.Buffer
	for _, e := range []session.Event{ev(0, "created"), ev(1, "download"), ev(1, "download"), ev(2, "stopped")} {
		json.NewEncoder(&old).Encode(e)
	}
	stored := old.String()
	types := func(b []byte) []string {
		var out []string
		for dec := json.NewDecoder(bytes.NewReader(b)); dec.More(); {
			var e session.Event
			if err := dec.Decode(&e); err != nil {
				t.Fatal(err)
			}
			out = append(out, e.Type)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		events []session.Event
		added  int
	}{
		// The control: a trail with an event the log lacks.
		{"the whole trail and one more", []session.Event{ev(0, "created"), ev(1, "download"), ev(1, "download"), ev(2, "stopped"), ev(3, "preview_issued")}, 1},
		{"a trail read short (its file gone)", []session.Event{ev(3, "preview_issued")}, 1},
		{"nothing new", []session.Event{ev(2, "stopped"), ev(0, "created")}, 0},
		{"an event held twice, seen three times", []session.Event{ev(1, "download"), ev(1, "download"), ev(1, "download")}, 1},
	} {
		merged, added := mergeLog([]byte(stored), tc.events)
		if added != tc.added {
			t.Errorf("%s: %d added, want %d", tc.name, added, tc.added)
		}
		if !bytes.HasPrefix(merged, []byte(stored)) {
			t.Errorf("%s: the stored log's lines were changed", tc.name)
		}
		if got := len(types(merged)); got != 4+tc.added {
			t.Errorf("%s: %d events, want %d", tc.name, got, 4+tc.added)
		}
	}
	if merged, added := mergeLog(nil, []session.Event{ev(0, "created")}); added != 1 || len(types(merged)) != 1 {
		t.Errorf("no stored log: %d added, %q", added, merged)
	}
	// A last line without its newline is kept whole, and not joined.
	merged, _ := mergeLog([]byte(`{"time":"2026-01-01T00:00:00Z","type":"created"}`), []session.Event{ev(3, "stopped")})
	if got := types(merged); len(got) != 2 {
		t.Errorf("a log without its last newline: %v", got)
	}
}

// TestBoundedBuffer: io.Copy into a boundedBuffer stops at its bound
// (from a reader with no WriteTo, as a store's object is); within it,
// the bytes are all there (the control).
func TestBoundedBuffer(t *testing.T) {
	src := func(n int) io.Reader { return io.LimitReader(strings.NewReader(strings.Repeat("x", n)), int64(n)) }
	b := boundedBuffer{max: 10}
	if n, err := io.Copy(&b, src(1000)); err == nil || b.buf.Len() > 10 {
		t.Errorf("1000 bytes into a buffer of 10: %d copied, %d held, %v", n, b.buf.Len(), err)
	}
	b = boundedBuffer{max: 1000}
	if n, err := io.Copy(&b, src(1000)); err != nil || n != 1000 || b.buf.Len() != 1000 {
		t.Errorf("1000 bytes into a buffer of 1000: %d copied, %d held, %v", n, b.buf.Len(), err)
	}
}
