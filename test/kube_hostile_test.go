package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubeHostileRecording: recordings are made by whichever replica
// takes them, the one standing by too, so a session's display is read by
// a replica that serves no API. Two recorded desktop sessions, one
// recorded by each replica (the control: each records its display
// first), replace their VNC servers with one that announces a
// 65535x65535 screen and sends it. A view-only viewer that B carries,
// standing by, is cut with the reason (before the attack it saw the
// display), and a screenshot action B takes is refused (503; before the
// attack it was taken). A browser session replaces its Chromium with
// one that sends a message past the gateway's bound (fakeCDP): the CDP
// connections B carries are cut with the reason, which reaches the
// leader's trail (before the attack, its Chromium answered through B).
// Each holder gives up with the reason,
// which reaches the session's trail through the lease; both replicas stay
// up, the one standing by still standing by, neither grows; the sessions
// end, and no lease is left.
func TestKubeHostileRecording(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b, ra, rb, pods, roles, start := kubeReplicaPair(t, ctx)
	prog := buildStatic(t, fakeVNC)
	startLeading(t, ra, "A", start, roles, pods[ra])
	start(rb, "B")

	var ids []string
	holders := map[string]*testEnv{}
	for i := 0; i < 2; i++ {
		st, body := ra.api(t, ra.keyA, "POST", "/v1/sessions", map[string]any{"kind": "desktop", "runtime": "runc", "record": true})
		var s sessionInfo
		if err := json.Unmarshal(body, &s); st != 201 || err != nil || s.State != "running" {
			t.Fatalf("create a recorded desktop: %d %s", st, body)
		}
		t.Cleanup(func() { ra.api(t, ra.keyA, "DELETE", "/v1/sessions/"+s.ID, nil) })
		ids = append(ids, s.ID)
		holders[s.ID] = recordingHolder(t, ctx, b, s.ID, ra, rb)
		ra.waitEvent(t, s.ID, "recording_started", time.Minute)
	}
	// (TestKubeReplicas holds the spreading to account; here it only
	// decides which replica meets the attack.)
	if holders[ids[0]] == holders[ids[1]] {
		t.Logf("both recordings are on replica %s: only it meets the attack", holders[ids[0]].gwAddr)
	}
	// The control: each holder has stored a segment of its display.
	for _, id := range ids {
		waitFor(t, time.Minute, "a segment of "+id, func() bool { return recordingSegments(t, ra, id) > 0 })
	}

	// The control: a view-only viewer B carries, standing by, sees the
	// first session's display.
	viaB := func(u string) string { return strings.Replace(u, ra.gwAddr, rb.gwAddr, 1) }
	control := ra.vncPreview(t, ra.keyA, ids[0], "vnc", true, 300)
	control.URL = viaB(control.URL)
	crfb, cconn := rfbThroughGateway(t, control)
	if _, err := crfb.Capture(); err != nil {
		t.Fatalf("a viewer through B before the attack: %v", err)
	}
	cconn.Close()
	// A screenshot action through B reads the display over VNC itself
	// (a new connection each: B carries a connection whole).
	fresh := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	shot := func() (int, []byte) {
		return callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/sessions/"+ids[0]+"/actions", map[string]any{"action": "screenshot"})
	}
	if st, body := shot(); st != 200 {
		t.Fatalf("a screenshot action through B before the attack: %d %.200s", st, body)
	}

	rss0 := map[*testEnv]int64{}
	for _, r := range []*testEnv{ra, rb} {
		rss0[r], _ = r.gatewayMemory(t)
	}
	for _, id := range ids {
		if st, body := ra.api(t, ra.keyA, "PUT", "/v1/sessions/"+id+"/files?path=/home/sandgate/workspace/fakevnc", prog); st/100 != 2 {
			t.Fatalf("upload: %d %s", st, body)
		}
		ra.runInBackground(t, id, "chmod +x ~/workspace/fakevnc && "+takeOverDisplay+"exec ~/workspace/fakevnc")
	}
	for _, id := range ids {
		waitFor(t, time.Minute, "the fake VNC server of "+id, func() bool {
			out := ra.execIn(t, ra.keyA, id, map[string]any{"cmd": []string{"sh", "-c", "test -e /tmp/fakevnc.ready && echo ready || true"}})
			return strings.Contains(string(out.Stdout), "ready")
		})
	}
	// A view-only viewer B carries is cut with the reason, as the
	// leader's are.
	viewerCut(t, viaB(ra.vncPreview(t, ra.keyA, ids[0], "vnc", true, 300).URL))
	// (The viewer may read the close before B has logged it.)
	waitFor(t, 10*time.Second, "B's log to show the viewer it carried cut for the screen", func() bool {
		return logLines(rb, "vnc connection closing", "65535x65535") > 0
	})
	// So is a screenshot action B takes: refused with the reason, B
	// unharmed (below).
	if st, body := shot(); st != 503 || !bytes.Contains(body, []byte(`"code":"unavailable"`)) {
		t.Errorf("a screenshot action through B of the 65535x65535 screen: %d %.300s, want 503", st, body)
	}
	for _, id := range ids {
		ra.waitEvent(t, id, "recording_interrupted", time.Minute)
		failed := ra.waitEvent(t, id, "recording_failed", 2*time.Minute)
		if !strings.Contains(fmt.Sprint(failed["reason"]), "65535x65535") {
			t.Errorf("recording_failed of %s (recorded by %s) says %v", id, holders[id].gwAddr, failed)
		}
	}
	if st, body := getBody(t, ra.gwURL+"/readyz"); st != 200 || !strings.Contains(body, `"ready"`) {
		t.Errorf("A after the attack: %d %s", st, body)
	}
	if st, body := getBody(t, rb.gwURL+"/readyz"); st != 200 || !strings.Contains(body, "standby") {
		t.Errorf("B after the attack: %d %s", st, body)
	}
	for _, r := range []*testEnv{ra, rb} {
		rss, peak := r.gatewayMemory(t)
		t.Logf("replica %s: RSS %d MiB before the attack, %d MiB after, peak %d MiB", r.gwAddr, rss0[r]>>20, rss>>20, peak>>20)
		if rss-rss0[r] > 64<<20 {
			t.Errorf("replica %s grew by %d MiB", r.gwAddr, (rss-rss0[r])>>20)
		}
	}
	for _, r := range []*testEnv{ra, rb} {
		if !bytes.Contains(readFile(t, r.gwLog), []byte("65535x65535")) {
			t.Errorf("replica %s's log does not show the refused screen", r.gwAddr)
		}
	}

	// The sessions end as usual: their recordings (what was recorded
	// before the attack) are finished, and no lease is left.
	for _, id := range ids {
		if st, body := ra.api(t, ra.keyA, "DELETE", "/v1/sessions/"+id, nil); st != http.StatusOK {
			t.Fatalf("delete %s: %d %s", id, st, body)
		}
	}
	for _, id := range ids {
		waitFor(t, 2*time.Minute, "the recording of "+id+" to be finished and its lease to go", func() bool {
			_, err := b.Client().CoordinationV1().Leases(b.Namespace()).Get(ctx, "sandgate-recording-"+id, metav1.GetOptions{})
			return apierrors.IsNotFound(err) && findKind(ra.artifacts(t, ra.keyA, id), "recording", "video/mp4") != nil
		})
	}

	// Then, the recorded sessions gone (the cluster's two cores hold
	// no third session beside them), a browser session (the other
	// tenant's: the first's most sessions may not have ended yet). The
	// control: its Chromium answers through B.
	st, body := ra.api(t, ra.keyB, "POST", "/v1/sessions", map[string]any{"runtime": "runc"})
	var browserSession sessionInfo
	if err := json.Unmarshal(body, &browserSession); st != 201 || err != nil || browserSession.State != "running" {
		t.Fatalf("create a browser session: %d %s", st, body)
	}
	bs := browserSession.ID
	t.Cleanup(func() { ra.api(t, ra.keyB, "DELETE", "/v1/sessions/"+bs, nil) })
	wsB := viaB(browserWS(t, ra.preview(t, ra.keyB, bs, 300).URL))
	cb := cdpDial(t, wsB)
	if err := cdpTry(cb, 1); err != nil {
		t.Fatalf("CDP through B before the attack: %v", err)
	}
	cb.Close()

	rssB, _ := rb.gatewayMemory(t)
	if st, body := ra.api(t, ra.keyB, "PUT", "/v1/sessions/"+bs+"/files?path=/home/sandgate/workspace/fakecdp", buildStatic(t, fakeCDP)); st/100 != 2 {
		t.Fatalf("upload: %d %s", st, body)
	}
	ra.runInBackgroundAs(t, ra.keyB, bs, "chmod +x ~/workspace/fakecdp && "+takeOverBrowser+"exec ~/workspace/fakecdp")
	// A browser that sends a message past the bound behind a CDP
	// connection B carries: the connection is cut with the reason, as
	// the leader's are, and the reason reaches the leader's trail.
	waitFor(t, time.Minute, "the fake browser of "+bs, func() bool {
		out := ra.execIn(t, ra.keyB, bs, map[string]any{"cmd": []string{"sh", "-c", "test -e /tmp/fakecdp.ready && echo ready || true"}})
		return strings.Contains(string(out.Stdout), "ready")
	})
	cdpPastBound(t, wsB)
	waitFor(t, 30*time.Second, "both connections' preview_closed with the reason in the leader's trail", func() bool {
		return closedPastBound(t, ra, ra.keyB, bs) == 2
	})
	if n := logLines(rb, "cdp connection closing", pastBound); n != 2 {
		t.Errorf("B's log has %d CDP connections cut for the bound, want 2", n)
	}
	if st, body := getBody(t, rb.gwURL+"/readyz"); st != 200 || !strings.Contains(body, "standby") {
		t.Errorf("B after the browser's attack: %d %s", st, body)
	}
	rss, peak := rb.gatewayMemory(t)
	t.Logf("B: RSS %d MiB before the browser's attack, %d MiB after, peak %d MiB", rssB>>20, rss>>20, peak>>20)
	if rss-rssB > 64<<20 {
		t.Errorf("B grew by %d MiB for the browser's attack", (rss-rssB)>>20)
	}
}
