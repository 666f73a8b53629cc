package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"
	"github.com/gorilla/websocket"
)

func (e *testEnv) ctx() context.Context {
	return namespaces.WithNamespace(context.Background(), testNamespace)
}

// residue lists what of one session still exists anywhere.
func (e *testEnv) residue(t *testing.T, id string) []string {
	t.Helper()
	var out []string
	ctx := e.ctx()
	if _, err := e.client.LoadContainer(ctx, id); err == nil {
		out = append(out, "container")
	} else if !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
	e.client.SnapshotService("overlayfs").Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		if i.Name == id {
			out = append(out, "snapshot")
		}
		return nil
	})
	if _, err := os.Stat("/run/netns/" + testNamespace + "-" + id); err == nil {
		out = append(out, "netns")
	}
	return out
}

func TestDeleteLeavesNothing(t *testing.T) {
	e := needE2E(t)
	before := len(bridgeVeths())
	s := e.createSession(t, e.keyA, nil)
	if r := e.residue(t, s.ID); len(r) != 3 || len(bridgeVeths()) != before+1 {
		t.Fatalf("a running session should have container, snapshot, netns and a veth; found %v and %d veths", r, len(bridgeVeths()))
	}
	p := e.preview(t, e.keyA, s.ID, 300)
	c := wsDial(t, browserWS(t, p.URL))
	defer c.Close()
	cdpPing(t, c, 1)
	done := make(chan time.Time, 1)
	go func() { at, _ := closedAt(c, 30*time.Second); done <- at }()

	t0 := time.Now()
	status, body := e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil)
	if status != 200 || jsonField(body, "state") != "stopped" {
		t.Fatalf("delete: %d %s", status, body)
	}
	if at := <-done; at.IsZero() || at.Sub(t0) > time.Second {
		t.Fatalf("the session's CDP WebSocket closed %v after delete began, want within 1s", at.Sub(t0))
	}
	if r := e.residue(t, s.ID); len(r) != 0 {
		t.Fatalf("left behind after delete: %v", r)
	}
	if n := len(bridgeVeths()); n != before {
		t.Fatalf("%d veths on the bridge, want %d", n, before)
	}
	// Deleting again is harmless and says the same.
	status, body = e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil)
	if status != 200 || jsonField(body, "state") != "stopped" {
		t.Fatalf("second delete: %d %s", status, body)
	}
}

func TestTTLReaper(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, map[string]any{"ttl_seconds": 3})
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		_, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID, nil)
		if jsonField(body, "state") == "stopped" {
			if r := e.residue(t, s.ID); len(r) != 0 {
				t.Fatalf("left behind after the TTL: %v", r)
			}
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("the session outlived its TTL")
}

func TestIdleTimeout(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, map[string]any{"idle_timeout_seconds": 3})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		_, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID, nil)
		if jsonField(body, "state") == "stopped" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("an idle session outlived its idle timeout")
}

func TestExtend(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, map[string]any{"ttl_seconds": 60})
	status, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/extend", map[string]any{"ttl_seconds": 600})
	if status != 200 {
		t.Fatalf("extend: %d %s", status, body)
	}
	var got sessionInfo
	json.Unmarshal(body, &got)
	if got.ExpiresAt.Sub(s.ExpiresAt) < 500*time.Second {
		t.Fatalf("expires_at moved from %v to %v", s.ExpiresAt, got.ExpiresAt)
	}
	status, body = e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/extend", map[string]any{"ttl_seconds": 7200})
	if status != 400 || !bytes.Contains(body, []byte("invalid_argument")) {
		t.Fatalf("extend past the tenant's maximum: %d %s", status, body)
	}
}

func TestTenantIsolation(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	for _, req := range []struct{ method, path string }{
		{"GET", "/v1/sessions/" + s.ID},
		{"DELETE", "/v1/sessions/" + s.ID},
		{"POST", "/v1/sessions/" + s.ID + "/previews"},
		{"POST", "/v1/sessions/" + s.ID + "/screenshot"},
		{"POST", "/v1/sessions/" + s.ID + "/extend"},
		{"GET", "/v1/sessions/" + s.ID + "/artifacts"},
	} {
		var body any
		if req.method == "POST" {
			body = map[string]any{"scope": "cdp", "ttl_seconds": 60}
			if strings.HasSuffix(req.path, "extend") {
				body = map[string]any{"ttl_seconds": 60}
			}
		}
		status, raw := e.api(t, e.keyB, req.method, req.path, body)
		if status != 404 {
			t.Errorf("%s %s with another tenant's key: %d %s, want 404", req.method, req.path, status, raw)
		}
	}
	_, raw := e.api(t, e.keyB, "GET", "/v1/sessions", nil)
	if bytes.Contains(raw, []byte(s.ID)) {
		t.Fatal("another tenant lists the session")
	}
	_, raw = e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID, nil)
	if jsonField(raw, "state") != "running" {
		t.Fatalf("the session was harmed: %s", raw)
	}
}

