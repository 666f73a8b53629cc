package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/ids"
)

// TestRelayEgressEvents: the egress events of a replica that stands by
// reach the leader in its reports, named by a ticket of the session
// (scopeShell, signed with the gateway's keys, of the session's tenant,
// lasting past its expiry) and carrying the proxy's fields; what is no
// egress event, or of no session the proxy found, is not reported. The leader makes the
// trail's fields itself: those of the proxy for each type, values that
// cannot be (an address that is none, a port out of range, a way
// through the proxy it does not take, a credential id that is none)
// left out, and a host and a reason cut short.
func TestRelayEgressEvents(t *testing.T) {
	var mu sync.Mutex
	var got []relayEvent
	var runs relayRuns
	silent := false
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		quiet := silent
		mu.Unlock()
		if r.URL.Path != relaySyncPath || quiet {
			w.WriteHeader(404)
			return
		}
		var req relaySyncRequest
		json.Unmarshal(body, &req)
		mu.Lock()
		runs.record(req, time.Now(), func(ev relayEvent) { got = append(got, ev) })
		mu.Unlock()
		json.NewEncoder(w).Encode(relaySyncAnswer{})
	}))
	defer leader.Close()
	srv := testRelay(t, leader.URL, nil)
	l := srv.live.(*relayLive)

	sid, cred := ids.NewSession(), ids.NewCredential()
	expires := time.Now().Add(10 * time.Minute)
	// Not reported: the event of a session the proxy has not found.
	srv.EgressEvent(sid, "egress_denied", map[string]any{"host": "before.test"})
	srv.EgressSession("tenant-a", sid, expires)
	srv.EgressSession("tenant-a", "../"+sid, expires)
	srv.EgressEvent(sid, "egress_allowed", map[string]any{"host": "pages.sandgate.test", "port": uint16(80), "address": "198.51.100.10", "via": "tunnel"})
	srv.EgressEvent(sid, "credential_used", map[string]any{"credential": cred, "host": "basic.sandgate.test", "port": uint16(443), "via": "header"})
	srv.EgressEvent(sid, "egress_limited", map[string]any{"reason": "too many connections", "refused": 7})
	// Not reported: no egress event, and no session's id.
	srv.EgressEvent(sid, "exec", map[string]any{"host": "x"})
	srv.EgressEvent("../"+sid, "egress_denied", map[string]any{"host": "x"})
	l.sync()
	mu.Lock()
	events := append([]relayEvent(nil), got...)
	mu.Unlock()
	if len(events) != 3 {
		t.Fatalf("the leader got %d events, want the 3 egress events: %+v", len(events), events)
	}
	for _, ev := range events {
		claims, err := srv.tokens.verify(ev.Token, time.Now())
		if err != nil || claims.Scope != scopeShell || claims.Session != sid || claims.Tenant != "tenant-a" || claims.ExpiresAt.Time.Before(expires) {
			t.Errorf("%s: the ticket %+v, %v: want a shell ticket of %s, tenant-a, lasting past %v", ev.Type, claims, err, sid, expires)
		}
	}
	want := []map[string]any{
		{"host": "pages.sandgate.test", "port": 80, "address": "198.51.100.10", "via": "tunnel"},
		{"credential": cred, "host": "basic.sandgate.test", "port": 443, "via": "header"},
		{"reason": "too many connections", "refused": 7},
	}
	for i, ev := range events {
		f, ok := egressFields(ev)
		if !ok || !reflect.DeepEqual(f, want[i]) {
			t.Errorf("%s: the leader records %v (%v), want %v", ev.Type, f, ok, want[i])
		}
	}
	// The same ticket for the session's next event; another once its
	// expiry moved past the ticket's.
	ticket := func() string {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.egressTickets[sid].ticket
	}
	first := events[0].Token
	if srv.EgressSession("tenant-a", sid, expires); ticket() != first {
		t.Error("the session found again: a new ticket")
	}
	if srv.EgressSession("tenant-a", sid, expires.Add(time.Hour)); ticket() == first {
		t.Error("the session extended: its old ticket, which ends before it does")
	}

	// What cannot be is left out; what is too long is cut.
	long := strings.Repeat("h", 1000)
	for _, c := range []struct {
		ev   relayEvent
		want map[string]any
	}{
		{relayEvent{Type: "egress_allowed", Host: "a.test", Port: 70000, Address: "not an address", Via: "teleport"}, map[string]any{"host": "a.test"}},
		{relayEvent{Type: "egress_denied", Host: long, Port: -1, Reason: long}, map[string]any{"host": long[:maxEgressHost], "reason": long[:200]}},
		{relayEvent{Type: "credential_refused", Credential: "../etc", Host: "b.test", Reason: "outside"}, map[string]any{"host": "b.test", "reason": "outside"}},
		{relayEvent{Type: "egress_limited", Refused: -5, Reason: "r"}, map[string]any{"reason": "r", "refused": 0}},
	} {
		if f, ok := egressFields(c.ev); !ok || !reflect.DeepEqual(f, c.want) {
			t.Errorf("%+v: the leader records %v (%v), want %v", c.ev, f, ok, c.want)
		}
	}
	// While no leader answers, the egress events kept are bounded, each
	// session's and all; the others are kept beside them. All go once a
	// leader answers, with each session's count of those dropped.
	mu.Lock()
	silent, got = true, nil
	mu.Unlock()
	others := make([]string, 8)
	for i := range others {
		others[i] = ids.NewSession()
		srv.EgressSession("tenant-b", others[i], expires)
	}
	for range 2 * maxEgressSession {
		srv.EgressEvent(sid, "egress_denied", map[string]any{"host": "other.sandgate.test", "reason": "not on the session's allow list"})
	}
	for _, o := range others {
		for range maxEgressSession {
			srv.EgressEvent(o, "egress_allowed", map[string]any{"host": "pages.sandgate.test", "port": uint16(80)})
		}
	}
	l.record(shellClaims("tenant-a", sid, first), "shell_opened", nil)
	l.mu.Lock()
	kept, egressKept, dropped := len(l.events), l.egressKept, l.egressDropped
	l.mu.Unlock()
	// sid's first maxEgressSession, then 7 others' whole (the kept
	// reach maxEgressKept), the last one's none.
	if kept != maxEgressKept+1 || egressKept != maxEgressKept || dropped != 2*maxEgressSession {
		t.Errorf("no leader answering: %d kept, %d of them egress, %d dropped; want %d, %d, %d",
			kept, egressKept, dropped, maxEgressKept+1, maxEgressKept, 2*maxEgressSession)
	}
	l.sync() // refused: all stay
	mu.Lock()
	silent = false
	mu.Unlock()
	for range 10 {
		l.sync()
	}
	mu.Lock()
	all := append([]relayEvent(nil), got...)
	mu.Unlock()
	drops := map[string]any{}
	shell := 0
	for _, ev := range all {
		claims, _ := srv.tokens.verify(ev.Token, time.Now())
		switch {
		case ev.Type == "egress_dropped" && claims != nil:
			f, _ := egressFields(ev)
			drops[claims.Session] = f["dropped"]
		case ev.Type == "shell_opened":
			shell++
		}
	}
	wantDrops := map[string]any{sid: maxEgressSession, others[7]: maxEgressSession}
	if len(all) != maxEgressKept+3 || shell != 1 || !reflect.DeepEqual(drops, wantDrops) {
		t.Errorf("a leader answering again got %d events, %d shell_opened, drops %v; want %d, 1, %v", len(all), shell, drops, maxEgressKept+3, wantDrops)
	}
	l.mu.Lock()
	egressKept, left := l.egressKept, len(l.egressBy)
	l.mu.Unlock()
	if egressKept != 0 || left != 0 {
		t.Errorf("all reported: %d egress events still counted, %d sessions", egressKept, left)
	}

	// The control: a type the proxy does not record is none.
	if f, ok := egressFields(relayEvent{Type: "shell_opened", Host: "a.test"}); ok {
		t.Errorf("shell_opened taken as an egress event: %v", f)
	}
}

