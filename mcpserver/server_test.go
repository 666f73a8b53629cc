package mcpserver

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	sandgate "github.com/sandgate/sandgate/sdk/go"
)

// TestHandlerRetry: the handler's tools call the gateway once by
// default, so a 503 that says to retry is the tool's error at once
// (the control); with sandgate.WithRetry (a replica standing by), the
// call is sent again as the 503 says and answered.
func TestHandlerRetry(t *testing.T) {
	var asked atomic.Int32
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/v1/sessions" || r.Header.Get("Authorization") != "Bearer k" {
			w.WriteHeader(404)
			io.WriteString(w, `{"error":{"code":"not_found","message":"no"}}`)
			return
		}
		if asked.Add(1)%2 == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(503)
			io.WriteString(w, `{"error":{"code":"unavailable","message":"no gateway replica leads the sessions yet; retry"}}`)
			return
		}
		io.WriteString(w, `{"sessions":[]}`)
	}))
	defer gw.Close()
	list := func(h http.Handler) (*mcp.CallToolResult, error) {
		srv := httptest.NewServer(h)
		defer srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		tr := &mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1, DisableStandaloneSSE: true,
			HTTPClient: &http.Client{Transport: authed{}}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, tr, nil)
		if err != nil {
			return nil, err
		}
		defer cs.Close()
		return cs.CallTool(ctx, &mcp.CallToolParams{Name: "session_list", Arguments: map[string]any{}})
	}
	res, err := list(Handler(gw.URL, "", "test"))
	if err != nil || !res.IsError || !strings.HasPrefix(resultText(res), "unavailable: ") || asked.Load() != 1 {
		t.Fatalf("session_list, the gateway's 503 to retry, by default: %v %+v (asked %d times), want the tool error at once", err, res, asked.Load())
	}
	asked.Store(0)
	res, err = list(Handler(gw.URL, "", "test", sandgate.WithRetry(10*time.Second)))
	if err != nil || res.IsError || asked.Load() != 2 {
		t.Fatalf("session_list, the gateway's 503 to retry, with retries: %v %+v (asked %d times), want it answered on the second", err, res, asked.Load())
	}
}

type authed struct{}

func (authed) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer k")
	return http.DefaultTransport.RoundTrip(r)
}

func resultText(res *mcp.CallToolResult) string {
	var s []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			s = append(s, tc.Text)
		}
	}
	return strings.Join(s, "\n")
}