func TestBadInput(t *testing.T) {
	e := needE2E(t)
	_, listBefore := e.api(t, e.keyA, "GET", "/v1/sessions", nil)
	containersBefore, _ := e.client.Containers(e.ctx())

	cases := []struct {
		name   string
		key    string
		method string
		path   string
		body   string
		status int
		code   string
	}{
		{"no-key", "", "GET", "/v1/sessions", "", 401, "unauthenticated"},
		{"bad-key", "sg_wrong", "GET", "/v1/sessions", "", 401, "unauthenticated"},
		{"malformed-json", e.keyA, "POST", "/v1/sessions", `{"kind":`, 400, "invalid_argument"},
		{"not-an-object", e.keyA, "POST", "/v1/sessions", `[1,2]`, 400, "invalid_argument"},
		{"trailing-data", e.keyA, "POST", "/v1/sessions", `{} {}`, 400, "invalid_argument"},
		{"unknown-field", e.keyA, "POST", "/v1/sessions", `{"colour":"red"}`, 400, "invalid_argument"},
		{"unknown-kind", e.keyA, "POST", "/v1/sessions", `{"kind":"tractor"}`, 400, "invalid_argument"},
		{"unknown-runtime", e.keyA, "POST", "/v1/sessions", `{"runtime":"docker"}`, 400, "invalid_argument"},
		{"unusable-runtime", e.keyA, "POST", "/v1/sessions", `{"runtime":"kata"}`, 422, "unavailable_runtime"},
		{"negative-ttl", e.keyA, "POST", "/v1/sessions", `{"ttl_seconds":-5}`, 400, "invalid_argument"},
		{"zero-ttl", e.keyA, "POST", "/v1/sessions", `{"ttl_seconds":0}`, 400, "invalid_argument"},
		{"huge-ttl", e.keyA, "POST", "/v1/sessions", `{"ttl_seconds":99999999999999999}`, 400, "invalid_argument"},
		{"overflowing-ttl", e.keyA, "POST", "/v1/sessions", `{"ttl_seconds":1e300}`, 400, "invalid_argument"},
		{"ttl-over-tenant-max", e.keyA, "POST", "/v1/sessions", `{"ttl_seconds":7201}`, 400, "invalid_argument"},
		{"string-ttl", e.keyA, "POST", "/v1/sessions", `{"ttl_seconds":"ten"}`, 400, "invalid_argument"},
		{"tiny-memory", e.keyA, "POST", "/v1/sessions", `{"resources":{"memory_mb":1}}`, 400, "invalid_argument"},
		{"huge-cpus", e.keyA, "POST", "/v1/sessions", `{"resources":{"cpus":1000}}`, 400, "invalid_argument"},
		{"huge-screen", e.keyA, "POST", "/v1/sessions", `{"screen":{"width":100000,"height":10}}`, 400, "invalid_argument"},
		{"unknown-session", e.keyA, "GET", "/v1/sessions/s-0000000000000000", "", 404, "not_found"},
		{"malformed-session-id", e.keyA, "GET", "/v1/sessions/..%2f..%2fetc", "", 404, "not_found"},
		{"preview-unknown-scope", e.keyA, "POST", "/v1/sessions/s-0000000000000000/previews", `{"scope":"root"}`, 400, "invalid_argument"},
		{"create-preview-unknown-scope", e.keyA, "POST", "/v1/sessions", `{"preview":{"scope":"root"}}`, 400, "invalid_argument"},
		{"create-preview-no-scope", e.keyA, "POST", "/v1/sessions", `{"preview":{}}`, 400, "invalid_argument"},
		{"create-preview-view-only-cdp", e.keyA, "POST", "/v1/sessions", `{"preview":{"scope":"cdp","view_only":true}}`, 400, "invalid_argument"},
		{"create-preview-long-ttl", e.keyA, "POST", "/v1/sessions", `{"preview":{"scope":"cdp","ttl_seconds":99999999}}`, 400, "invalid_argument"},
		{"create-preview-unknown-field", e.keyA, "POST", "/v1/sessions", `{"preview":{"scope":"cdp","colour":"red"}}`, 400, "invalid_argument"},
		{"create-preview-no-wait", e.keyA, "POST", "/v1/sessions?wait=false", `{"preview":{"scope":"cdp"}}`, 400, "invalid_argument"},
		{"unknown-artifact", e.keyA, "GET", "/v1/artifacts/s-0000000000000000.0000000000000000", "", 404, "not_found"},
		{"malformed-artifact", e.keyA, "GET", "/v1/artifacts/..", "", 404, "not_found"},
		{"unknown-route", e.keyA, "GET", "/v1/nothing", "", 404, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, e.gwURL+tc.path, strings.NewReader(tc.body))
			if tc.key != "" {
				req.Header.Set("Authorization", "Bearer "+tc.key)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatalf("status %d, body not the JSON error: %v", resp.StatusCode, err)
			}
			if resp.StatusCode != tc.status || body.Error.Code != tc.code || body.Error.Message == "" {
				t.Fatalf("got %d %q %q, want %d %q", resp.StatusCode, body.Error.Code, body.Error.Message, tc.status, tc.code)
			}
			if tc.key != "" && strings.Contains(body.Error.Message, tc.key) {
				t.Fatal("the error echoes the API key")
			}
		})
	}
	t.Run("oversized-body", func(t *testing.T) {
		conn, err := net.Dial("tcp", e.gwAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /v1/sessions HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", e.gwAddr, e.keyA, 2<<20)
		go conn.Write(bytes.Repeat([]byte(" "), 2<<20))
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 413 || !bytes.Contains(body, []byte(`"code":"invalid_argument"`)) {
			t.Fatalf("oversized body: %d %s", resp.StatusCode, body)
		}
	})
	_, listAfter := e.api(t, e.keyA, "GET", "/v1/sessions", nil)
	if !bytes.Equal(listBefore, listAfter) {
		t.Fatalf("bad requests changed the session list:\n%s\n%s", listBefore, listAfter)
	}
	containersAfter, _ := e.client.Containers(e.ctx())
	if len(containersAfter) != len(containersBefore) {
		t.Fatalf("bad requests left containers: %d before, %d after", len(containersBefore), len(containersAfter))
	}
}

