package sandgate

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRetry: a request the gateway answers 503 unavailable with a
// Retry-After (nothing was done) is sent again, its body whole, until it
// is answered or the client's retry time is spent; any other refusal, a
// 503 without a Retry-After, and a request whose body cannot be read
// again are answered at once. (The gateway's own answers of this kind,
// while a replica takes over from one that died, are TestKubeRelay's.)
func TestRetry(t *testing.T) {
	var mu sync.Mutex
	refuse := map[string]int{} // path: how many 503s before the answer
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, r.URL.Path+" "+string(b))
		switch {
		case r.URL.Path == "/v1/sessions/s-0000000000000001/files":
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(503)
			io.WriteString(w, `{"error":{"code":"unavailable","message":"taking over; retry"}}`)
		case r.URL.Path == "/v1/sessions/s-0000000000000004":
			// A Retry-After that would overflow a Duration (to 0.29 s).
			w.Header().Set("Retry-After", "18446744074")
			w.WriteHeader(503)
			io.WriteString(w, `{"error":{"code":"unavailable","message":"taking over; retry"}}`)
		case r.URL.Path == "/v1/sessions/s-0000000000000002":
			w.WriteHeader(503) // no Retry-After: it may have been done
			io.WriteString(w, `{"error":{"code":"unavailable","message":"the session's display did not answer"}}`)
		case refuse[r.URL.Path] > 0:
			refuse[r.URL.Path]--
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(503)
			io.WriteString(w, `{"error":{"code":"unavailable","message":"taking over; retry"}}`)
		default:
			io.WriteString(w, `{"id":"s-0000000000000003","state":"running","exit_code":0}`)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	sent := func() []string { mu.Lock(); defer mu.Unlock(); b := bodies; bodies = nil; return b }

	// Retried, the body sent whole each time.
	refuse["/v1/sessions"] = 2
	t0 := time.Now()
	s, err := New(srv.URL, "k").CreateSession(ctx, SessionRequest{Kind: "browser"})
	if err != nil || s.ID != "s-0000000000000003" {
		t.Fatalf("a create answered 503 twice, then 201: %v %v", s, err)
	}
	if took := time.Since(t0); took < 2*time.Second {
		t.Errorf("retried after %v, not the 2 s the Retry-Afters said", took)
	}
	if b := sent(); len(b) != 3 || b[0] != b[2] || !strings.Contains(b[2], `"kind":"browser"`) {
		t.Errorf("sent %q, want the same request three times", b)
	}
	// Not retried: with WithRetry(0); past the retry time; a 503
	// without a Retry-After; a body that cannot be read again.
	refuse["/v1/sessions"] = 1
	if _, err := New(srv.URL, "k", WithRetry(0)).CreateSession(ctx, SessionRequest{}); !IsUnavailable(err) || len(sent()) != 1 {
		t.Errorf("WithRetry(0): %v, want unavailable at once", err)
	}
	refuse["/v1/sessions"] = 5
	t0 = time.Now()
	if _, err := New(srv.URL, "k", WithRetry(1500*time.Millisecond)).CreateSession(ctx, SessionRequest{}); !IsUnavailable(err) || time.Since(t0) > 3*time.Second {
		t.Errorf("past the retry time: %v after %v, want unavailable within it", err, time.Since(t0))
	}
	if n := len(sent()); n != 2 {
		t.Errorf("sent %d times in 1.5 s with a Retry-After of 1 s, want 2", n)
	}
	if _, err := New(srv.URL, "k").GetSession(ctx, "s-0000000000000002"); !IsUnavailable(err) || len(sent()) != 1 {
		t.Errorf("a 503 without a Retry-After: %v, want unavailable at once", err)
	}
	if _, err := New(srv.URL, "k").PutFile(ctx, "s-0000000000000001", "/tmp/x", io.MultiReader(strings.NewReader("stream"))); !IsUnavailable(err) || len(sent()) != 1 {
		t.Errorf("an upload from a stream: %v, want unavailable at once", err)
	}
	// A wait past what is left of the retries' time is not waited.
	if _, err := New(srv.URL, "k").GetSession(ctx, "s-0000000000000004"); !IsUnavailable(err) || len(sent()) != 1 {
		t.Errorf("a Retry-After of 18446744074 s: %v, want the error at once", err)
	}

	// A context that ends stops the retries.
	refuse["/v1/sessions"] = 100
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	t0 = time.Now()
	// Its error says both: the context ended, and what the gateway
	// last said.
	if _, err := New(srv.URL, "k").CreateSession(cctx, SessionRequest{}); !errors.Is(err, context.DeadlineExceeded) || !IsUnavailable(err) || time.Since(t0) > 2*time.Second {
		t.Errorf("a context that ended: %v after %v", err, time.Since(t0))
	}
	sent()

	// No gateway answers (nothing was sent): tried again, until one does.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	late := httptest.NewUnstartedServer(srv.Config.Handler)
	go func() {
		time.Sleep(1500 * time.Millisecond)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return
		}
		late.Listener = l
		late.Start()
	}()
	defer func() { time.Sleep(2 * time.Second); late.Close() }()
	if _, err := New("http://"+addr, "k", WithRetry(0)).GetSession(ctx, "s-0000000000000003"); err == nil {
		t.Error("no gateway, WithRetry(0): answered")
	}
	// No gateway at all: the caller hears of it within dialRetryFor,
	// not the whole retry time.
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	none := ln2.Addr().String()
	ln2.Close()
	t0 = time.Now()
	if _, err := New("http://"+none, "k").GetSession(ctx, "s-0000000000000003"); err == nil || time.Since(t0) < dialRetryFor-time.Second || time.Since(t0) > dialRetryFor+3*time.Second {
		t.Errorf("no gateway: %v after %v, want an error after about %v", err, time.Since(t0), dialRetryFor)
	}
	if s, err := New("http://"+addr, "k").GetSession(ctx, "s-0000000000000003"); err != nil || s.State != "running" {
		t.Errorf("a gateway that started 1.5 s late: %v %v", s, err)
	}
	if _, err := New("http://"+addr, "k", WithRetry(0)).GetSession(ctx, "s-0000000000000003"); err != nil {
		t.Errorf("the gateway, started: %v", err)
	}
}
