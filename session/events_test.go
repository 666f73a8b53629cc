package session

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func testManager(t *testing.T) *Manager {
	t.Helper()
	return &Manager{
		cfg: Config{StateDir: t.TempDir(), Retention: time.Hour, MaxEnded: 10}, log: slog.New(slog.DiscardHandler),
		sessions: map[string]*sess{}, byAddr: nil, finals: make(chan struct{}, 2),
	}
}

func count(evs []Event, typ string) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

// A flood of noisy events is capped and marked; the events after it are
// kept, and the summary counts what was not.
func TestTrailFloodKeepsLaterEvents(t *testing.T) {
	m := testManager(t)
	tr := m.openTrail("acme", "s-0123456789abcdef")
	now := time.Now()
	const flood = 5000
	for i := range flood {
		tr.record(now, "egress_denied", map[string]any{"host": fmt.Sprintf("h%d.example", i)})
	}
	tr.record(now, "exec", map[string]any{"argv": []string{"id"}})
	tr.record(now, "download", map[string]any{"name": "x.pdf"})
	tr.summarise(now)
	evs := tr.events()
	if got := count(evs, "egress_denied"); got != maxNoisy {
		t.Errorf("kept %d egress_denied, want %d", got, maxNoisy)
	}
	if count(evs, "exec") != 1 || count(evs, "download") != 1 {
		t.Errorf("exec or download missing after the flood")
	}
	if count(evs, "audit_truncated") != 1 {
		t.Errorf("want one audit_truncated marker, got %d", count(evs, "audit_truncated"))
	}
	var sum *Event
	for i := range evs {
		if evs[i].Type == "audit_summary" {
			sum = &evs[i]
		}
	}
	if sum == nil {
		t.Fatal("no audit_summary")
	}
	if got := sum.Fields["dropped_total"]; got != float64(flood-maxNoisy) {
		t.Errorf("dropped_total = %v, want %d", got, flood-maxNoisy)
	}
	// Positive control: below the bound nothing is dropped or marked.
	tr2 := m.openTrail("acme", "s-fedcba9876543210")
	for range 10 {
		tr2.record(now, "egress_denied", nil)
	}
	tr2.summarise(now)
	evs2 := tr2.events()
	if count(evs2, "egress_denied") != 10 || count(evs2, "audit_truncated") != 0 || count(evs2, "audit_summary") != 0 {
		t.Errorf("below the bound: %d denied, %d markers, %d summaries", count(evs2, "egress_denied"), count(evs2, "audit_truncated"), count(evs2, "audit_summary"))
	}
}

// Other events are capped too, loudly.
func TestTrailCapOtherEvents(t *testing.T) {
	m := testManager(t)
	tr := m.openTrail("acme", "s-0123456789abcdef")
	now := time.Now()
	for range maxEvents + 5 {
		tr.record(now, "exec", nil)
	}
	evs := tr.events()
	if count(evs, "exec") != maxEvents || count(evs, "audit_truncated") != 1 || tr.dropped["exec"] != 5 {
		t.Errorf("kept %d, markers %d, dropped %d", count(evs, "exec"), count(evs, "audit_truncated"), tr.dropped["exec"])
	}
	// A restarted gateway takes the counts up from the file.
	again := m.openTrail("acme", "s-0123456789abcdef")
	again.record(now, "exec", nil)
	if n := count(again.events(), "exec"); n != maxEvents {
		t.Errorf("after reopening, %d exec events, want %d", n, maxEvents)
	}
}

func TestTrailBoundsFields(t *testing.T) {
	m := testManager(t)
	tr := m.openTrail("acme", "s-0123456789abcdef")
	big := map[string]any{"url": strings.Repeat("é", 10000), "list": make([]string, 1000), "ok": "short"}
	for i := range 100 {
		big[fmt.Sprintf("k%03d", i)] = i
	}
	tr.record(time.Now(), "action", big)
	evs := tr.events()
	if len(evs) != 1 {
		t.Fatalf("%d events", len(evs))
	}
	f := evs[0].Fields
	if len(f) > maxFields+1 || f["fields_truncated"] == nil {
		t.Errorf("%d fields kept, fields_truncated=%v", len(f), f["fields_truncated"])
	}
	// Keys are kept in order: "k000".. come before "list", "ok", "url".
	if f["k000"] != float64(0) {
		t.Errorf("k000 = %v", f["k000"])
	}
	small := boundFields(map[string]any{"url": strings.Repeat("é", 10000), "ok": "short", "list": make([]string, 1000)}, 2)
	if s := small["url"].(string); len(s) > maxFieldBytes || !strings.HasSuffix(s, "(cut)") {
		t.Errorf("url kept %d bytes", len(s))
	}
	if small["ok"] != "short" {
		t.Errorf("short field changed: %v", small["ok"])
	}
	if l := small["list"].([]any); len(l) != maxFields {
		t.Errorf("list kept %d items", len(l))
	}
}

// Record writes only for sessions the manager knows.
func TestRecordUnknownSession(t *testing.T) {
	m := testManager(t)
	m.Record("s-0123456789abcdef", "preview_revoked", nil)
	if files, _ := filepath.Glob(filepath.Join(m.cfg.StateDir, "audit", "*", "*")); len(files) != 0 {
		t.Errorf("a trail was made for an unknown session: %v", files)
	}
	s := newSess(Info{ID: "s-0123456789abcdef", Tenant: "acme"})
	s.trail = m.openTrail("acme", s.info.ID)
	m.sessions[s.info.ID] = s
	m.Record(s.info.ID, "preview_revoked", nil)
	evs, err := m.Events("acme", s.info.ID)
	if err != nil || count(evs, "preview_revoked") != 1 {
		t.Errorf("known session: %v, %v", evs, err)
	}
	if _, err := m.Events("other", s.info.ID); err == nil {
		t.Error("another tenant read the trail")
	}
}
