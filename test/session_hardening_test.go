package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAuditTrailFlood: a session floods the egress proxy with thousands of
// denied requests; its exec afterwards is still in the trail, the flood is
// marked as truncated, and the stored trail counts what was not kept.
func TestAuditTrailFlood(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	const flood = 3000
	// One curl, URL globbing: every request goes through http_proxy and
	// is denied (other.sandgate.test is off the allow list).
	script := fmt.Sprintf(`mkdir -p /tmp/flood && curl -s -w '%%{http_code}\n' -o '/tmp/flood/#1' 'http://other.sandgate.test/[1-%d]' | sort | uniq -c`, flood)
	out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"bash", "-c", script}, "timeout_seconds": 600})
	t.Logf("flood: exit %d, answers %q", out.ExitCode, strings.TrimSpace(string(out.Stdout)))
	if !strings.Contains(string(out.Stdout), fmt.Sprintf("%d 403", flood)) {
		t.Fatalf("the flood was not %d denied requests: %q %q", flood, out.Stdout, out.Stderr)
	}
	marker := "after-flood-" + randHex(4)
	if got := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"echo", marker}, "timeout_seconds": 10}); got.ExitCode != 0 {
		t.Fatalf("exec after the flood: %d", got.ExitCode)
	}
	evs := e.events(t, e.keyA, s.ID)
	denied, truncated, execAfter := 0, false, false
	for _, ev := range evs {
		switch ev.Type {
		case "egress_denied":
			denied++
		case "audit_truncated":
			truncated = truncated || ev.Fields["type"] == "egress_denied"
		case "exec":
			execAfter = execAfter || strings.Contains(fmt.Sprint(ev.Fields["argv"]), marker)
		}
	}
	t.Logf("live trail: %d events, %d egress_denied kept of %d, truncation marked %v", len(evs), denied, flood, truncated)
	// Positive control: the flood did reach the trail.
	if denied == 0 {
		t.Fatal("no egress_denied event at all: the flood did not reach the trail")
	}
	if !execAfter {
		t.Error("the exec after the flood is missing from the trail")
	}
	if denied < flood && !truncated {
		t.Errorf("%d of %d denied requests kept and no audit_truncated marker", denied, flood)
	}

	// The stored trail ends with the count of what was not kept.
	if st, body := e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != 200 {
		t.Fatalf("delete: %d %s", st, body)
	}
	var stored []byte
	deadline := time.Now().Add(2 * time.Minute)
	for stored == nil && time.Now().Before(deadline) {
		if a := findKind(e.artifacts(t, e.keyA, s.ID), "log", ""); a != nil {
			stored = e.fetchArtifact(t, e.keyA, a.ID)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if stored == nil {
		t.Fatal("the audit trail was not stored")
	}
	// Chromium's own requests may be denied too: count per type.
	droppedDenied, storedDenied, storedExec, summary := 0.0, 0, false, false
	dec := json.NewDecoder(bytes.NewReader(stored))
	for dec.More() {
		var ev struct {
			Type   string         `json:"type"`
			Fields map[string]any `json:"fields"`
		}
		if err := dec.Decode(&ev); err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case "audit_summary":
			summary = true
			byType, _ := ev.Fields["dropped"].(map[string]any)
			droppedDenied, _ = byType["egress_denied"].(float64)
		case "egress_denied":
			storedDenied++
		case "exec":
			storedExec = true
		}
	}
	if !storedExec {
		t.Error("the stored trail has no exec")
	}
	t.Logf("stored trail: %d egress_denied kept, %v counted in audit_summary", storedDenied, droppedDenied)
	if denied < flood && (!summary || storedDenied+int(droppedDenied) < flood) {
		t.Errorf("stored trail: %d egress_denied kept and %v counted (summary %v); the flood was %d", storedDenied, droppedDenied, summary, flood)
	}
}

