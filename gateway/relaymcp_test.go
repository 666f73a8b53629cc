package gateway

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sandgate/sandgate/session"
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
		{"a view link's token", "POST", "eyJhbGciOiJIUzI1NiJ9.a-view-link-token.sig", "", "application/json", 401, 0, ""},
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
	for _, want := range []string{"\nsandgate_gateway_leading 0\n", "\nsandgate_gateway_goroutines ", "\nsandgate_gateway_resident_bytes ", "\nsandgate_relay_preview_connections 0\n"} {
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
	// Its host is checked as the leader's.
	req = httptest.NewRequest("GET", "http://evil.test/metrics", nil)
	if st, _ := answerOf(t, srv, req); st != 403 {
		t.Errorf("a relay's /metrics for a foreign host: %d, want 403", st)
	}
}
