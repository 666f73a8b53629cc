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
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"

	"github.com/sandgate/sandgate/session/kube"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubeReplicas runs two gateway replicas on one namespace of the
// trial cluster, each with an address the other reaches and a Pod of its
// own (a stand-in running pause: the replicas run on the host). One
// leads, and labels its Pod so; the other stands by (ready while there
// is a leader) and forwards what it is sent. A leader takes the label
// off the Pods that carry it as it comes to lead, and a replica that
// stands by takes it off its own; the egress proxy's Service of
// deploy/kubernetes sends to no stand-in Pod, where no proxy answers
// the leader's probe.
// A session created through the leader is driven through the other:
// CDP with chromedp, a VNC viewer, exec, files, a screenshot, a preview
// revoked. The leader is then SIGKILLed mid-session: meanwhile the other
// answers a create from a profile 503 in the API's JSON (only a leader
// makes one), then takes the lead, and the session,
// its previews (the revoked one stays revoked), its audit trail and its
// recording carry on through it, and its Pod is the leader's. The
// recordings are spread: of two recorded sessions, each replica records
// one, whichever leads; the one A recorded is taken over by B when A
// dies, the one B recorded goes on uncut, and B, leading then, finishes
// a recording made by both; what A had not stored as it died is in a
// recording too (A stores it as it starts again, or finishes it once it
// leads). Then A,
// started again, stands by, and B is stopped as a rolling update
// stops it (SIGTERM): A takes over at once, not when the lease runs
// out. Nothing is left in the namespace.
func TestKubeReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b, ra, rb, pods, roles, start := kubeReplicaPair(t, ctx)
	// A replica whose Pod does not exist does not start (it could not
	// carry the leader's label), naming it.
	missing := exec.CommandContext(ctx, ra.bin, "serve", "-config", ra.cfgPath, "-pod", "gw-missing")
	if out, err := missing.CombinedOutput(); err == nil || !strings.Contains(string(out), "gw-missing") {
		t.Errorf("a replica whose Pod does not exist: %v\n%s", err, out)
	}
	// A label left on B's Pod, as by a replica that led there before
	// its container restarted: the proxy's Service would send there
	// (the control). A, coming to lead, takes it off.
	roles.label(t, pods[rb])
	roles.waitLeader(t, "a stale label on B's Pod", pods[rb])
	start(ra, "A")
	waitFor(t, time.Minute, "replica A to lead (ready)", func() bool { return httpStatus(ra.gwURL+"/readyz") == 200 })
	roles.waitLeader(t, "A leads", pods[ra])
	roles.waitPending(t, pods[ra])
	// Again, now that A has looked for stale labels (it took that one
	// off, so its one look is over and it will not take this one off):
	// B, standing by, takes it off itself.
	roles.label(t, pods[rb])
	roles.waitLeader(t, "a stale label on B's Pod, again", pods[ra], pods[rb])
	start(rb, "B")
	roles.waitLeader(t, "B stands by", pods[ra])
	// B's config changes while it stands by (a key for a tenant only it
	// will know): it must lead with the config as it is then.
	lateKey := "sg_late_" + randHex(12)
	rb.mu.Lock()
	rb.tokens = append(rb.tokens, lateKey)
	rb.mu.Unlock()
	patchConfig(t, rb, func(c map[string]any) {
		c["tenants"] = append(c["tenants"].([]any), map[string]any{"name": "tenant-late", "api_key_sha256": []string{sha([]byte(lateKey))}, "max_sessions": 1})
	})
	// B stands by: alive, and ready (it forwards to A), so the API's
	// Service may send there; its answers are its own.
	if st, body := getBody(t, rb.gwURL+"/healthz"); st != 200 || !strings.Contains(body, "standby") {
		t.Fatalf("B's healthz: %d %s", st, body)
	}
	if st, body := getBody(t, rb.gwURL+"/readyz"); st != 200 || !strings.Contains(body, "standby") {
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
	// A config that names a session's Pod as the gateway's: refused, so
	// the proxy's Service never sends to a session.
	if err := b.MarkLeader(ctx, "sandgate-"+s.ID); err == nil || !strings.Contains(err.Error(), "session") {
		t.Errorf("the leader's label on a session's Pod: %v, want it refused", err)
	}
	viaB := func(u string) string { return strings.Replace(u, ra.gwAddr, rb.gwAddr, 1) }

	// Recordings are spread over the replicas: the session's is taken
	// by one, a second session's by the other.
	recorder := recordingHolder(t, ctx, b, s.ID, ra, rb)
	st, body = ra.api(t, ra.keyA, "POST", "/v1/sessions", map[string]any{"runtime": "runc", "record": true})
	var s2 sessionInfo
	if err := json.Unmarshal(body, &s2); st != 201 || err != nil {
		t.Fatalf("a second recorded session through A: %d %s", st, body)
	}
	other := recordingHolder(t, ctx, b, s2.ID, ra, rb)
	t.Logf("the first recording is on replica %s, the second on %s", recorder.gwAddr, other.gwAddr)
	if other == recorder {
		t.Errorf("both recordings are on one replica (%s): they are not spread", other.gwAddr)
	}
	// Each carries on through A's death below: the one on A is taken
	// over by B, the one on B goes on uncut.
	waitFor(t, time.Minute, "a segment of the second recording", func() bool { return recordingParts(t, ra, s2.ID) >= 1 })

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
			t.Fatalf("%s: chromedp: navigate: %v", when, err)
		}
		if got, err := chromedp.Run(cctx, chromedp.Evaluate[int](`window.answer`)); err != nil || got != answer {
			t.Fatalf("%s: chromedp: answer %d, %v", when, got, err)
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
	// What A had not stored of the recording it held: the segment it
	// was writing, at least.
	onA := s.ID
	if recorder == rb {
		onA = s2.ID
	}
	leftover := unstoredSegments(t, ra, onA)
	t.Logf("A left %d segments of %s unstored: %v", len(leftover), onA, leftover)
	// Meanwhile B answers, with 503 in the API's JSON, until it leads.
	var waits []int
	waitFor(t, 3*time.Minute, "B to take the session over", func() bool {
		led, st, body := leaderAnswers(t, rb, rb.keyA)
		if led {
			return true
		}
		if st != 503 || jsonErrorCode(string(body)) != "unavailable" {
			t.Fatalf("B while A is dead: %d %s, want 503 unavailable", st, body)
		}
		waits = append(waits, st)
		return false
	})
	took := time.Since(killed)
	if st, body := rb.api(t, rb.keyA, "GET", "/v1/sessions/"+s.ID, nil); st != 200 || jsonField(body, "state") != "running" {
		t.Errorf("the session through B, leading: %d %s", st, body)
	}
	t.Logf("B served the session %.1f s after A was killed (the lease lasts %s); %d answers of 503 meanwhile", took.Seconds(), kube.HoldDuration, len(waits))
	// The lease runs out 15 s after B last saw it renewed; the adoption
	// is quick. A bound with room for a slow machine.
	if took > 60*time.Second {
		t.Errorf("the takeover took %.1f s", took.Seconds())
	}
	if st := httpStatus(rb.gwURL + "/readyz"); st != 200 {
		t.Errorf("B leads, but its readyz says %d", st)
	}
	roles.waitLeader(t, "B leads", pods[rb])

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
	// The recordings go on: the one A had is taken over by B (a part
	// of B's own, whose prefix is not A's, and recording_taken_over in
	// its trail); the one B had is not cut.
	onB := s2.ID
	if onA == s2.ID {
		onB = s.ID
	}
	waitFor(t, 2*time.Minute, "a segment from B of the recording A had", func() bool { return recordingParts(t, rb, onA) >= 2 })
	waitFor(t, time.Minute, "recording_taken_over in the trail of the recording A had", func() bool {
		for _, ev := range rb.events(t, rb.keyA, onA) {
			if ev.Type == "recording_taken_over" {
				return true
			}
		}
		return false
	})
	before := recordingSegments(t, rb, onB)
	waitFor(t, 2*time.Minute, "more segments of the recording B had", func() bool { return recordingSegments(t, rb, onB) >= before+2 })
	if n := recordingParts(t, rb, onB); n != 1 {
		t.Errorf("the recording B held was cut by A's death: %d parts", n)
	}
	// B, placing the recordings again as it took the lead, started none:
	// each session's trail says recording_started once.
	for _, id := range []string{s.ID, s2.ID} {
		n := 0
		for _, ev := range rb.events(t, rb.keyA, id) {
			if ev.Type == "recording_started" {
				n++
			}
		}
		if n != 1 {
			t.Errorf("session %s's trail says recording_started %d times after B took the lead, want once", id, n)
		}
	}
	parts := 1 // of the first session's recording, so far
	if onA == s.ID {
		parts = 2
	}
	// The second session ends through B, which leads: its recording is
	// finished by B from what both replicas stored.
	if st, body := rb.api(t, rb.keyA, "DELETE", "/v1/sessions/"+s2.ID, nil); st != 200 {
		t.Fatalf("delete the second session: %d %s", st, body)
	}
	waitFor(t, 2*time.Minute, "the second recording finished", func() bool {
		as := rb.artifacts(t, rb.keyA, s2.ID)
		return findKind(as, "recording", "video/mp4") != nil && findKind(as, "recording", "application/json") != nil
	})
	_, m2 := rb.finalRecording(t, rb.keyA, s2.ID)
	made2 := map[string]bool{}
	for _, sg := range m2["segments"].([]any) {
		name := sg.(map[string]any)["name"].(string)
		made2[name[:strings.IndexByte(name, '-')]] = true
	}
	if want := map[bool]int{true: 2, false: 1}[onA == s2.ID]; len(made2) != want {
		t.Errorf("the second recording has %d parts, want %d: %v", len(made2), want, made2)
	}
	finalised := false
	for _, ev := range rb.events(t, rb.keyA, s2.ID) {
		finalised = finalised || ev.Type == "recording_finalised"
		if ev.Type == "recording_failed" {
			t.Errorf("the second recording failed: %v", ev.Fields)
		}
	}
	if !finalised {
		t.Error("the second session's trail has no recording_finalised")
	}
	waitFor(t, time.Minute, "the second recording's lease to go", func() bool {
		_, err := b.Client().CoordinationV1().Leases(b.Namespace()).Get(ctx, "sandgate-recording-"+s2.ID, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})

	// A rolling update: A, started again, stands by; B is stopped with
	// SIGTERM. It gives the lease back once its trails and recordings
	// are stored, and A takes over without waiting for the lease to run
	// out.
	start(ra, "A (again)")
	waitFor(t, time.Minute, "A to stand by, ready", func() bool {
		st, body := getBody(t, ra.gwURL+"/readyz")
		return st == 200 && strings.Contains(body, "standby")
	})
	// A stores, as it starts, what its last run left of a recording
	// still under way (B records it now), for the recording's end to
	// join. (Of one whose session ended meanwhile, it keeps them: see
	// the end.)
	if onA == s.ID {
		waitFor(t, time.Minute, "the segments A left to be stored", func() bool {
			stored := map[string]bool{}
			for _, a := range rb.artifacts(t, rb.keyA, s.ID) {
				stored[a.Name] = a.Kind == "recording_segment"
			}
			for name := range leftover {
				if !stored[name] {
					return false
				}
			}
			return true
		})
		// (Each is marked stored on the host just after its upload.)
		waitFor(t, 30*time.Second, "A's host to keep none of the segments it stored", func() bool {
			return len(unstoredSegments(t, ra, onA)) == 0
		})
	}
	// A leads once its own readyz says so: "ready", not "standby"
	// (what it answers through B meanwhile is B's).
	termed := time.Now()
	proc := rb.gw.Process
	proc.Signal(syscall.SIGTERM)
	var exited time.Duration // when B was seen to have exited
	waitFor(t, 4*time.Minute, "A to lead, B having stopped", func() bool {
		if exited == 0 && proc.Signal(syscall.Signal(0)) != nil {
			exited = time.Since(termed)
		}
		st, body := getBody(t, ra.gwURL+"/readyz")
		return st == 200 && strings.Contains(body, `"ready"`)
	})
	led := time.Since(termed)
	if exited == 0 {
		exited = led // A led while B was still exiting
	}
	rb.stopGateway(syscall.SIGTERM)
	t.Logf("SIGTERM to B: B exited after %.1f s, A led after %.1f s (a lease not given back runs out %s after its last renewal)", exited.Seconds(), led.Seconds(), kube.HoldDuration)
	// Not given back, the lease would hold A off for at least two
	// thirds of its duration after B's exit (B renews every third).
	if led-exited >= kube.HoldDuration/2 {
		t.Errorf("A led %.1f s after B exited: B did not give the lease back", (led - exited).Seconds())
	}
	if st, body := ra.api(t, ra.keyA, "GET", "/v1/sessions/"+s.ID, nil); st != 200 || jsonField(body, "state") != "running" {
		t.Fatalf("the session through A, after the handover: %d %s", st, body)
	}
	roles.waitLeader(t, "A leads again", pods[ra])
	p.URL = strings.Replace(p.URL, rb.gwAddr, ra.gwAddr, 1)
	cdp("after the handover", 44)
	// B gave the recording back as it stopped: A records the next part
	// before the session ends.
	parts++
	waitFor(t, 2*time.Minute, "a recording segment from A after the handover", func() bool { return recordingParts(t, ra, s.ID) >= parts })
	if st, body := ra.api(t, ra.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != 200 {
		t.Fatalf("delete through A: %d %s", st, body)
	}
	waitFor(t, 2*time.Minute, "the session's Pod to go", func() bool {
		pods, err := b.List(ctx)
		return err == nil && len(pods) == 0
	})
	evs := ra.events(t, ra.keyA, s.ID)
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
	rpath, manifest := ra.finalRecording(t, ra.keyA, s.ID)
	made := map[string]bool{}
	for _, sg := range manifest["segments"].([]any) {
		name := sg.(map[string]any)["name"].(string)
		made[name[:strings.IndexByte(name, '-')]] = true
	}
	d := probeDuration(t, rpath)
	t.Logf("the recording across the kill and the handover: %.1f s in %d parts", d, len(made))
	if len(made) < parts {
		t.Errorf("the recording did not go on through B, then A: parts %v, want %d", made, parts)
	}

	// What A left of the recording it held is in a recording: the
	// first session's (A stored it as it started), or one of the second
	// session's own (A's janitor finished it, as A leads, and the trail
	// says so).
	var nonEmpty []string
	for name, size := range leftover {
		if size > 0 {
			nonEmpty = append(nonEmpty, name)
		}
	}
	if onA == s2.ID && len(nonEmpty) > 0 {
		waitFor(t, 3*time.Minute, "A's janitor to finish the segments A left of the second session", func() bool {
			return len(recordedSegments(t, ra, s2.ID)) > len(m2["segments"].([]any))
		})
		waitFor(t, time.Minute, "the second session's stored trail to say recording_finalised for each recording", func() bool {
			return strings.Count(strings.Join(storedTrailTypes(t, ra, s2.ID), " "), "recording_finalised") == 2
		})
	}
	in := recordedSegments(t, ra, onA)
	for _, name := range nonEmpty {
		if !in[name] {
			t.Errorf("segment %s, which A left, is in no recording of %s", name, onA)
		}
	}
	if len(nonEmpty) == 0 {
		t.Logf("A left no segment with content (killed as a segment began): nothing to look for")
	}

	// Nothing left: A gives the lease back as it stops.
	ra.stopGateway(syscall.SIGTERM)
	var left []string
	deadline := time.Now().Add(time.Minute)
	for {
		l, err := b.Client().CoordinationV1().Leases(b.Namespace()).List(ctx, metav1.ListOptions{})
		left = left[:0]
		if err == nil {
			for _, le := range l.Items {
				left = append(left, le.Name)
			}
		}
		if err == nil && len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Leases left in the namespace a minute after the last replica stopped: %v, %v", left, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
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

// gatewayRoles: stand-ins for the Pods of gateway replicas that run on
// the host, and the egress proxy's Service of deploy/kubernetes, which
// selects them all.
type gatewayRoles struct {
	b      *kube.Backend
	ctx    context.Context
	egress string // the Service's name
	pods   []string
}

// kubePauseImage is the trial cluster's sandbox image (cluster.sh), in
// its containerd: a container that runs and does nothing.
const kubePauseImage = "sandgate.local/pause:1"

// kubeReplicaPair configures two gateway replicas on a namespace of the
// trial cluster of their own, as TestKubeReplicas describes (recording in
// segments of 2 s), with stand-in Pods: start runs one, and stops it at
// the test's end.
func kubeReplicaPair(t testing.TB, ctx context.Context) (b *kube.Backend, ra, rb *testEnv, pods map[*testEnv]string, roles *gatewayRoles, start func(r *testEnv, name string)) {
	t.Helper()
	e := needE2E(t)
	kubeconfig := needKube(t)
	b = kubeNamespace(t, kubeconfig)
	gwKubeconfig := kubeGatewayIdentity(t, b, kubeconfig)
	rec := map[string]any{"recording": map[string]any{"segment": "2s"}}
	ra = kubeGatewayConfig(t, e, gwKubeconfig, b, rec)
	rb = kubeGatewayConfig(t, e, gwKubeconfig, b, rec)
	pods = map[*testEnv]string{ra: "gw-a", rb: "gw-b"}
	roles = gatewayStandIns(t, ctx, b, pods[ra], pods[rb])
	for _, r := range []*testEnv{ra, rb} {
		r.adminKey = e.adminKey
		patchConfig(t, r, func(c map[string]any) {
			c["kubernetes"].(map[string]any)["advertise"] = r.gwAddr
			c["kubernetes"].(map[string]any)["pod"] = pods[r]
			c["hosts"] = []string{ra.gwAddr, rb.gwAddr}
			c["admin_key_sha256"] = []string{sha([]byte(e.adminKey))}
		})
	}
	start = func(r *testEnv, name string) {
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
	return b, ra, rb, pods, roles, start
}

// startLeading starts replica r (named name) and waits until it leads:
// ready, its Pod (pod) labelled the leader's.
func startLeading(t testing.TB, r *testEnv, name string, start func(*testEnv, string), roles *gatewayRoles, pod string) {
	t.Helper()
	start(r, name)
	waitFor(t, time.Minute, "replica "+name+" to lead (ready)", func() bool { return httpStatus(r.gwURL+"/readyz") == 200 })
	roles.waitLeader(t, name+" leads", pod)
}

// gatewayStandIns makes a running Pod for each name, labelled as the
// Deployment labels the gateway's, and the egress proxy's Service.
func gatewayStandIns(t testing.TB, ctx context.Context, b *kube.Backend, names ...string) *gatewayRoles {
	t.Helper()
	r := &gatewayRoles{b: b, ctx: ctx, pods: names}
	var gw *appsv1.Deployment
	for _, obj := range kubeManifest(t, "../deploy/kubernetes/gateway.yaml") {
		switch o := obj.(type) {
		case *appsv1.Deployment:
			gw = o
		case *corev1.Service:
			if len(o.Spec.Ports) == 1 && o.Spec.Ports[0].TargetPort.StrVal == "egress" {
				o.Namespace = b.Namespace()
				if _, err := b.Client().CoreV1().Services(b.Namespace()).Create(ctx, o, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				r.egress = o.Name
			}
		}
	}
	if gw == nil || r.egress == "" {
		t.Fatal("gateway.yaml: no Deployment or no egress Service")
	}
	never := false
	for _, name := range names {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: gw.Spec.Template.Labels},
			Spec: corev1.PodSpec{
				AutomountServiceAccountToken: &never,
				Containers: []corev1.Container{{Name: "gateway", Image: kubePauseImage, ImagePullPolicy: corev1.PullNever,
					Ports: []corev1.ContainerPort{{Name: "egress", ContainerPort: 3128}}}},
			},
		}
		if _, err := b.Client().CoreV1().Pods(b.Namespace()).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 2*time.Minute, "the gateway replicas' stand-in Pods to run", func() bool {
		for _, name := range names {
			p, err := b.Client().CoreV1().Pods(b.Namespace()).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				return false
			}
		}
		return true
	})
	return r
}

// label puts the leader's label on a Pod, as a replica that led there.
func (r *gatewayRoles) label(t testing.TB, name string) {
	t.Helper()
	pods := r.b.Client().CoreV1().Pods(r.b.Namespace())
	p, err := pods.Get(r.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels[kube.LabelGatewayRole] = kube.RoleLeader
	if _, err := pods.Update(r.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitLeader waits until the leader's label is on exactly these Pods,
// and the egress proxy's Service sends to none: the leader, probing the
// stand-in Pods' IPs, where no proxy answers, never labels one serving
// (TestKubeDeployment shows the other side, with the replicas in their
// Pods; waitPending that a replica labels its own).
func (r *gatewayRoles) waitLeader(t testing.TB, when string, names ...string) {
	t.Helper()
	var labelled, endpoints, pending, serving []string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		labelled, endpoints, pending, serving = nil, nil, nil, nil
		for _, n := range r.pods {
			p, err := r.b.Client().CoreV1().Pods(r.b.Namespace()).Get(r.ctx, n, metav1.GetOptions{})
			if err == nil && p.Labels[kube.LabelGatewayRole] == kube.RoleLeader {
				labelled = append(labelled, n)
			}
			if err == nil && p.Labels[kube.LabelEgress] == kube.EgressPending {
				pending = append(pending, n)
			}
			if err == nil && p.Labels[kube.LabelEgress] == kube.EgressServing {
				serving = append(serving, n)
			}
		}
		eps, err := r.b.Client().DiscoveryV1().EndpointSlices(r.b.Namespace()).List(r.ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + r.egress})
		if err == nil {
			for _, sl := range eps.Items {
				for _, ep := range sl.Endpoints {
					if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
						endpoints = append(endpoints, ep.Addresses...)
					}
				}
			}
		}
		if len(serving) > 0 {
			t.Fatalf("%s: stand-in Pods %v, where no proxy answers, are labelled as serving egress", when, serving)
		}
		ok := len(labelled) == len(names) && len(endpoints) == 0
		for _, n := range labelled {
			ok = ok && slices.Contains(names, n)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the leader's label is on %v, the egress label pending on %v, and the egress Service sends to %v; want the label on %v, egress to none", when, labelled, pending, endpoints, names)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitPending waits until the stand-in Pod name is labelled as pending
// egress: its replica's proxy listens (the replicas share the host's
// network: the first to start holds the address).
func (r *gatewayRoles) waitPending(t testing.TB, name string) {
	t.Helper()
	waitFor(t, time.Minute, name+" labelled as its replica's proxy listening", func() bool {
		p, err := r.b.Client().CoreV1().Pods(r.b.Namespace()).Get(r.ctx, name, metav1.GetOptions{})
		return err == nil && p.Labels[kube.LabelEgress] == kube.EgressPending
	})
}

// recordingHolder is the replica of rs that holds the session's
// recording's lease (by its process id, part of its identity).
func recordingHolder(t *testing.T, ctx context.Context, b *kube.Backend, id string, rs ...*testEnv) *testEnv {
	t.Helper()
	var who *testEnv
	waitFor(t, time.Minute, "a replica to hold the recording of "+id, func() bool {
		le, err := b.Client().CoordinationV1().Leases(b.Namespace()).Get(ctx, "sandgate-recording-"+id, metav1.GetOptions{})
		if err != nil || le.Spec.HolderIdentity == nil {
			return false
		}
		for _, r := range rs {
			if strings.Contains(*le.Spec.HolderIdentity, fmt.Sprintf("-%d-", r.gw.Process.Pid)) {
				who = r
				return true
			}
		}
		return false
	})
	return who
}

// unstoredSegments is the segments of the session's recording that the
// replica holds on its host and has not stored, with their sizes.
func unstoredSegments(t *testing.T, e *testEnv, id string) map[string]int64 {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(e.dir, "state", "recordings", "*", id, "*.ts"))
	out := map[string]int64{}
	for _, f := range files {
		fi, err := os.Stat(f)
		if _, uerr := os.Stat(f + ".up"); err == nil && uerr != nil {
			out[filepath.Base(f)] = fi.Size()
		}
	}
	return out
}

// recordedSegments is the set of segments the session's finished
// recordings join, by their manifests.
func recordedSegments(t *testing.T, e *testEnv, id string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, a := range e.artifacts(t, e.keyA, id) {
		if a.Kind != "recording" || a.ContentType != "application/json" {
			continue
		}
		var m struct{ Segments []struct{ Name string } }
		if err := json.Unmarshal(e.fetchArtifact(t, e.keyA, a.ID), &m); err != nil {
			t.Fatalf("a manifest of %s: %v", id, err)
		}
		for _, sg := range m.Segments {
			out[sg.Name] = true
		}
	}
	return out
}

// storedTrailTypes is the types of the events in the session's stored
// audit log, in order.
func storedTrailTypes(t *testing.T, e *testEnv, id string) []string {
	t.Helper()
	log := findKind(e.artifacts(t, e.keyA, id), "log", "")
	if log == nil {
		return nil
	}
	var out []string
	dec := json.NewDecoder(bytes.NewReader(e.fetchArtifact(t, e.keyA, log.ID)))
	for dec.More() {
		var ev struct{ Type string }
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("the stored audit log of %s: %v", id, err)
		}
		out = append(out, ev.Type)
	}
	return out
}

// recordingSegments counts the session's stored recording segments.
func recordingSegments(t *testing.T, e *testEnv, id string) int {
	n := 0
	for _, a := range e.artifacts(t, e.keyA, id) {
		if a.Kind == "recording_segment" {
			n++
		}
	}
	return n
}

// recordingParts counts the parts of a session's recording stored so far
// (one per gateway that recorded it: a segment's name starts with its
// part's).
func recordingParts(t *testing.T, e *testEnv, id string) int {
	parts := map[string]bool{}
	for _, a := range e.artifacts(t, e.keyA, id) {
		if i := strings.IndexByte(a.Name, '-'); a.Kind == "recording_segment" && i > 0 {
			parts[a.Name[:i]] = true
		}
	}
	return len(parts)
}
