package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/tenant"
)

// TestRelayMCPAlone: /mcp that no leader takes reaches the relay's MCP
// handler only with a key the copy of the tenants admits (the control:
// a good key reaches it); a junk key or none gets 401, a disabled
// tenant's 403, a copy that cannot say 503 with a Retry-After, and the
// gateway's own checks (origin, content type, methods) hold as on the
// leader. A relay with no copy of the tenants answers 503 to retry.
func TestRelayMCPAlone(t *testing.T) {
	var calls atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	})
	u, _ := url.Parse("http://gw.test:8080")
	relay := func() *Server {
		srv, err := NewRelay(Config{PublicURL: u, TokenKeys: map[string]string{"k1": strings.Repeat("a", 32)}, ActiveKey: "k1"}, "relay-1",
			func(context.Context) (string, error) { return "", nil },
			func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} }, nil, slog.New(slog.DiscardHandler), WithMCP(h))
		if err != nil {
			t.Fatal(err)
		}
		return srv
	}
	srv := relay()
	srv.AdmitAlone(sessionlessAlone())
	// A view link of a session of the tenant's, signed with the
	// gateway's keys: a token, not a key.
	view, err := srv.tokens.issue(previewClaims{Session: "s-1", Tenant: "t", Scope: ScopeView, ViewOnly: true,
		RegisteredClaims: jwt.RegisteredClaims{ID: "p-1", ExpiresAt: jwtTime(time.Now().Add(time.Hour))}})
	if err != nil {
		t.Fatal(err)
	}
	const both = "application/json, text/event-stream"
	call := func(srv *Server, method, key, origin, ctype string) (int, string, string) {
		t.Helper()
		req := httptest.NewRequest(method, "http://gw.test:8080/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		req.Header.Set("Accept", both)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := srv.App().Test(req, 10000)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), resp.Header.Get("Retry-After")
	}
	for _, tc := range []struct {
		name, method, key, origin, ctype string
		status                           int
		calls                            int32
		retry                            string
	}{
		{"good key", "POST", "good", "", "application/json", 200, 1, ""},
		{"no key", "POST", "", "", "application/json", 401, 0, ""},
		{"junk key", "POST", "junk", "", "application/json", 401, 0, ""},
		{"a view link's token", "POST", view, "", "application/json", 401, 0, ""},
		{"disabled tenant", "POST", "off", "", "application/json", 403, 0, ""},
		{"copy out of date", "POST", "stale", "", "application/json", 503, 0, "2"},
		{"foreign origin", "POST", "good", "http://evil.test", "application/json", 403, 0, ""},
		{"not json", "POST", "good", "", "text/plain", 415, 0, ""},
		{"get", "GET", "good", "", "", 405, 0, ""},
		{"delete", "DELETE", "good", "", "", 405, 0, ""},
		{"get, junk key", "GET", "junk", "", "", 401, 0, ""},
	} {
		calls.Store(0)
		st, body, retry := call(srv, tc.method, tc.key, tc.origin, tc.ctype)
		if st != tc.status || calls.Load() != tc.calls || retry != tc.retry {
			t.Errorf("%s: %d %s (Retry-After %q), the handler called %d times; want %d, %d calls, Retry-After %q", tc.name, st, body, retry, calls.Load(), tc.status, tc.calls, tc.retry)
		}
		if st != 200 {
			var e struct {
				Error struct{ Code, Message string }
			}
			if json.Unmarshal([]byte(body), &e) != nil || e.Error.Code == "" {
				t.Errorf("%s: the refusal is not the contract's JSON error: %s", tc.name, body)
			}
		}
	}
	// A key the copy refuses marks no silence (which would have the
	// relay admit alone, without asking the leader, for a while); a
	// good one does (the control).
	quiet := relay()
	quiet.AdmitAlone(sessionlessAlone())
	if st, _, _ := call(quiet, "POST", "junk", "", "application/json"); st != 401 || quiet.live.(*relayLive).silentSince.Load() != 0 {
		t.Errorf("/mcp with a junk key: %d, silence noted %t; want 401 and none", st, quiet.live.(*relayLive).silentSince.Load() != 0)
	}
	if st, _, _ := call(quiet, "POST", "good", "", "application/json"); st != 200 || quiet.live.(*relayLive).silentSince.Load() == 0 {
		t.Errorf("/mcp with a good key: %d, silence noted %t; want 200 and noted", st, quiet.live.(*relayLive).silentSince.Load() != 0)
	}
	// No copy of the tenants (no store): 503 to retry, the handler
	// unreached.
	calls.Store(0)
	if st, body, retry := call(relay(), "POST", "good", "", "application/json"); st != 503 || retry != "2" || calls.Load() != 0 {
		t.Errorf("/mcp on a relay with no copy of the tenants: %d %s (Retry-After %q), %d calls; want 503 to retry, unreached", st, body, retry, calls.Load())
	}
}

