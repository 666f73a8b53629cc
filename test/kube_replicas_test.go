package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"

	"github.com/sandgate/sandgate/session/kube"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubeReplicas runs two gateway replicas on one namespace of the
// trial cluster, each with an address the other reaches. One leads; the
// other stands by (its /readyz says 503) and forwards what it is sent.
// A session created through the leader is driven through the other:
// CDP with chromedp, a VNC viewer, exec, files, a screenshot, a preview
// revoked. The leader is then SIGKILLed mid-session: meanwhile the other
// answers 503 in the API's JSON, then takes the lead, and the session,
// its previews (the revoked one stays revoked), its audit trail and its
// recording carry on through it. Nothing is left in the namespace.
func TestKubeReplicas(t *testing.T) {
	e := needE2E(t)
	kubeconfig := needKube(t)
	b := kubeNamespace(t, kubeconfig)
	gwKubeconfig := kubeGatewayIdentity(t, b, kubeconfig)
	rec := map[string]any{"recording": map[string]any{"segment": "2s"}}
	ra := kubeGatewayConfig(t, e, gwKubeconfig, b, rec)
	rb := kubeGatewayConfig(t, e, gwKubeconfig, b, rec)
	for _, r := range []*testEnv{ra, rb} {
		r.adminKey = e.adminKey
		patchConfig(t, r, func(c map[string]any) {
			c["kubernetes"].(map[string]any)["advertise"] = r.gwAddr
			c["hosts"] = []string{ra.gwAddr, rb.gwAddr}
			c["admin_key_sha256"] = []string{sha([]byte(e.adminKey))}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := func(r *testEnv, name string) {
		t.Helper()
		if err := r.startGateway(); err != nil {
			log, _ := os.ReadFile(r.gwLog)
			t.Fatalf("replica %s: %v\n%s", name, err, log)
		}
		t.Cleanup(func() {
			r.stopGateway(syscall.SIGTERM)
			if t.Failed() {
				log, _ := os.ReadFile(r.gwLog)
				t.Logf("replica %s's log:\n%s", name, log)
			}
			if secrets := r.secretsInLogs(); len(secrets) > 0 {
				t.Errorf("secrets in replica %s's log: %v", name, secrets)
			}
		})
	}
	start(ra, "A")
	waitFor(t, time.Minute, "replica A to lead (ready)", func() bool { return httpStatus(ra.gwURL+"/readyz") == 200 })
	start(rb, "B")
	// B's config changes while it stands by (a key for a tenant only it
	// will know): it must lead with the config as it is then.
	lateKey := "sg_late_" + randHex(12)
	rb.mu.Lock()
	rb.tokens = append(rb.tokens, lateKey)
	rb.mu.Unlock()
	patchConfig(t, rb, func(c map[string]any) {
		c["tenants"] = append(c["tenants"].([]any), map[string]any{"name": "tenant-late", "api_key_sha256": []string{sha([]byte(lateKey))}, "max_sessions": 1})
	})
	// B stands by: alive, not ready, so a Service sends traffic to A.
	if st, body := getBody(t, rb.gwURL+"/healthz"); st != 200 || !strings.Contains(body, "standby") {
		t.Fatalf("B's healthz: %d %s", st, body)
	}
	if st, body := getBody(t, rb.gwURL+"/readyz"); st != 503 || jsonErrorCode(body) != "unavailable" {
		t.Fatalf("B's readyz: %d %s", st, body)
	}

	// A session created through A.
	// (Not createSession: its cleanup would call A, which is killed; the
	// namespace's removal takes the Pod if the test stops early.)
	st, body := ra.api(t, ra.keyA, "POST", "/v1/sessions", map[string]any{"runtime": "runc", "record": true})
	var s sessionInfo
	if err := json.Unmarshal(body, &s); st != 201 || err != nil || s.State != "running" {
		t.Fatalf("create through A: %d %s", st, body)
	}
	viaB := func(u string) string { return strings.Replace(u, ra.gwAddr, rb.gwAddr, 1) }

	// Driven through B.
	if st, body := rb.api(t, rb.keyA, "GET", "/v1/sessions/"+s.ID, nil); st != 200 || jsonField(body, "state") != "running" {
		t.Fatalf("the session through B: %d %s", st, body)
	}
	p := rb.preview(t, rb.keyA, s.ID, 600)
	p.URL = viaB(p.URL)
	cdp := func(when string, answer int) {
		t.Helper()
		actx, acancel := remote.NewAllocator(ctx, browserWS(t, p.URL))
		defer acancel()
		cctx, ccancel := chromedp.NewContext(actx)
		defer ccancel()
		page := fmt.Sprintf(`data:text/html,<title>r</title><body style="background:%%23%02x8040"><script>window.answer=%d</script>`, answer, answer)
		if err := chromedp.Do(cctx, chromedp.Navigate(page)); err != nil {
			t.Fatalf("%s: chromedp through B: navigate: %v", when, err)
		}
		if got, err := chromedp.Run(cctx, chromedp.Evaluate[int](`window.answer`)); err != nil || got != answer {
			t.Fatalf("%s: chromedp through B: answer %d, %v", when, got, err)
		}
	}
	cdp("before the kill", 42)
	vnc := rb.vncPreview(t, rb.keyA, s.ID, "vnc", true, 300)
	vnc.URL = viaB(vnc.URL)
	viewer := func(when string) {
		t.Helper()
		c, conn := rfbThroughGateway(t, vnc)
		defer conn.Close()
		img, err := c.Capture()
		if err != nil || img.Bounds().Dx() == 0 || colours(img) < 2 {
			t.Fatalf("%s: a VNC frame through B: %v", when, err)
		}
	}
	viewer("before the kill")
	out := rb.execIn(t, rb.keyA, s.ID, map[string]any{"cmd": []string{"sh", "-c", "echo via-b; id -u"}})
	if out.ExitCode != 0 || string(out.Stdout) != "via-b\n1000\n" {
		t.Fatalf("exec through B: exit %d %q %q", out.ExitCode, out.Stdout, out.Stderr)
	}
	blob := make([]byte, 1<<20)
	rand.Read(blob)
	path := "/home/sandgate/workspace/r.bin"
	if st, body := rb.putFile(t, s.ID, path, blob); st != 201 {
		t.Fatalf("upload through B: %d %s", st, body)
	}
	if st, got := rb.getFile(t, s.ID, path); st != 200 || !bytes.Equal(got, blob) {
		t.Fatalf("download through B: %d, %d bytes", st, len(got))
	}
	if st, body := rb.api(t, rb.keyA, "POST", "/v1/sessions/"+s.ID+"/screenshot", nil); st != 201 || jsonField(body, "sha256") == "" {
		t.Fatalf("screenshot through B: %d %s", st, body)
	}
	// What the kill must not lose is stored: the trail's exec, and a
	// segment of the recording.
	waitFor(t, time.Minute, "the exec in the stored trail and a recording segment", func() bool {
		if !bytes.Contains(storedTrail(t, ra.profileBucket(t), "tenant-a", s.ID), []byte("via-b")) {
			return false
		}
		st, body := rb.api(t, rb.keyA, "GET", "/v1/sessions/"+s.ID+"/artifacts", nil)
		return st == 200 && bytes.Contains(body, []byte("recording_segment"))
	})

	// Right before the kill, a preview revoked and one issued: a preview
	// the gateway has acknowledged is in the stored trail at once.
	revoked := rb.preview(t, rb.keyA, s.ID, 600)
	revoked.URL = viaB(revoked.URL)
	if !previewAnswers(t, revoked.URL) {
		t.Fatal("a fresh preview does not answer through B (the control of the revocation below)")
	}
	if st, body := rb.api(t, rb.keyA, "DELETE", "/v1/sessions/"+s.ID+"/previews/"+revoked.ID, nil); st != 204 {
		t.Fatalf("revoke through B: %d %s", st, body)
	}
	if previewAnswers(t, revoked.URL) {
		t.Fatal("a preview revoked through B still answers")
	}
	late := rb.preview(t, rb.keyA, s.ID, 600)
	late.URL = viaB(late.URL)
	// A tenant and its keys made through the admin API (through B, to
	// A), one key revoked: none of it is in either replica's config.
	team := "team-" + randHex(4)
	rb.admin(t, "POST", "/tenants", map[string]any{"name": team, "max_sessions": 1}, 201, nil)
	var kept, gone adminKey
	rb.admin(t, "POST", "/tenants/"+team+"/keys", map[string]any{"name": "kept"}, 201, &kept)
	rb.admin(t, "POST", "/tenants/"+team+"/keys", map[string]any{"name": "revoked"}, 201, &gone)
	rb.admin(t, "DELETE", "/tenants/"+team+"/keys/"+gone.ID, nil, 204, nil)
	for _, k := range []*adminKey{&kept, &gone} {
		rb.mu.Lock()
		rb.tokens = append(rb.tokens, k.APIKey)
		rb.mu.Unlock()
	}

	// (The control of the config read again below: A, which leads, does
	// not know the key B's config gained.)
	if st, _ := rb.api(t, lateKey, "GET", "/v1/sessions", nil); st != 401 {
		t.Errorf("the key only B's new config has, through B to A: %d, want 401", st)
	}

	// A is SIGKILLed mid-session.
	killed := time.Now()
	ra.stopGateway(syscall.SIGKILL)
	// Meanwhile B answers, with 503 in the API's JSON, until it leads.
	var waits []int
	waitFor(t, 3*time.Minute, "B to take the session over", func() bool {
		st, body := rb.api(t, rb.keyA, "GET", "/v1/sessions/"+s.ID, nil)
		if st == 200 {
			return jsonField(body, "state") == "running"
		}
		if st != 503 || jsonErrorCode(string(body)) != "unavailable" {
			t.Fatalf("B while A is dead: %d %s, want 503 unavailable", st, body)
		}
		waits = append(waits, st)
		return false
	})
	took := time.Since(killed)
	t.Logf("B served the session %.1f s after A was killed (the lease lasts %s); %d answers of 503 meanwhile", took.Seconds(), kube.HoldDuration, len(waits))
	// The lease runs out 15 s after B last saw it renewed; the adoption
	// is quick. A bound with room for a slow machine.
	if took > 60*time.Second {
		t.Errorf("the takeover took %.1f s", took.Seconds())
	}
	if st := httpStatus(rb.gwURL + "/readyz"); st != 200 {
		t.Errorf("B leads, but its readyz says %d", st)
	}

	// B leads with its config as it is now.
	if st, body := rb.api(t, lateKey, "GET", "/v1/sessions", nil); st != 200 {
		t.Errorf("the key B's config gained while it stood by, after the takeover: %d %s", st, body)
	}
	// B knows what the admin API changed on A (the registry is in MinIO):
	// the kept key works, the revoked one does not.
	if st, body := rb.api(t, kept.APIKey, "GET", "/v1/sessions", nil); st != 200 {
		t.Errorf("a key issued through A, after the takeover: %d %s", st, body)
	}
	if st, _ := rb.api(t, gone.APIKey, "GET", "/v1/sessions", nil); st != 401 {
		t.Errorf("a key revoked through A, after the takeover: %d, want 401", st)
	}

	// The session carries on through B: the same preview, a viewer,
	// exec and the file; the revoked preview stays revoked.
	cdp("after the kill", 43)
	viewer("after the kill")
	if previewAnswers(t, revoked.URL) {
		t.Error("a preview revoked before the kill answers after it")
	}
	// The preview issued the moment before the kill is known to B: it
	// answers, and B revokes it (not "no such preview").
	if !previewAnswers(t, late.URL) {
		t.Error("the preview issued just before the kill does not answer after it")
	}
	if st, body := rb.api(t, rb.keyA, "DELETE", "/v1/sessions/"+s.ID+"/previews/"+late.ID, nil); st != 204 {
		t.Errorf("revoking, after the kill, the preview issued just before it: %d %s", st, body)
	} else if previewAnswers(t, late.URL) {
		t.Error("the preview revoked after the kill still answers")
	}
	if out := rb.execIn(t, rb.keyA, s.ID, map[string]any{"cmd": []string{"sha256sum", path}}); out.ExitCode != 0 || !strings.HasPrefix(string(out.Stdout), sha(blob)) {
		t.Fatalf("the file after the kill: exit %d %q", out.ExitCode, out.Stdout)
	}
	// A segment of B's own recording is stored (its part's prefix is not
	// A's) before the session ends.
	waitFor(t, 2*time.Minute, "a recording segment from B", func() bool {
		parts := map[string]bool{}
		for _, a := range rb.artifacts(t, rb.keyA, s.ID) {
			if i := strings.IndexByte(a.Name, '-'); a.Kind == "recording_segment" && i > 0 {
				parts[a.Name[:i]] = true
			}
		}
		return len(parts) >= 2
	})
	if st, body := rb.api(t, rb.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != 200 {
		t.Fatalf("delete through B: %d %s", st, body)
	}
	waitFor(t, 2*time.Minute, "the session's Pod to go", func() bool {
		pods, err := b.List(ctx)
		return err == nil && len(pods) == 0
	})
	evs := rb.events(t, rb.keyA, s.ID)
	names := map[string]bool{}
	for _, ev := range evs {
		names[ev.Type] = true
	}
	for _, want := range []string{"created", "started", "exec", "file_upload", "screenshot", "preview_issued", "preview_revoked", "adopted", "stopped"} {
		if !names[want] {
			t.Errorf("the trail has no %q event: %v", want, evs)
		}
	}
	raw, _ := json.Marshal(evs)
	if !bytes.Contains(raw, []byte("via-b")) {
		t.Errorf("the trail lost the exec made through B before the kill: %s", raw)
	}
	// The recording: parts from both replicas, in one video.
	rpath, manifest := rb.finalRecording(t, rb.keyA, s.ID)
	parts := map[string]bool{}
	for _, sg := range manifest["segments"].([]any) {
		name := sg.(map[string]any)["name"].(string)
		parts[name[:strings.IndexByte(name, '-')]] = true
	}
	d := probeDuration(t, rpath)
	t.Logf("the recording across the kill: %.1f s in %d parts", d, len(parts))
	if len(parts) < 2 {
		t.Errorf("the recording did not go on through B: parts %v", parts)
	}

	// Nothing left: B gives the lease back as it stops.
	rb.stopGateway(syscall.SIGTERM)
	waitFor(t, time.Minute, "no Leases left in the namespace", func() bool {
		l, err := b.Client().CoordinationV1().Leases(b.Namespace()).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
}

// patchConfig edits a gateway's config file.
func patchConfig(t testing.TB, e *testEnv, edit func(map[string]any)) {
	t.Helper()
	raw, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	edit(c)
	raw, _ = json.MarshalIndent(c, "", "  ")
	if err := os.WriteFile(e.cfgPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

func httpStatus(u string) int {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(u)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func getBody(t testing.TB, u string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func jsonErrorCode(body string) string {
	var e struct {
		Error struct{ Code string }
	}
	json.Unmarshal([]byte(body), &e)
	return e.Error.Code
}

// putFile and getFile move a session's file through the API.
func (e *testEnv) putFile(t testing.TB, id, path string, b []byte) (int, []byte) {
	t.Helper()
	return e.fileRequest(t, "PUT", id, path, bytes.NewReader(b))
}

func (e *testEnv) getFile(t testing.TB, id, path string) (int, []byte) {
	t.Helper()
	return e.fileRequest(t, "GET", id, path, nil)
}

func (e *testEnv) fileRequest(t testing.TB, method, id, path string, body io.Reader) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, e.gwURL+"/v1/sessions/"+id+"/files?path="+url.QueryEscape(path), body)
	req.Header.Set("Authorization", "Bearer "+e.keyA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}