// TestGatewayRestart kills the gateway with SIGKILL and starts it again:
// running sessions come back with their expiry and their preview tokens;
// an expired session and a stray namespace are removed.
func TestGatewayRestart(t *testing.T) {
	e := needE2E(t)
	short := e.createSession(t, e.keyA, map[string]any{"ttl_seconds": 4})
	long := e.createSession(t, e.keyA, map[string]any{"ttl_seconds": 600})
	p := e.preview(t, e.keyA, long.ID, 600)
	stray := testNamespace + "-s-00000000deadbeef"
	if out, err := exec.Command("ip", "netns", "add", stray).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", stray).Run()

	e.stopGateway(syscall.SIGKILL)
	// Let the short session expire while nobody watches it.
	time.Sleep(time.Until(short.ExpiresAt) + 500*time.Millisecond)
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}

	status, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+long.ID, nil)
	var got sessionInfo
	json.Unmarshal(body, &got)
	if status != 200 || got.State != "running" || !got.ExpiresAt.Equal(long.ExpiresAt) {
		t.Fatalf("after restart: %d %s (expires_at was %v)", status, body, long.ExpiresAt)
	}
	c := wsDial(t, browserWS(t, p.URL))
	cdpPing(t, c, 7)
	c.Close()

	if status, _ := e.api(t, e.keyA, "GET", "/v1/sessions/"+short.ID, nil); status != 404 {
		t.Fatalf("expired session after restart: %d, want 404", status)
	}
	if r := e.residue(t, short.ID); len(r) != 0 {
		t.Fatalf("the expired session left %v", r)
	}
	if _, err := os.Stat("/run/netns/" + stray); err == nil {
		t.Fatal("the stray network namespace was not removed")
	}
}

// TestDeleteWhileStarting cancels a create half way: everything it had
// made is rolled back.
func TestDeleteWhileStarting(t *testing.T) {
	e := needE2E(t)
	before := len(bridgeVeths())
	status, body := e.api(t, e.keyA, "POST", "/v1/sessions?wait=false", map[string]any{"labels": map[string]string{"test": t.Name()}})
	if status != 201 || jsonField(body, "state") != "starting" {
		t.Fatalf("async create: %d %s", status, body)
	}
	id := jsonField(body, "id")
	time.Sleep(150 * time.Millisecond) // inside the start: network and container exist
	status, body = e.api(t, e.keyA, "DELETE", "/v1/sessions/"+id, nil)
	if status != 200 || jsonField(body, "state") != "stopped" {
		t.Fatalf("delete while starting: %d %s", status, body)
	}
	if r := e.residue(t, id); len(r) != 0 {
		t.Fatalf("a cancelled start left %v", r)
	}
	if n := len(bridgeVeths()); n != before {
		t.Fatalf("%d veths on the bridge, want %d", n, before)
	}
	if _, err := os.Stat(e.dir + "/state/sessions/" + id); err == nil {
		t.Fatal("a cancelled start left its workspace")
	}
}