// TestRelayMetricsOpenAPI: a relay answers /metrics with its own
// process and that it does not lead, without the leader's counts of
// sessions (a scrape of both replicas counts them once); a leader's say
// it leads (the control). It serves the OpenAPI document as the leader
// does.
func TestRelayMetricsOpenAPI(t *testing.T) {
	srv := testRelay(t, "http://127.0.0.1:1", nil)
	st, body, _ := relayCall(t, srv, "GET", "/metrics", "", "")
	for _, want := range []string{"\nsandgate_gateway_leading 0\n", "\nsandgate_gateway_goroutines ", "\nsandgate_gateway_resident_bytes ", "\nsandgate_relay_connections 0\n"} {
		if st != 200 || !strings.Contains("\n"+body, want) {
			t.Errorf("a relay's /metrics: %d, want %q in:\n%s", st, want, body)
		}
	}
	if strings.Contains(body, "sandgate_sessions") || strings.Contains(body, "sandgate_create_queue") {
		t.Errorf("a relay's /metrics counts sessions or creates, which are the leader's:\n%s", body)
	}
	leader := newTestServer(t)
	req := httptest.NewRequest("GET", "http://gw.test:8080/metrics", nil)
	if st, body := answerOf(t, leader, req); st != 200 || !strings.Contains(body, "\nsandgate_gateway_leading 1\n") || !strings.Contains(body, "sandgate_sessions{") {
		t.Errorf("a leader's /metrics: %d, want it to lead and count the sessions:\n%s", st, body)
	}
	if st, body, _ := relayCall(t, srv, "GET", "/openapi.yaml", "", ""); st != 200 || body != string(openapiDoc) {
		t.Errorf("a relay's /openapi.yaml: %d, %d bytes, want the document", st, len(body))
	}
	st, body, _ = relayCall(t, srv, "GET", "/openapi.json", "", "")
	var doc map[string]any
	if st != 200 || json.Unmarshal([]byte(body), &doc) != nil || doc["openapi"] == nil {
		t.Errorf("a relay's /openapi.json: %d %.200s", st, body)
	}
	// Metrics for any host (a scrape names a Pod by its address), as
	// the leader's; the document's host is checked, as the leader's.
	for _, s := range []*Server{srv, leader} {
		req = httptest.NewRequest("GET", "http://10.1.2.3:8080/metrics", nil)
		if st, body := answerOf(t, s, req); st != 200 || !strings.Contains(body, "sandgate_gateway_leading ") {
			t.Errorf("/metrics for a Pod's address as the host: %d %.200s", st, body)
		}
		req = httptest.NewRequest("GET", "http://10.1.2.3:8080/openapi.json", nil)
		if st, _ := answerOf(t, s, req); st != 403 {
			t.Errorf("/openapi.json for a Pod's address as the host: %d, want 403", st)
		}
	}
}

