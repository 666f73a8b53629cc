package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestMCPRoute: /mcp reaches the MCP handler only with a valid API key
// (the control), from the gateway's hosts and origins; otherwise the
// gateway refuses it before the handler runs.
func TestMCPRoute(t *testing.T) {
	var calls int
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	})
	sum := sha256.Sum256([]byte("good-key"))
	u, _ := url.Parse("http://gw.test:8080")
	s, err := New(Config{
		PublicURL: u, APIKeys: map[string]string{hex.EncodeToString(sum[:]): "tenant-a"},
		TokenKeys: map[string]string{"k1": strings.Repeat("a", 32)}, ActiveKey: "k1",
	}, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), WithMCP(h))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, auth, host, origin string
		status, calls            int
	}{
		{"good key", "Bearer good-key", "gw.test:8080", "", 200, 1},
		{"no key", "", "gw.test:8080", "", 401, 0},
		{"bad key", "Bearer bad-key", "gw.test:8080", "", 401, 0},
		{"foreign host", "Bearer good-key", "evil.test", "", 403, 0},
		{"foreign origin", "Bearer good-key", "gw.test:8080", "http://evil.test", 403, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls = 0
			req := httptest.NewRequest("POST", "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
			req.Host = tc.host
			req.Header.Set("Content-Type", "application/json")
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
			}
			resp, err := s.App().Test(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || calls != tc.calls {
				t.Fatalf("status %d, handler called %d times; want %d, %d", resp.StatusCode, calls, tc.status, tc.calls)
			}
		})
	}
}
