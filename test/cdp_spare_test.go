package test

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// gatewayConnsTo counts the established TCP connections of the host's
// network namespace to addr:port (the gateway is the only process here
// that connects to sessions' addresses in these tests).
func gatewayConnsTo(t testing.TB, addr string, port uint16) int {
	t.Helper()
	ip, err := netip.ParseAddr(addr)
	if err != nil || !ip.Is4() {
		t.Fatalf("session address %q", addr)
	}
	b := ip.As4()
	want := fmt.Sprintf("%02X%02X%02X%02X:%04X", b[3], b[2], b[1], b[0], port)
	raw, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(raw), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && f[2] == want && f[3] == "01" {
			n++
		}
	}
	return n
}

// TestCDPSpare: the gateway dials a connection into a browser session's
// Chromium before any client asks, hands it to the first CDP client
// (which then pays no dial into the sandbox) and dials the next; after
// Chromium restarts, the old one is not handed out and a new one is made
// to the new browser; when the session ends, no connection into its
// address is left.
func TestCDPSpare(t *testing.T) {
	e := needE2E(t)
	// Spares other sessions hold do not change while no client of theirs
	// connects: this session's is the one more.
	spares := func() float64 { return e.metric(t, "sandgate_cdp_spares") }
	before := spares()
	s := e.createSession(t, e.keyA, map[string]any{"runtime": "runc"})
	c, err := e.client.LoadContainer(e.ctx(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	labels, _ := c.Labels(e.ctx())
	addr := labels["sandgate.addr"]
	conns := func() int { return gatewayConnsTo(t, addr, 9222) }
	// The spare is dialled once the session is ready; a browser that has
	// only just started answers its handshake slowly.
	waitFor(t, 60*time.Second, "the session's spare", func() bool { return spares() == before+1 })
	base := conns() // the download watcher's and the spare
	if base < 2 {
		t.Fatalf("%d connections into the session with its spare ready: the count cannot tell", base)
	}
	st, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/previews", map[string]any{"scope": "cdp", "ttl_seconds": 600})
	ws := jsonField(body, "ws_url")
	if st != 201 || ws == "" {
		t.Fatalf("preview: %d %s", st, body)
	}
	used := e.metric(t, "sandgate_cdp_spares_used_total")
	client := wsDial(t, ws)
	cdpPing(t, client, 1)
	if got := e.metric(t, "sandgate_cdp_spares_used_total"); got != used+1 {
		t.Fatalf("spares used: %v after the first client, want %v", got, used+1)
	}
	// The next spare is dialled beside the client's connection.
	waitFor(t, 60*time.Second, "the next spare", func() bool { return spares() == before+1 && conns() == base+1 })
	client.Close()
	second := wsDial(t, ws)
	defer second.Close()
	cdpPing(t, second, 1)
	if got := e.metric(t, "sandgate_cdp_spares_used_total"); got != used+2 {
		t.Fatalf("spares used: %v after the second client, want %v", got, used+2)
	}

	// Chromium restarts: its connections close with it (the open client's
	// tells the gateway it exited). Clients reach the new browser, and a
	// spare follows it.
	out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"sh", "-c", "pkill -KILL -o -x chromium && echo killed"}})
	if string(out.Stdout) != "killed\n" {
		t.Fatalf("kill chromium: %+v", out)
	}
	waitFor(t, time.Minute, "the browser's exit in the trail", func() bool {
		_, raw := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID+"/events", nil)
		return bytes.Contains(raw, []byte(`"browser_exited"`))
	})
	waitFor(t, 2*time.Minute, "a client on the new browser", func() bool {
		c, _, err := websocket.DefaultDialer.Dial(ws, nil)
		if err != nil {
			return false
		}
		defer c.Close()
		if c.WriteJSON(map[string]any{"id": 1, "method": "Browser.getVersion"}) != nil {
			return false
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var m struct{ ID int }
		return c.ReadJSON(&m) == nil && m.ID == 1
	})
	used = e.metric(t, "sandgate_cdp_spares_used_total")
	waitFor(t, 60*time.Second, "a spare to the new browser", func() bool { return spares() == before+1 })
	third := wsDial(t, ws)
	cdpPing(t, third, 1)
	third.Close()
	if got := e.metric(t, "sandgate_cdp_spares_used_total"); got != used+1 {
		t.Fatalf("spares used: %v after the restart, want %v", got, used+1)
	}

	// The session ends: nothing of the gateway's is left connected to
	// its address, which the next session may be given.
	if st, body := e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != 200 {
		t.Fatalf("delete: %d %s", st, body)
	}
	waitFor(t, 60*time.Second, "no connection into the ended session's address", func() bool { return conns() == 0 })
	if got := spares(); got != before {
		t.Errorf("%v spares after the session ended, %v before it", got, before)
	}
}
