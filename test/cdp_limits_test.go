package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// cdpClientLimit is the gateway's default bound on one CDP message from a
// client (gateway.DefaultCDPLimits).
const cdpClientLimit = 32 << 20

// gatewayRSS reads the gateway's resident set in bytes (0 when it cannot).
func (e *testEnv) gatewayRSS() int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", e.gw.Process.Pid))
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		var kb int64
		if n, _ := fmt.Sscanf(sc.Text(), "VmRSS: %d kB", &kb); n == 1 {
			return kb << 10
		}
	}
	return 0
}

// cdpCall sends one command and waits for its answer.
func cdpCall(t *testing.T, c *websocket.Conn, id int, method string, params any) (result, cdpErr json.RawMessage) {
	t.Helper()
	if err := c.WriteJSON(map[string]any{"id": id, "method": method, "params": params}); err != nil {
		t.Fatalf("%s: write: %v", method, err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	for {
		var m struct {
			ID     int
			Result json.RawMessage
			Error  json.RawMessage
		}
		if err := c.ReadJSON(&m); err != nil {
			t.Fatalf("%s: read: %v", method, err)
		}
		if m.ID == id {
			return m.Result, m.Error
		}
	}
}

// TestCDPMessageLimit: one client message over the CDP proxy's limit
// closes that connection with 1009 (message too big) and the reason in
// the audit trail, and the gateway's memory does not grow by the message;
// beside it, a normal message and a large one under the limit work, on
// that session, after.
func TestCDPMessageLimit(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	p := e.preview(t, e.keyA, s.ID, 300)
	ws := browserWS(t, p.URL)

	c := wsDial(t, ws)
	cdpPing(t, c, 1) // control: the connection works
	base := e.gatewayRSS()
	if base == 0 {
		t.Fatal("cannot read the gateway's VmRSS")
	}
	var peak int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if r := e.gatewayRSS(); r > peak {
				peak = r
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	// 512 MiB in 1 MiB frames of one message, never held whole here.
	const huge = 512 << 20
	w, err := c.NextWriter(websocket.TextMessage)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("a"), 1<<20)
	sent := 0
	for sent < huge {
		n, err := w.Write(chunk)
		sent += n
		if err != nil {
			break
		}
	}
	w.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var closeErr *websocket.CloseError
	var readErr error
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			continue
		}
		readErr = err
		errors.As(err, &closeErr)
		break
	}
	close(stop)
	wg.Wait()
	c.Close()
	var ne interface{ Timeout() bool }
	if errors.As(readErr, &ne) && ne.Timeout() {
		t.Fatal("the gateway kept the connection open after a message over the limit")
	}
	// The close frame comes first; the reset that follows it (the gateway
	// drops the unread rest) can overtake it in this client's socket.
	if closeErr != nil && closeErr.Code != websocket.CloseMessageTooBig {
		t.Errorf("closed with %v, want 1009 (message too big)", closeErr)
	}
	t.Logf("the connection ended with: %v", readErr)
	if sent >= huge {
		t.Errorf("the gateway read all of a %d-byte message", huge)
	}
	growth := peak - base
	t.Logf("sent %d MiB before the gateway closed; gateway RSS %d MiB before, peak %d MiB (+%d MiB)", sent>>20, base>>20, peak>>20, growth>>20)
	if growth > 4*cdpClientLimit {
		t.Errorf("the gateway grew by %d MiB for one refused message (limit %d MiB)", growth>>20, cdpClientLimit>>20)
	}
	var reason string
	deadline := time.Now().Add(10 * time.Second)
	for reason == "" && time.Now().Before(deadline) {
		for _, ev := range e.events(t, e.keyA, s.ID) {
			if r, _ := ev.Fields["reason"].(string); ev.Type == "preview_closed" && strings.Contains(r, "over the limit") {
				reason = r
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if reason == "" {
		t.Error("no preview_closed event with the reason in the trail")
	}

	// Controls: the session's browser still answers, a message of 4 MiB
	// (under the limit) passes whole.
	c2 := wsDial(t, ws)
	defer c2.Close()
	cdpPing(t, c2, 2)
	target, cerr := cdpCall(t, c2, 3, "Target.createTarget", map[string]any{"url": "about:blank"})
	var tg struct{ TargetID string }
	if cerr != nil || json.Unmarshal(target, &tg) != nil {
		t.Fatalf("createTarget: %s %s", target, cerr)
	}
	att, cerr := cdpCall(t, c2, 4, "Target.attachToTarget", map[string]any{"targetId": tg.TargetID, "flatten": true})
	var sess struct{ SessionID string }
	if cerr != nil || json.Unmarshal(att, &sess) != nil {
		t.Fatalf("attachToTarget: %s %s", att, cerr)
	}
	big := strings.Repeat("b", 4<<20)
	msg, _ := json.Marshal(map[string]any{"id": 5, "sessionId": sess.SessionID, "method": "Runtime.evaluate",
		"params": map[string]any{"expression": "'" + big + "'.length", "returnByValue": true}})
	if err := c2.WriteMessage(websocket.TextMessage, msg); err != nil {
		t.Fatal(err)
	}
	c2.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		var m struct {
			ID     int
			Result struct{ Result struct{ Value int } }
			Error  json.RawMessage
		}
		if err := c2.ReadJSON(&m); err != nil {
			t.Fatalf("a 4 MiB message: %v", err)
		}
		if m.ID == 5 {
			if m.Result.Result.Value != len(big) {
				t.Fatalf("a 4 MiB message: %+v %s", m.Result, m.Error)
			}
			break
		}
	}
	cdpCall(t, c2, 6, "Target.closeTarget", map[string]any{"targetId": tg.TargetID})
}

// TestCDPDownloadBehaviourRefusal: a client cannot deny the downloads of
// the session's default context (the gateway answers with an error and
// forwards nothing); it can set allow with a path of its own (rewritten)
// and deny in a context it created.
func TestCDPDownloadBehaviourRefusal(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	p := e.preview(t, e.keyA, s.ID, 300)
	c := wsDial(t, browserWS(t, p.URL))
	defer c.Close()
	_, cerr := cdpCall(t, c, 1, "Browser.setDownloadBehavior", map[string]any{"behavior": "deny"})
	if !bytes.Contains(cerr, []byte("sandgate keeps the downloads")) {
		t.Errorf("deny in the default context: error %s", cerr)
	}
	if res, cerr := cdpCall(t, c, 2, "Browser.setDownloadBehavior", map[string]any{"behavior": "allow", "downloadPath": "/tmp/elsewhere"}); cerr != nil {
		t.Errorf("allow (control): %s %s", res, cerr)
	}
	ctxRes, cerr := cdpCall(t, c, 3, "Target.createBrowserContext", map[string]any{})
	var bc struct{ BrowserContextID string }
	if cerr != nil || json.Unmarshal(ctxRes, &bc) != nil {
		t.Fatalf("createBrowserContext: %s %s", ctxRes, cerr)
	}
	if res, cerr := cdpCall(t, c, 4, "Browser.setDownloadBehavior", map[string]any{"behavior": "deny", "browserContextId": bc.BrowserContextID}); cerr != nil {
		t.Errorf("deny in a context of the client's: %s %s", res, cerr)
	}
}