// TestTeardownDoesNotBlockReaper: with MinIO away, a session whose end
// cannot be finalised holds up no other session's TTL; once MinIO is back
// its trail arrives all the same.
func TestTeardownDoesNotBlockReaper(t *testing.T) {
	e := needE2E(t)
	first := e.createSession(t, e.keyA, nil)
	second := e.createSession(t, e.keyA, nil)

	back := e.minioAway(t)
	extend := func(id string, ttl int) time.Time {
		st, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+id+"/extend", map[string]any{"ttl_seconds": ttl})
		if st != 200 {
			t.Fatalf("extend: %d %s", st, body)
		}
		var s sessionInfo
		json.Unmarshal(body, &s)
		return s.ExpiresAt
	}
	extend(first.ID, 1)
	// The first session's teardown is under way (its finalisation waiting
	// for MinIO) when the second one's TTL passes.
	waitState(t, e, first.ID, "stopped", 60*time.Second)
	due := extend(second.ID, 2)
	stoppedAt := waitState(t, e, second.ID, "stopped", 3*time.Minute)
	late := stoppedAt.Sub(due)
	t.Logf("second session stopped %.1f s after its TTL with MinIO away", late.Seconds())
	// A teardown (container, snapshot, netns) takes seconds; the audit
	// store's retries take two minutes. Half a minute tells them apart.
	if late > 30*time.Second {
		t.Errorf("the second session stopped %.1f s after its TTL: the first one's finalisation held the reaper", late.Seconds())
	}

	back()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		if findKind(e.artifacts(t, e.keyA, first.ID), "log", "") != nil {
			return
		}
		time.Sleep(time.Second)
	}
	t.Fatal("the first session's audit trail never reached the store after MinIO came back")
}

// waitState polls a session until it is in state and returns when it saw
// it first.
func waitState(t *testing.T, e *testEnv, id, state string, limit time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		st, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+id, nil)
		if st == 200 {
			var s sessionInfo
			json.Unmarshal(body, &s)
			if s.State == state {
				return time.Now()
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("session %s not %s within %s", id, state, limit)
	return time.Time{}
}

// TestRevokedReviewDurable: review links revoked while the session ran
// and after it ended stay revoked across a gateway restart; one never
// revoked keeps working.
func TestRevokedReviewDurable(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	revokedLive := e.vncPreview(t, e.keyA, s.ID, "review", false, 3600)
	revokedEnded := e.vncPreview(t, e.keyA, s.ID, "review", false, 3600)
	control := e.vncPreview(t, e.keyA, s.ID, "review", false, 3600)
	revoke := func(p previewInfo) {
		if st, body := e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID+"/previews/"+p.ID, nil); st != 204 {
			t.Fatalf("revoke: %d %s", st, body)
		}
	}
	get := func(p previewInfo) int {
		resp, err := http.Get(p.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	revoke(revokedLive)
	if st, body := e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != 200 {
		t.Fatalf("delete: %d %s", st, body)
	}
	revoke(revokedEnded)
	check := func(when string) {
		if st := get(control); st != 200 {
			t.Errorf("%s: the unrevoked review link answers %d", when, st)
		}
		for name, p := range map[string]previewInfo{"revoked while running": revokedLive, "revoked after the end": revokedEnded} {
			if st := get(p); st != 401 && st != 403 && st != 404 {
				t.Errorf("%s: the review link %s answers %d", when, name, st)
			}
		}
	}
	check("before the restart")
	e.stopGateway(syscall.SIGTERM)
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}
	check("after the restart")
}

// withGatewayConfig restarts the gateway with a change to its config for
// the rest of the test, and with the original config after it.
func (e *testEnv) withGatewayConfig(t testing.TB, change func(map[string]any)) {
	t.Helper()
	orig, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(orig, &cfg); err != nil {
		t.Fatal(err)
	}
	change(cfg)
	raw, _ := json.Marshal(cfg)
	if err := os.WriteFile(e.cfgPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.WriteFile(e.cfgPath, orig, 0o600)
		e.stopGateway(syscall.SIGTERM)
		if err := e.startGateway(); err != nil {
			t.Errorf("restart the gateway with its own config: %v", err)
		}
	})
	e.stopGateway(syscall.SIGTERM)
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}
}