// TestCLI drives the client subcommands the way a person would.
func TestCLI(t *testing.T) {
	e := needE2E(t)
	run := func(args ...string) (string, string) {
		t.Helper()
		cmd := exec.Command(e.bin, args...)
		cmd.Env = append(os.Environ(), "SANDGATE_URL="+e.gwURL, "SANDGATE_API_KEY="+e.keyA)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("sandgate %v: %v\n%s", args, err, stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	out, progress := run("session", "create", "-ttl", "120", "-label", "test=cli")
	id := jsonField([]byte(out), "id")
	t.Cleanup(func() { e.api(t, e.keyA, "DELETE", "/v1/sessions/"+id, nil) })
	if jsonField([]byte(out), "state") != "running" || !strings.Contains(progress, "starting") || !strings.Contains(progress, "running after") {
		t.Fatalf("create printed:\n%s\n%s", progress, out)
	}
	out, _ = run("session", "preview", id, "-ttl", "60")
	if !strings.HasPrefix(jsonField([]byte(out), "url"), e.gwURL+"/cdp/") {
		t.Fatalf("preview: %s", out)
	}
	e.mu.Lock()
	e.tokens = append(e.tokens, jsonField([]byte(out), "url")[len(e.gwURL+"/cdp/"):])
	e.mu.Unlock()
	file := t.TempDir() + "/shot.png"
	run("session", "screenshot", id, "-o", file)
	if raw, err := os.ReadFile(file); err != nil || !bytes.HasPrefix(raw, []byte("\x89PNG")) {
		t.Fatalf("screenshot file: %v", err)
	}
	out, _ = run("session", "list")
	if !strings.Contains(out, id) {
		t.Fatalf("list: %s", out)
	}
	out, _ = run("session", "delete", id)
	if jsonField([]byte(out), "state") != "stopped" {
		t.Fatalf("delete: %s", out)
	}
}

// TestCreateWithPreview: a create can ask for a preview, and a client
// connects to its ws_url at once, with no discovery request; a vnc
// preview has no ws_url. (TestBadInput has the refusals, none of which
// leaves a session.)
func TestCreateWithPreview(t *testing.T) {
	e := needE2E(t)
	st, body := e.api(t, e.keyA, "POST", "/v1/sessions", map[string]any{"preview": map[string]any{"scope": "cdp", "ttl_seconds": 120}})
	if st != 201 {
		t.Fatalf("create: %d %s", st, body)
	}
	var s struct {
		ID, State string
		Preview   *struct {
			ID, URL, Scope string
			WSURL          string    `json:"ws_url"`
			ExpiresAt      time.Time `json:"expires_at"`
		}
	}
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil) })
	if s.State != "running" || s.Preview == nil || s.Preview.Scope != "cdp" || s.Preview.WSURL == "" {
		t.Fatalf("the answer: %s", body)
	}
	if left := time.Until(s.Preview.ExpiresAt); left < 100*time.Second || left > 121*time.Second {
		t.Errorf("the preview expires in %v, want about 120 s", left)
	}
	c, _, err := websocket.DefaultDialer.Dial(s.Preview.WSURL, nil)
	if err != nil {
		t.Fatalf("dial ws_url %s: %v", s.Preview.WSURL, err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if err := c.WriteJSON(map[string]any{"id": 1, "method": "Browser.getVersion"}); err != nil {
		t.Fatal(err)
	}
	var m struct {
		ID     int
		Result struct{ Product string }
	}
	if err := c.ReadJSON(&m); err != nil || m.ID != 1 || m.Result.Product == "" {
		t.Fatalf("Browser.getVersion over ws_url: %+v %v", m, err)
	}
	// The preview is the session's like any other: in its trail, and
	// listed URL-for-URL the same as one asked for apart.
	e.waitEvent(t, s.ID, "preview_issued", 5*time.Second)
	if ws := browserWS(t, s.Preview.URL); !strings.HasPrefix(ws, strings.TrimSuffix(s.Preview.WSURL, "/")) {
		t.Errorf("discovery through the preview URL gives %s, not under ws_url %s", ws, s.Preview.WSURL)
	}
	// A vnc preview with a create has no ws_url.
	st, body = e.api(t, e.keyA, "POST", "/v1/sessions", map[string]any{"preview": map[string]any{"scope": "vnc", "view_only": true}})
	if st != 201 {
		t.Fatalf("create with a vnc preview: %d %s", st, body)
	}
	var v struct {
		ID      string
		Preview map[string]any
	}
	json.Unmarshal(body, &v)
	t.Cleanup(func() { e.api(t, e.keyA, "DELETE", "/v1/sessions/"+v.ID, nil) })
	if v.Preview["scope"] != "vnc" || v.Preview["view_only"] != true || v.Preview["ws_url"] != nil {
		t.Errorf("the vnc preview: %v", v.Preview)
	}
}
