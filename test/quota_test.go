package test

import (
	"context"
	"errors"

	"bytes"
	"encoding/json"
	sandgate "github.com/sandgate/sandgate/sdk/go"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rawCreate posts a create and returns the status, the Retry-After
// header and the body.
func (e *testEnv) rawCreate(t testing.TB, key string, req map[string]any) (int, string, []byte) {
	t.Helper()
	raw, _ := json.Marshal(req)
	r, _ := http.NewRequest("POST", e.gwURL+"/v1/sessions", bytes.NewReader(raw))
	r.Header.Set("Authorization", "Bearer "+key)
	r.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 12 * time.Minute}).Do(r)
	if err != nil {
		t.Errorf("create: %v", err)
		return 0, "", nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), body
}

type usageInfo struct {
	Sessions      int     `json:"sessions"`
	CPUs          float64 `json:"cpus"`
	MemoryMB      int     `json:"memory_mb"`
	Queued        int     `json:"queued"`
	MaxSessions   int     `json:"max_sessions"`
	MaxMemoryMB   int     `json:"max_memory_mb"`
	ArtifactBytes int64   `json:"artifact_bytes"`
}

func (e *testEnv) usage(t testing.TB, key string) usageInfo {
	t.Helper()
	status, body := e.api(t, key, "GET", "/v1/usage", nil)
	var u usageInfo
	if status != 200 || json.Unmarshal(body, &u) != nil {
		t.Fatalf("usage: %d %s", status, body)
	}
	return u
}

// metric reads one unlabelled (or fully labelled) line of /metrics.
func (e *testEnv) metric(t testing.TB, name string) float64 {
	t.Helper()
	_, body := e.api(t, "", "GET", "/metrics", nil)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %q", name, line)
			}
			return f
		}
	}
	t.Fatalf("no metric %s in:\n%s", name, body)
	return 0
}

func checkRetryAfter(t testing.TB, status int, retry string, body []byte) {
	t.Helper()
	n, err := strconv.Atoi(retry)
	if status != 429 || !bytes.Contains(body, []byte(`"quota_exceeded"`)) || err != nil || n < 1 || n > 30 {
		t.Fatalf("want 429 quota_exceeded with Retry-After 1..30: %d %q %s", status, retry, body)
	}
}

