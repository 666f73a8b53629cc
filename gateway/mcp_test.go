package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/mcpserver"
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
	s := newTestServer(t, WithMCP(h))
	const both = "application/json, text/event-stream"
	for _, tc := range []struct {
		name, method, auth, host, origin, ctype, accept string
		status, calls                                   int
	}{
		{"good key", "POST", "Bearer good-key", "gw.test:8080", "", "application/json", both, 200, 1},
		{"accept any", "POST", "Bearer good-key", "gw.test:8080", "", "application/json; charset=utf-8", "*/*", 200, 1},
		{"no key", "POST", "", "gw.test:8080", "", "application/json", both, 401, 0},
		{"bad key", "POST", "Bearer bad-key", "gw.test:8080", "", "application/json", both, 401, 0},
		{"foreign host", "POST", "Bearer good-key", "evil.test", "", "application/json", both, 403, 0},
		{"foreign origin", "POST", "Bearer good-key", "gw.test:8080", "http://evil.test", "application/json", both, 403, 0},
		{"not json", "POST", "Bearer good-key", "gw.test:8080", "", "text/plain", both, 415, 0},
		{"accept json only", "POST", "Bearer good-key", "gw.test:8080", "", "application/json", "application/json", 400, 0},
		{"get", "GET", "Bearer good-key", "gw.test:8080", "", "", both, 405, 0},
		{"delete", "DELETE", "Bearer good-key", "gw.test:8080", "", "", both, 405, 0},
		{"get no key", "GET", "", "gw.test:8080", "", "", both, 401, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls = 0
			req := httptest.NewRequest(tc.method, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
			req.Host = tc.host
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			req.Header.Set("Accept", tc.accept)
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
			if tc.status != 200 {
				var e struct {
					Error struct{ Code, Message string }
				}
				if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Error.Code == "" {
					t.Fatalf("refusal is not the contract's JSON error: %v %+v", err, e)
				}
			}
			if tc.status == 405 && resp.Header.Get("Allow") != "POST" {
				t.Fatalf("405 without Allow: POST: %q", resp.Header.Get("Allow"))
			}
		})
	}
}

// TestMCPBodyLimit: /mcp takes a message as large as write_file's (the
// gateway's 1 MiB limit does not apply), and refuses one over its own.
func TestMCPBodyLimit(t *testing.T) {
	var got int
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = len(b)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	})
	s := newTestServer(t, WithMCP(h))
	for _, tc := range []struct {
		path   string
		size   int
		status int
	}{
		{"/mcp", 10 << 20, 200},
		{"/mcp", 13 << 20, 413},
		{"/v1/credentials", 2 << 20, 413}, // the gateway's own limit elsewhere
	} {
		body := `{"jsonrpc":"2.0","id":1,"method":"x","params":{"p":"` + strings.Repeat("a", tc.size) + `"}}`
		req := httptest.NewRequest("POST", tc.path, strings.NewReader(body))
		req.Host = "gw.test:8080"
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer good-key")
		resp, err := s.App().Test(req, -1)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != tc.status {
			t.Fatalf("%s with %d bytes: %d, want %d", tc.path, tc.size, resp.StatusCode, tc.status)
		}
		if tc.status == 200 && got != len(body) {
			t.Fatalf("the handler got %d bytes of %d", got, len(body))
		}
	}
}

// TestMCPClientGone: an MCP tool's call to the gateway (here a fake
// one's, which waits) ends when the /mcp client hangs up, through
// Fiber, as a create whose client hangs up is rolled back; while the
// client waits, it goes on, and the answer reaches it (the control).
func TestMCPClientGone(t *testing.T) {
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
	s := newTestServer(t, WithMCP(mcpserver.Handler(gw.URL, "", "test")))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.App().Listener(eofListener{ln}) // as Serve serves it
	defer s.App().Shutdown()
	send := func() net.Conn {
		t.Helper()
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"session_list","arguments":{}}}`
		fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: gw.test:8080\r\nAuthorization: Bearer good-key\r\nContent-Type: application/json\r\n"+
			"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		select {
		case <-asked:
		case <-time.After(10 * time.Second):
			t.Fatal("the MCP tool did not call the gateway")
		}
		return c
	}
	// The control: a client that waits keeps the call, and gets the
	// answer.
	c := send()
	select {
	case gone := <-ended:
		t.Fatalf("the tool's call ended (%t) while its client waited", gone)
	case <-time.After(1500 * time.Millisecond): // three of watchPeer's looks
	}
	close(waiting)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the waiting client's answer: %v %v", resp, err)
	}
	answer, _ := io.ReadAll(resp.Body)
	c.Close()
	if gone := <-ended; gone || !strings.Contains(string(answer), `sessions`) {
		t.Fatalf("the waiting client's call: ended %t, answer %s", gone, answer)
	}
	// A client that hangs up: the call ends.
	waiting = make(chan struct{})
	release.Store(&waiting)
	c = send()
	c.Close()
	select {
	case gone := <-ended:
		if !gone {
			t.Fatal("the tool's call ended, not by its request's end")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the tool's call went on 10 s after its client hung up")
	}
}
