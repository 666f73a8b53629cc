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

// TestHandlerEndsWithRequest: a tool's call to the gateway ends when the
// HTTP request that made it ends (its client hung up), though the SDK
// hands tools a context that does not; while the client waits, the call
// goes on and its answer comes back (the control).
func TestHandlerEndsWithRequest(t *testing.T) {
	asked := make(chan struct{}, 2)
	ended := make(chan bool, 2)
	var release atomic.Pointer[chan struct{}]
	waiting := make(chan struct{})
	release.Store(&waiting)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked <- struct{}{}
		select {
		case <-r.Context().Done():
			ended <- true
			return
		case <-*release.Load():
			ended <- false
		case <-time.After(20 * time.Second):
			ended <- false
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"sessions":[]}`)
	}))
	defer gw.Close()
	srv := httptest.NewServer(Handler(gw.URL, "", "test"))
	defer srv.Close()
	call := func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"session_list","arguments":{}}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer k")
		return http.DefaultClient.Do(req)
	}
	reached := func() {
		t.Helper()
		select {
		case <-asked:
		case <-time.After(10 * time.Second):
			t.Fatal("the tool did not call the gateway")
		}
	}
	// The control: a client that waits gets the answer.
	type answer struct {
		resp *http.Response
		err  error
	}
	got := make(chan answer, 1)
	go func() { resp, err := call(context.Background()); got <- answer{resp, err} }()
	reached()
	select {
	case gone := <-ended:
		t.Fatalf("the tool's call ended (%t) while its client waited", gone)
	case <-time.After(500 * time.Millisecond):
	}
	close(waiting)
	a := <-got
	if a.err != nil || a.resp.StatusCode != 200 {
		t.Fatalf("the waiting client's answer: %v %v", a.resp, a.err)
	}
	body, _ := io.ReadAll(a.resp.Body)
	a.resp.Body.Close()
	if gone := <-ended; gone || !strings.Contains(string(body), `"sessions"`) {
		t.Fatalf("the waiting client's call: ended %t, answer %s", gone, body)
	}
	// A client that hangs up: the tool's call ends with it.
	waiting = make(chan struct{})
	release.Store(&waiting)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { resp, err := call(ctx); got <- answer{resp, err} }()
	reached()
	cancel()
	select {
	case gone := <-ended:
		if !gone {
			t.Fatal("the tool's call ended, not by its request's end")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the tool's call went on 10 s after its client hung up")
	}
	<-got
}