// TestQuota: tenant B (2 sessions) at its quota. A create that does not
// wait gets 429 with Retry-After; one that waits starts when a session of
// the tenant ends; one whose wait runs out gets 429; tenant A is not held
// up meanwhile; bad waits are refused.
func TestQuota(t *testing.T) {
	e := needE2E(t)
	if u := e.usage(t, e.keyB); u.Sessions != 0 || u.MaxSessions != 2 {
		t.Fatalf("tenant B before: %+v", u)
	}
	first := e.createSession(t, e.keyB, nil)
	e.createSession(t, e.keyB, nil)
	if u := e.usage(t, e.keyB); u.Sessions != 2 || u.CPUs <= 0 || u.MemoryMB <= 0 {
		t.Fatalf("tenant B at its quota: %+v", u)
	}

	status, retry, body := e.rawCreate(t, e.keyB, map[string]any{})
	checkRetryAfter(t, status, retry, body)
	status, retry, body = e.rawCreate(t, e.keyB, map[string]any{"wait_seconds": 0})
	checkRetryAfter(t, status, retry, body)

	// A wait that runs out.
	t0 := time.Now()
	status, retry, body = e.rawCreate(t, e.keyB, map[string]any{"wait_seconds": 1})
	checkRetryAfter(t, status, retry, body)
	if d := time.Since(t0); d < time.Second {
		t.Fatalf("a 1 s wait gave up after %s", d)
	}

	// A client that hangs up while it waits leaves the line.
	hung := make(chan error, 1)
	go func() {
		r, _ := http.NewRequest("POST", e.gwURL+"/v1/sessions", strings.NewReader(`{"wait_seconds":300}`))
		r.Header.Set("Authorization", "Bearer "+e.keyB)
		r.Header.Set("Content-Type", "application/json")
		_, err := (&http.Client{Timeout: 2 * time.Second}).Do(r)
		hung <- err
	}()
	if err := <-hung; err == nil {
		t.Fatal("the create answered within 2 s while the tenant was full")
	}
	for deadline := time.Now().Add(30 * time.Second); e.usage(t, e.keyB).Queued != 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a create whose client hung up still waits in line after 30 s")
		}
	}

	// A wait that ends with the session.
	type result struct {
		status int
		body   []byte
		at     time.Time
	}
	done := make(chan result, 1)
	waits := e.metric(t, `sandgate_create_queue_waits_total{result="admitted"}`)
	go func() {
		status, _, body := e.rawCreate(t, e.keyB, map[string]any{"wait_seconds": 300, "labels": map[string]string{"test": t.Name()}})
		done <- result{status, body, time.Now()}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for e.usage(t, e.keyB).Queued != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the waiting create is not in the queue after 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if q := e.metric(t, "sandgate_create_queue"); q != 1 {
		t.Fatalf("sandgate_create_queue %v while one waits", q)
	}
	// While it waits, another create of B is refused at once (it does
	// not jump the line), and tenant A is unaffected.
	status, retry, body = e.rawCreate(t, e.keyB, map[string]any{})
	checkRetryAfter(t, status, retry, body)
	e.createSession(t, e.keyA, nil)
	select {
	case r := <-done:
		t.Fatalf("the waiting create answered while the tenant was full: %d %s", r.status, r.body)
	default:
	}

	ended := time.Now()
	if status, body := e.api(t, e.keyB, "DELETE", "/v1/sessions/"+first.ID, nil); status != 200 {
		t.Fatalf("delete: %d %s", status, body)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("the waiting create did not start within 5 minutes of a slot freeing")
	}
	var s sessionInfo
	if r.status != 201 || json.Unmarshal(r.body, &s) != nil || s.State != "running" {
		t.Fatalf("the waiting create: %d %s", r.status, r.body)
	}
	t.Cleanup(func() { e.api(t, e.keyB, "DELETE", "/v1/sessions/"+s.ID, nil) })
	if s.CreatedAt.Before(ended.Add(-time.Second)) {
		t.Fatalf("the waiting session was created at %v, before the slot freed at %v", s.CreatedAt, ended)
	}
	t.Logf("admitted %s after the slot freed (answered %s after)", s.CreatedAt.Sub(ended).Round(time.Millisecond), r.at.Sub(ended).Round(time.Millisecond))
	if got := e.metric(t, `sandgate_create_queue_waits_total{result="admitted"}`); got != waits+1 {
		t.Fatalf("admitted waits %v, want %v", got, waits+1)
	}
	if u := e.usage(t, e.keyB); u.Sessions != 2 || u.Queued != 0 {
		t.Fatalf("tenant B after: %+v", u)
	}

	for _, w := range []any{-1, 601, "5", 1.5} {
		st, body := e.api(t, e.keyB, "POST", "/v1/sessions", map[string]any{"wait_seconds": w})
		if st != 400 || !bytes.Contains(body, []byte("invalid_argument")) {
			t.Fatalf("wait_seconds %v: %d %s", w, st, body)
		}
	}
	if u := e.usage(t, e.keyB); u.Sessions != 2 {
		t.Fatalf("bad creates changed tenant B's usage: %+v", u)
	}
}

// TestQuotaMemoryAndCapacity: a tenant's memory quota and the gateway's
// capacity refuse creates that the session count alone would let in, and
// a full gateway says so in /readyz; each beside the create that fits.
func TestQuotaMemoryAndCapacity(t *testing.T) {
	e := needE2E(t)
	e.withGatewayConfig(t, func(c map[string]any) {
		c["capacity"] = map[string]any{"max_sessions": 2}
		for _, tn := range c["tenants"].([]any) {
			if tn := tn.(map[string]any); tn["name"] == "tenant-a" {
				tn["max_memory_mb"] = 3072
			}
		}
	})
	if st, body := e.api(t, "", "GET", "/readyz", nil); st != 200 {
		t.Fatalf("readyz with room: %d %s", st, body)
	}
	e.createSession(t, e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 2048}})
	status, retry, body := e.rawCreate(t, e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 2048}})
	checkRetryAfter(t, status, retry, body)
	if !bytes.Contains(body, []byte("3072 MB")) {
		t.Fatalf("the refusal does not say which quota: %s", body)
	}
	e.createSession(t, e.keyA, map[string]any{"resources": map[string]any{"memory_mb": 1024}})
	if u := e.usage(t, e.keyA); u.MemoryMB != 3072 || u.MaxMemoryMB != 3072 {
		t.Fatalf("tenant A: %+v", u)
	}

	// Two sessions on a gateway of two: full, for every tenant.
	status, retry, body = e.rawCreate(t, e.keyC, map[string]any{})
	checkRetryAfter(t, status, retry, body)
	if !bytes.Contains(body, []byte("capacity")) {
		t.Fatalf("the refusal does not say the gateway is full: %s", body)
	}
	st, body := e.api(t, "", "GET", "/readyz", nil)
	if st != 503 || !bytes.Contains(body, []byte("full")) {
		t.Fatalf("readyz when full: %d %s", st, body)
	}
	if c := e.metric(t, "sandgate_capacity_sessions"); c != 2 {
		t.Fatalf("sandgate_capacity_sessions %v", c)
	}
}

