package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestKubeRelay: a replica that stands by carries the preview
// connections it is sent (CDP, VNC) itself, straight to the session's
// Pod, asking the leader about each, so they outlive the leader's
// death. Through B, standing by: a CDP connection and a VNC viewer work,
// and B's log, not A's, has them; the leader's trail has their
// preview_connected. A preview revoked through the leader ends the
// connection B carries within seconds (the control: another preview's
// connection goes on). A is SIGKILLed: the connection through A breaks
// (the control), the ones through B go on, answering while nobody leads
// and after B leads; once closed, their preview_closed reaches the new
// leader's trail. A request B cannot sign, and a signed one with a bad
// token, get nothing from the leader's internal routes.
func TestKubeRelay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, ra, rb, pods, roles, start := kubeReplicaPair(t, ctx)
	startLeading(t, ra, "A", start, roles, pods[ra])
	start(rb, "B")
	roles.waitLeader(t, "B stands by", pods[ra])

	st, body := rb.api(t, rb.keyA, "POST", "/v1/sessions", map[string]any{"runtime": "runc"})
	var s sessionInfo
	if err := json.Unmarshal(body, &s); st != 201 || err != nil || s.State != "running" {
		t.Fatalf("create through B: %d %s", st, body)
	}
	viaB := func(u string) string { return strings.Replace(u, ra.gwAddr, rb.gwAddr, 1) }

	// The internal routes answer nothing unsigned, as a route that is
	// not there.
	for _, p := range []string{"/internal/v1/relay/admit", "/internal/v1/relay/sync"} {
		if st, body := ra.api(t, "", "POST", p, map[string]any{"token": "x"}); st != 404 {
			t.Errorf("unsigned POST %s: %d %s, want 404", p, st, body)
		}
	}

	p1 := rb.preview(t, rb.keyA, s.ID, 600)
	p2 := rb.preview(t, rb.keyA, s.ID, 600)
	throughB1 := cdpDial(t, browserWS(t, viaB(p1.URL)))
	defer throughB1.Close()
	throughB2 := cdpDial(t, browserWS(t, viaB(p2.URL)))
	defer throughB2.Close()
	throughA := cdpDial(t, browserWS(t, p1.URL))
	defer throughA.Close()
	for name, c := range map[string]*websocket.Conn{"B, first": throughB1, "B, second": throughB2, "A": throughA} {
		if err := cdpTry(c, 1); err != nil {
			t.Fatalf("CDP through %s: %v", name, err)
		}
	}
	vnc := rb.vncPreview(t, rb.keyA, s.ID, "vnc", true, 300)
	vnc.URL = viaB(vnc.URL)
	rfb, vconn := rfbThroughGateway(t, vnc)
	defer vconn.Close()
	if img, err := rfb.Capture(); err != nil || colours(img) < 2 {
		t.Fatalf("a VNC frame through B: %v", err)
	}
	// B carries them: its log has them, A's has not (A's has the one
	// through A).
	opened := func(r *testEnv, kind, preview string) bool {
		raw, _ := os.ReadFile(r.gwLog)
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.Contains(line, kind+" connection opened") && strings.Contains(line, preview) {
				return true
			}
		}
		return false
	}
	if !opened(rb, "cdp", p2.ID) || !opened(rb, "vnc", vnc.ID) || opened(ra, "cdp", p2.ID) || opened(ra, "vnc", vnc.ID) {
		t.Errorf("B's log should have the CDP connection of %s and the viewer of %s, and A's neither (B: %v %v, A: %v %v)",
			p2.ID, vnc.ID, opened(rb, "cdp", p2.ID), opened(rb, "vnc", vnc.ID), opened(ra, "cdp", p2.ID), opened(ra, "vnc", vnc.ID))
	}
	if !opened(ra, "cdp", p1.ID) {
		t.Errorf("A's log lacks the CDP connection made through it (the control)")
	}
	// The leader's trail has what B reported.
	connected := func(r *testEnv, typ, preview string) bool {
		for _, ev := range r.events(t, r.keyA, s.ID) {
			if ev.Type == typ && ev.Fields["preview"] == preview {
				return true
			}
		}
		return false
	}
	waitFor(t, 30*time.Second, "preview_connected of the connections B carries in the trail", func() bool {
		return connected(ra, "preview_connected", p2.ID) && connected(ra, "preview_connected", vnc.ID)
	})

	// Revoked through the leader: the connection B carries ends.
	revoked := time.Now()
	if st, body := ra.api(t, ra.keyA, "DELETE", "/v1/sessions/"+s.ID+"/previews/"+p2.ID, nil); st != 204 {
		t.Fatalf("revoke: %d %s", st, body)
	}
	waitFor(t, 30*time.Second, "the revoked preview's connection through B to end", func() bool { return cdpTry(throughB2, 2) != nil })
	t.Logf("a revocation ended the connection B carries %.1f s after it was made", time.Since(revoked).Seconds())
	if err := cdpTry(throughB1, 3); err != nil {
		t.Fatalf("the other preview's connection through B after the revocation: %v", err)
	}
	if _, err := browserWSErr(viaB(p2.URL)); err == nil {
		t.Error("the revoked preview answers through B")
	}

	// A dies: what went through A breaks; what B carries goes on, while
	// nobody leads and after.
	killed := time.Now()
	ra.stopGateway(syscall.SIGKILL)
	if err := cdpTry(throughA, 4); err == nil {
		t.Error("the CDP connection through A answers after A was killed")
	}
	if err := cdpTry(throughB1, 5); err != nil {
		t.Fatalf("the CDP connection through B right after A's death: %v", err)
	}
	if _, err := rfb.Capture(); err != nil {
		t.Fatalf("the viewer through B right after A's death: %v", err)
	}
	if st := httpStatus(rb.gwURL + "/readyz"); st == 200 {
		t.Logf("(B answers ready already: it leads %.1f s after the kill)", time.Since(killed).Seconds())
	}
	waitFor(t, 3*time.Minute, "B to lead", func() bool {
		st, body := rb.api(t, rb.keyA, "GET", "/v1/sessions/"+s.ID, nil)
		return st == 200 && jsonField(body, "state") == "running"
	})
	t.Logf("B leads %.1f s after A's death", time.Since(killed).Seconds())
	for i := 6; i < 9; i++ {
		if err := cdpTry(throughB1, i); err != nil {
			t.Fatalf("the CDP connection through B after it took the lead: %v", err)
		}
	}
	if _, err := rfb.Capture(); err != nil {
		t.Fatalf("the viewer through B after it took the lead: %v", err)
	}
	// Closed, they reach the trail of the leader B is now.
	throughB1.Close()
	vconn.Close()
	waitFor(t, 30*time.Second, "preview_closed of the connections B carried", func() bool {
		return connected(rb, "preview_closed", p1.ID) && connected(rb, "preview_closed", vnc.ID)
	})
	if st, body := rb.api(t, rb.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != 200 && st != 204 {
		t.Errorf("delete the session: %d %s", st, body)
	}
}

// cdpDial opens a CDP WebSocket.
func cdpDial(t *testing.T, ws string) *websocket.Conn {
	t.Helper()
	c, resp, err := websocket.DefaultDialer.Dial(ws, nil)
	if err != nil {
		status, body := 0, ""
		if resp != nil {
			status = resp.StatusCode
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			body = string(b)
		}
		t.Fatalf("dial the CDP WebSocket: %v (%d %s)", err, status, body)
	}
	return c
}

// cdpTry sends Browser.getVersion with id and waits (10 s) for its
// answer.
func cdpTry(c *websocket.Conn, id int) error {
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := c.WriteMessage(websocket.TextMessage, []byte(fmt.Sprintf(`{"id":%d,"method":"Browser.getVersion"}`, id))); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, msg, err := c.ReadMessage()
		if err != nil {
			return err
		}
		var m struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
		}
		if json.Unmarshal(msg, &m) == nil && m.ID == id {
			if len(m.Result) == 0 {
				return fmt.Errorf("no result: %s", msg)
			}
			return nil
		}
	}
}