// TestRelayMCPAloneTurns: the MCP requests a relay answers alone take
// turns, at most maxMCPAnswersPerTenant a tenant's: a tenant holding
// its own gets 503 to retry while another tenant's request goes
// through (the control), and a junk key is refused (401) whatever the
// turns. A copy of the tenants not read since no leader answers gets
// 503 to retry, the handler unreached, as the relay's other answers.
func TestRelayMCPAloneTurns(t *testing.T) {
	release := make(chan struct{})
	done := sync.OnceFunc(func() { close(release) })
	t.Cleanup(done) // (a failure leaves no request held)
	var calls atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("X-Hold") != "" {
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	})
	u, _ := url.Parse("http://gw.test:8080")
	srv, err := NewRelay(Config{PublicURL: u, TokenKeys: map[string]string{"k1": strings.Repeat("a", 32)}, ActiveKey: "k1"}, "relay-1",
		func(context.Context) (string, error) { return "", nil },
		func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} }, nil, slog.New(slog.DiscardHandler), WithMCP(h))
	if err != nil {
		t.Fatal(err)
	}
	var fresh atomic.Int64
	fresh.Store(time.Now().Add(time.Hour).UnixNano())
	alone := sessionlessAlone()
	alone.Tenant = func(key string) (string, session.TenantLimits, error) {
		switch key {
		case "good":
			return "t", session.TenantLimits{}, nil
		case "other":
			return "u", session.TenantLimits{}, nil
		}
		if name, ok := strings.CutPrefix(key, "key-of-"); ok {
			return name, session.TenantLimits{}, nil
		}
		return "", session.TenantLimits{}, tenant.ErrNotFound
	}
	alone.Fresh = func() time.Time { return time.Unix(0, fresh.Load()) }
	srv.AdmitAlone(alone)
	call := func(key string, hold bool) (int, string) {
		req := httptest.NewRequest("POST", "http://gw.test:8080/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+key)
		if hold {
			req.Header.Set("X-Hold", "1")
		}
		resp, err := srv.App().Test(req, -1)
		if err != nil {
			return 0, err.Error()
		}
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	var held sync.WaitGroup
	for range maxMCPAnswersPerTenant {
		held.Add(1)
		go func() {
			defer held.Done()
			if st, body := call("good", true); st != 200 {
				t.Errorf("a held MCP request: %d %s", st, body)
			}
		}()
	}
	waitUntil(t, func() bool { return calls.Load() == maxMCPAnswersPerTenant })
	if st, body := call("good", false); st != 503 || calls.Load() != maxMCPAnswersPerTenant {
		t.Errorf("tenant t's MCP request with %d of its own held: %d %s, want 503 unreached", maxMCPAnswersPerTenant, st, body)
	}
	if st, body := call("other", false); st != 200 {
		t.Errorf("tenant u's MCP request while t holds its turns: %d %s, want it answered", st, body)
	}
	// Every turn held, by other tenants too: a tenant with none held
	// gets 503 (the control), a junk key still 401.
	for i := range maxMCPAnswers - maxMCPAnswersPerTenant {
		held.Add(1)
		key := fmt.Sprintf("key-of-w%d", i/maxMCPAnswersPerTenant)
		go func() {
			defer held.Done()
			if st, body := call(key, true); st != 200 {
				t.Errorf("a held MCP request of %s: %d %s", key, st, body)
			}
		}()
	}
	waitUntil(t, func() bool { return calls.Load() == maxMCPAnswers+1 })
	if st, body := call("key-of-idle", false); st != 503 || calls.Load() != maxMCPAnswers+1 {
		t.Errorf("a tenant's first MCP request while every turn is held: %d %s, want 503 unreached", st, body)
	}
	if st, body := call("junk", false); st != 401 {
		t.Errorf("a junk key while every turn is held: %d %s, want 401", st, body)
	}
	done()
	held.Wait()
	// The copies not read since the silence began: 503 to retry.
	fresh.Store(time.Now().Add(-time.Hour).UnixNano())
	srv.live.(*relayLive).answered() // a silence that begins anew
	calls.Store(0)
	if st, body := call("good", false); st != 503 || calls.Load() != 0 {
		t.Errorf("an MCP request, the copies not read since no leader answers: %d %s, %d calls; want 503 unreached", st, body, calls.Load())
	}
}

// waitUntil polls cond for up to 10 s.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
	}
}

// TestRelaySilenceAnew: a silence noted over relayGrace ago, no leader
// asked since, is not the one noted now: the copies are read again as
// the new one begins. The control: a silence noted again at once is the
// same one, its copies read once.
func TestRelaySilenceAnew(t *testing.T) {
	srv := testRelay(t, "http://127.0.0.1:1", nil)
	l := srv.live.(*relayLive)
	var refreshed atomic.Int32
	alone := sessionlessAlone()
	alone.Refresh = func(context.Context) { refreshed.Add(1) }
	srv.AdmitAlone(alone)
	admits := func(want int32) {
		t.Helper()
		if err := l.admitsAlone(context.Background()); err != nil || refreshed.Load() != want {
			t.Fatalf("admitting alone: %v, the copies read %d times; want %d", err, refreshed.Load(), want)
		}
	}
	l.silent()
	admits(1)
	l.silent()
	admits(1)
	l.silentAt.Store(time.Now().Add(-2 * relayGrace).UnixNano())
	l.silent()
	admits(2)
}