// TestQuotaSDK: the Go SDK reports a refusal over quota as
// IsQuotaExceeded with the gateway's Retry-After, and the tenant's usage.
func TestQuotaSDK(t *testing.T) {
	e := needE2E(t)
	c := sandgate.New(e.gwURL, e.keyC)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := c.CreateSession(ctx, sandgate.SessionRequest{Labels: map[string]string{"test": t.Name()}})
	if err != nil {
		t.Fatalf("the tenant's one session: %v", err)
	}
	defer c.DeleteSession(context.Background(), s.ID)
	u, err := c.Usage(ctx)
	if err != nil || u.Sessions != 1 || u.MaxSessions != 1 {
		t.Fatalf("usage %+v %v", u, err)
	}
	_, err = c.CreateSession(ctx, sandgate.SessionRequest{WaitSeconds: 1})
	var se *sandgate.Error
	if !sandgate.IsQuotaExceeded(err) || !errors.As(err, &se) || se.RetryAfter < time.Second || se.Status != 429 {
		t.Fatalf("a second session of a tenant of one: %v", err)
	}
	if sandgate.IsQuotaExceeded(nil) || sandgate.IsQuotaExceeded(errors.New("quota_exceeded")) {
		t.Fatal("IsQuotaExceeded holds for what is not the gateway's refusal")
	}
}

// TestMoreQuotas: recordings at once, creates a minute and artifact
// bytes, on a tenant made for it; each refusal beside the create that
// fits.
func TestMoreQuotas(t *testing.T) {
	e := needE2E(t)
	name := "quota-" + randHex(4)
	e.admin(t, "POST", "/tenants", map[string]any{"name": name, "max_recordings": 1, "max_creates_per_minute": 3, "max_artifact_bytes": 1}, 201, nil)
	defer e.api(t, e.adminKey, "PATCH", "/admin/v1/tenants/"+name, map[string]any{"disabled": true})
	var k adminKey
	e.admin(t, "POST", "/tenants/"+name+"/keys", map[string]any{}, 201, &k)

	// Under runc: the three creates must fall within one minute even on a
	// machine where a gVisor start takes twenty seconds.
	runc := func(m map[string]any) map[string]any { m["runtime"] = "runc"; return m }
	t0 := time.Now()
	// Recordings: one at a time; a session that does not record is not held.
	rec := e.createSession(t, k.APIKey, runc(map[string]any{"record": true}))
	st, retry, body := e.rawCreate(t, k.APIKey, runc(map[string]any{"record": true}))
	checkRetryAfter(t, st, retry, body)
	if !bytes.Contains(body, []byte("records 1")) {
		t.Fatalf("the refusal does not say which quota: %s", body)
	}
	e.createSession(t, k.APIKey, runc(map[string]any{}))
	// Three creates a minute (two admitted and the refused one's
	// reservation did not count): the third is admitted, the fourth not.
	e.createSession(t, k.APIKey, runc(map[string]any{}))
	st, retry, body = e.rawCreate(t, k.APIKey, runc(map[string]any{}))
	if time.Since(t0) > 50*time.Second {
		t.Fatalf("three runc creates took %s: the minute's window cannot be tested on this machine", time.Since(t0))
	}
	if n, _ := strconv.Atoi(retry); st != 429 || n < 1 || n > 60 || !bytes.Contains(body, []byte("in the last minute")) {
		t.Fatalf("the fourth create in a minute: %d %q %s", st, retry, body)
	}
	if u := e.usage(t, k.APIKey); u.Sessions != 3 {
		t.Fatalf("usage %+v", u)
	}

	// Artifact bytes: the recording session's screenshot takes the
	// tenant's whole byte; once the count sees it, creates are refused.
	if st, body := e.api(t, k.APIKey, "POST", "/v1/sessions/"+rec.ID+"/screenshot", nil); st != 201 {
		t.Fatalf("screenshot: %d %s", st, body)
	}
	var u struct {
		ArtifactBytes int64 `json:"artifact_bytes"`
	}
	for deadline := time.Now().Add(2 * time.Minute); u.ArtifactBytes <= 0; time.Sleep(time.Second) {
		_, raw := e.api(t, k.APIKey, "GET", "/v1/usage", nil)
		json.Unmarshal(raw, &u)
		if time.Now().After(deadline) {
			t.Fatalf("usage never counted the screenshot: %s", raw)
		}
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		st, retry, body = e.rawCreate(t, k.APIKey, map[string]any{})
		if st == 429 && bytes.Contains(body, []byte("artifacts take")) {
			if n, _ := strconv.Atoi(retry); n < 1 {
				t.Fatalf("no Retry-After: %q", retry)
			}
			break
		}
		if st == 201 {
			t.Fatalf("a create over the artifact quota was admitted: %s", body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the artifact quota never refused: %d %s", st, body)
		}
	}
}
