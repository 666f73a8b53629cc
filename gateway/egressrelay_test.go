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
// egress event, or no session's, is not reported. The leader makes the
// trail's fields itself: those of the proxy for each type, values that
// cannot be (an address that is none, a port out of range, a way
// through the proxy it does not take, a credential id that is none)
// left out, and a host and a reason cut short.
func TestRelayEgressEvents(t *testing.T) {
	var mu sync.Mutex
	var got []relayEvent
	var runs relayRuns
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != relaySyncPath {
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
	srv.EgressEvent("tenant-a", sid, expires, "egress_allowed", map[string]any{"host": "pages.sandgate.test", "port": uint16(80), "address": "198.51.100.10", "via": "tunnel"})
	srv.EgressEvent("tenant-a", sid, expires, "credential_used", map[string]any{"credential": cred, "host": "basic.sandgate.test", "port": uint16(443), "via": "header"})
	srv.EgressEvent("tenant-a", sid, expires, "egress_limited", map[string]any{"reason": "too many connections", "refused": 7})
	// Not reported: no egress event, and no session's id.
	srv.EgressEvent("tenant-a", sid, expires, "exec", map[string]any{"host": "x"})
	srv.EgressEvent("tenant-a", "../"+sid, expires, "egress_denied", map[string]any{"host": "x"})
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
	first := events[0].Token
	if tk, _ := l.egressTicket("tenant-a", sid, expires); tk != first {
		t.Error("a second event of the session got a new ticket")
	}
	if tk, _ := l.egressTicket("tenant-a", sid, expires.Add(time.Hour)); tk == first {
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
	// The control: a type the proxy does not record is none.
	if f, ok := egressFields(relayEvent{Type: "shell_opened", Host: "a.test"}); ok {
		t.Errorf("shell_opened taken as an egress event: %v", f)
	}
}