// TestEndedSessionsForgotten: with a short retention, an ended session
// answers GET while retained and 404 after; its trail is still served
// from the store.
func TestEndedSessionsForgotten(t *testing.T) {
	e := needE2E(t)
	const retention = 3 * time.Second
	e.withGatewayConfig(t, func(c map[string]any) {
		c["sessions"] = map[string]any{"retention": retention.String()}
	})
	s := e.createSession(t, e.keyA, nil)
	if st, body := e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != 200 {
		t.Fatalf("delete: %d %s", st, body)
	}
	ended := time.Now()
	// Positive control: within the retention the stopped session answers.
	if st, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID, nil); st != 200 || !strings.Contains(string(body), `"stopped"`) {
		t.Fatalf("right after the stop: %d %s", st, body)
	}
	deadline := ended.Add(retention + 30*time.Second)
	for {
		st, _ := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID, nil)
		if st == 404 {
			t.Logf("forgotten %.1f s after the stop (retention %s)", time.Since(ended).Seconds(), retention)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ended session still answers %d %.0f s after its stop", st, time.Since(ended).Seconds())
		}
		time.Sleep(200 * time.Millisecond)
	}
	evs := e.events(t, e.keyA, s.ID)
	if len(evs) == 0 || evs[len(evs)-1].Type == "" {
		t.Fatal("the forgotten session's trail is not served from the store")
	}
	found := false
	for _, ev := range evs {
		found = found || ev.Type == "stopped"
	}
	if !found {
		t.Errorf("the stored trail has no stop: %v", evs)
	}

	// A review link of the forgotten session is issued, and revoked,
	// and both are in its stored audit log; another tenant can do
	// neither.
	link := e.vncPreview(t, e.keyA, s.ID, "review", false, 3600)
	get := func() int {
		resp, err := http.Get(link.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// Opened by many at once: each is served, and the view is stored
	// once (the others wait for the one that stores it).
	for i, st := range getAtOnce(link.URL, 16) {
		if st != 200 {
			t.Errorf("the control: the forgotten session's review link, opened by 16 at once, answers %d (%d)", st, i)
		}
	}
	path := "/v1/sessions/" + s.ID + "/previews/" + link.ID
	if st, body := e.api(t, e.keyB, "DELETE", path, nil); st != 404 {
		t.Fatalf("another tenant revoked the review link: %d %s", st, body)
	}
	if st, body := e.api(t, e.keyB, "POST", "/v1/sessions/"+s.ID+"/previews", map[string]any{"scope": "review"}); st != 404 {
		t.Fatalf("another tenant got a review link of the session: %d %s", st, body)
	}
	if st := get(); st != 200 {
		t.Fatalf("the review link answers %d after another tenant's revoke", st)
	}
	if st, body := e.api(t, e.keyA, "DELETE", path, nil); st != 204 {
		t.Fatalf("revoke the forgotten session's review link: %d %s", st, body)
	}
	if st := get(); st != 401 && st != 403 && st != 404 {
		t.Fatalf("the revoked review link answers %d", st)
	}
	evs = e.events(t, e.keyA, s.ID)
	var tail []string
	for _, ev := range evs[max(0, len(evs)-3):] {
		tail = append(tail, ev.Type)
	}
	// The link's views are in it too: its page, opened by 16 at once
	// and again, once.
	if strings.Join(tail, " ") != "preview_issued review_opened preview_revoked" || !found {
		t.Fatalf("the stored trail ends %v, want the issue, one view and the revocation after the stop", tail)
	}
	// It names the viewer by a digest, never by the address that the
	// link's other holders would read.
	if v := evs[len(evs)-2].Fields; v["preview"] != link.ID || !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(fmt.Sprint(v["viewer"])) || v["remote"] != nil {
		t.Errorf("the view's event: %v, want preview %s and a viewer's digest", v, link.ID)
	}
	for _, ev := range evs {
		if strings.Contains(fmt.Sprint(ev.Fields), "127.0.0.1") {
			t.Errorf("the stored trail holds a caller's address: %s %v", ev.Type, ev.Fields)
		}
	}
}
