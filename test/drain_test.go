package test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestGracefulDrain: SIGTERM while a create is under way. The gateway
// says it is draining, refuses a new create with 503, answers the create
// under way with its running session, and exits; the next gateway adopts
// the session, and CDP reaches it.
func TestGracefulDrain(t *testing.T) {
	e := needE2E(t)
	type result struct {
		status int
		body   []byte
		at     time.Time
	}
	done := make(chan result, 1)
	go func() {
		st, _, body := e.rawCreate(t, e.keyA, map[string]any{"labels": map[string]string{"test": t.Name()}})
		done <- result{st, body, time.Now()}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for e.usage(t, e.keyA).Sessions == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the create is not under way after 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	proc := e.gw.Process
	// A failure below leaves this gateway draining; the tests after this
	// one get a fresh gateway, not one that refuses every create.
	t.Cleanup(func() {
		if e.gw != nil && e.gw.Process == proc {
			e.stopGateway(syscall.SIGKILL)
			if err := e.startGateway(); err != nil {
				t.Errorf("restart after a failed drain: %v", err)
			}
		}
	})
	// A kubelet's or a load balancer's probe names the replica by its
	// address, not the gateway's host: answered, the reason not given.
	probe := func() (int, string) {
		req, _ := http.NewRequest("GET", e.gwURL+"/readyz", nil)
		req.Host = "10.0.0.1:8080"
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if st, body := probe(); st != 200 {
		t.Fatalf("a probe naming the gateway by its address, ready: %d %s", st, body)
	}
	proc.Signal(syscall.SIGTERM)
	signalled := time.Now()

	// The signal arrives asynchronously: readyz turns within a bounded
	// wait, long before the create under way is answered.
	var st int
	var body []byte
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st, body = e.api(t, "", "GET", "/readyz", nil)
		if st == 503 && bytes.Contains(body, []byte("draining")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz 10 s after SIGTERM: %d %s", st, body)
		}
	}
	if st, body := probe(); st != 503 || strings.Contains(body, "draining") || !strings.Contains(body, "not ready") {
		t.Errorf("a probe naming the gateway by its address, draining: %d %s, want 503 without the reason", st, body)
	}
	select {
	case r := <-done:
		t.Fatalf("the create was answered (%d) before the gateway said it drains: the drain was not tested", r.status)
	default:
	}
	// Refused with a Retry-After: nothing was made, so an SDK sends it
	// again (to the gateway that takes over).
	st, retry, body := e.rawCreate(t, e.keyB, map[string]any{})
	if st != 503 || !bytes.Contains(body, []byte("shutting down")) || retry == "" {
		t.Fatalf("a new create while draining: %d %s (Retry-After %q)", st, body, retry)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("the create under way was not answered within 5 minutes")
	}
	var s sessionInfo
	if r.status != 201 || json.Unmarshal(r.body, &s) != nil || s.State != "running" {
		t.Fatalf("the create under way: %d %s", r.status, r.body)
	}
	t.Cleanup(func() { e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil) })
	if !r.at.After(signalled) {
		t.Fatalf("the create was answered before the signal: the drain was not tested")
	}
	t.Logf("create answered %s after SIGTERM", r.at.Sub(signalled).Round(time.Millisecond))

	e.stopGateway(syscall.SIGTERM) // waits for the exit
	if proc.Signal(syscall.Signal(0)) == nil {
		t.Fatal("the gateway did not exit after draining")
	}
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}
	status, raw := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID, nil)
	var got sessionInfo
	json.Unmarshal(raw, &got)
	if status != 200 || got.State != "running" {
		t.Fatalf("the session after the restart: %d %s", status, raw)
	}
	c := wsDial(t, browserWS(t, e.preview(t, e.keyA, s.ID, 300).URL))
	defer c.Close()
	cdpPing(t, c, 1)
}