// TestRelayedAt: a relayed event is stamped as the relay keeps it, the
// stamp goes in its report, and the leader records it as happened_at:
// as it is, or now when ahead of the leader's clock; left out when
// missing (a replica of an earlier version) or over a day old.
func TestRelayedAt(t *testing.T) {
	before := time.Now()
	ev := relayEvent{Type: "egress_denied", Host: "a.test"}
	ev.measure()
	if ev.At.Before(before) || ev.At.After(time.Now()) {
		t.Fatalf("kept at %v, want between %v and now", ev.At, before)
	}
	raw, _ := json.Marshal(ev)
	var back relayEvent
	if err := json.Unmarshal(raw, &back); err != nil || !back.At.Equal(ev.At) {
		t.Fatalf("the report carries %s, read back as %v (%v)", raw, back.At, err)
	}
	if raw, _ := json.Marshal(relayEvent{Type: "x"}); strings.Contains(string(raw), `"at"`) {
		t.Errorf("an event with no time carries one: %s", raw)
	}
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		at   time.Time
		want time.Time
		ok   bool
	}{
		{now.Add(-3 * time.Second), now.Add(-3 * time.Second), true},
		{now.Add(-23 * time.Hour), now.Add(-23 * time.Hour), true},
		{now.Add(time.Minute), now, true},
		{time.Time{}, time.Time{}, false},
		{now.Add(-25 * time.Hour), time.Time{}, false},
	} {
		if got, ok := relayedAt(c.at, now); ok != c.ok || !got.Equal(c.want) {
			t.Errorf("relayedAt(%v): %v %v, want %v %v", c.at, got, ok, c.want, c.ok)
		}
	}
}
