package test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// fakeCDP is a browser a session can run in its Chromium's place, on
// Chromium's own CDP port (the session's forwarder passes the gateway's
// connections to it): it answers /json/version as Chromium does, and
// on each WebSocket it is sent, once the client has sent a message, one
// message larger than the gateway's bound on a browser's message: on the
// first, announced whole in one frame's header (a terabyte); on the
// others, sent as it comes, in frames of a mebibyte that never end it.
var fakeCDP = strings.NewReplacer("ADDR", "127.0.0.1:9223", "READY", "/tmp/fakecdp.ready").Replace(`package main

import (
	"bufio"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

var conns atomic.Int64

` + fakeMain + `
func serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if !strings.EqualFold(req.Header.Get("Upgrade"), "websocket") {
		body := fmt.Sprintf("{\"Browser\":\"Chrome/999.0.0.0\",\"Protocol-Version\":\"1.3\",\"User-Agent\":\"Mozilla/5.0\",\"V8-Version\":\"1.0\",\"WebKit-Version\":\"537.36\",\"webSocketDebuggerUrl\":\"ws://%s/devtools/browser/00000000-0000-0000-0000-000000000000\"}", req.Host)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
		return
	}
	sum := sha1.Sum([]byte(req.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", base64.StdEncoding.EncodeToString(sum[:]))
	// The attack waits for the client's first message: a connection the
	// gateway dials ahead, before a client comes, is not counted.
	if _, err := br.ReadByte(); err != nil {
		return
	}
	go io.Copy(io.Discard, br)
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = 'a'
	}
	if conns.Add(1) == 1 {
		hdr := []byte{0x81, 127, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint64(hdr[2:], 1<<40)
		c.Write(hdr)
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}
	for op := byte(0x01); ; op = 0x00 { // text, then continuations, none final
		hdr := []byte{op, 127, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint64(hdr[2:], uint64(len(chunk)))
		if _, err := c.Write(append(hdr, chunk...)); err != nil {
			return
		}
	}
}
`)

// takeOverBrowser is what a session runs to replace its own Chromium: it
// holds the loop that restarts the browser (as sandgate-profile does),
// kills the browser, then runs what follows.
const takeOverBrowser = `: >/tmp/.browser-hold && kill -KILL $(cat /tmp/.browser-pid) && `

// TestHostileCDPServer: a session that replaces its Chromium with a
// browser that sends a message past the gateway's bound (128 MiB) has
// each CDP connection cut with the reason, in the session's trail: one
// announced whole in a frame's header is cut at that header; one sent in
// frames that never end it, once the bound is passed (the client got at
// most the bound). The gateway stays up and does not grow, and another
// session's browser still answers through it. The controls: both
// sessions' browsers answered through the gateway before the attack.
// (Under runc: the gateway's side is the same whatever runs the
// session.)
func TestHostileCDPServer(t *testing.T) {
	e := needE2E(t)
	prog := buildStatic(t, fakeCDP)
	s := e.createSession(t, e.keyA, map[string]any{"runtime": "runc"})
	other := e.createSession(t, e.keyA, map[string]any{"runtime": "runc"})
	ws := browserWS(t, e.preview(t, e.keyA, s.ID, 300).URL)
	otherWS := browserWS(t, e.preview(t, e.keyA, other.ID, 300).URL)
	for i, u := range []string{ws, otherWS} {
		c := wsDial(t, u)
		cdpPing(t, c, i+1)
		c.Close()
	}

	if st, body := e.api(t, e.keyA, "PUT", "/v1/sessions/"+s.ID+"/files?path=/home/sandgate/workspace/fakecdp", prog); st/100 != 2 {
		t.Fatalf("upload: %d %s", st, body)
	}
	e.runInBackground(t, s.ID, "chmod +x ~/workspace/fakecdp && "+takeOverBrowser+"exec ~/workspace/fakecdp")
	waitFor(t, 30*time.Second, "the fake browser to listen", func() bool {
		out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"sh", "-c", "test -e /tmp/fakecdp.ready && echo ready || true"}})
		return strings.Contains(string(out.Stdout), "ready")
	})
	rss0, _ := e.gatewayMemory(t)

	cdpPastBound(t, ws)
	waitFor(t, 30*time.Second, "both connections' preview_closed with the reason in the trail", func() bool {
		return closedPastBound(t, e, e.keyA, s.ID) == 2
	})

	e.unharmed(t, rss0)
	c := wsDial(t, otherWS)
	defer c.Close()
	cdpPing(t, c, 3)
	if raw, _ := os.ReadFile(e.gwLog); !strings.Contains(string(raw), pastBound) {
		t.Error("the gateway's log does not have the reason")
	}
}

// browserBound is the gateway's bound on a message from a session's
// browser (gateway.DefaultCDPLimits.BrowserMessage), and pastBound the
// reason a connection cut for it has.
const browserBound = 128 << 20

var pastBound = fmt.Sprintf("the browser sent a message over the limit of %d bytes", browserBound)

// cdpPastBound opens two CDP connections at ws, whose session runs
// fakeCDP, each sending a command and reading what comes: the first
// must be cut at the message's header, before any of it, the second
// once the bound is passed (within it).
func cdpPastBound(t *testing.T, ws string) {
	t.Helper()
	for _, attack := range []string{"announced in one header", "sent in frames"} {
		c := wsDial(t, ws)
		if err := c.WriteJSON(map[string]any{"id": 1, "method": "Target.getTargets"}); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Minute))
		got := int64(0)
		var err error
		for err == nil {
			var r io.Reader
			if _, r, err = c.NextReader(); err == nil {
				var n int64
				n, err = io.Copy(io.Discard, r)
				got += n
			}
		}
		c.Close()
		var ne interface{ Timeout() bool }
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("a message %s: the gateway kept the connection open (%d bytes through)", attack, got)
		}
		t.Logf("a message %s: the client got %d MiB, then %v", attack, got>>20, err)
		if got > browserBound {
			t.Errorf("a message %s: the client got %d bytes, past the bound of %d", attack, got, browserBound)
		}
		if attack == "announced in one header" && got > 0 {
			t.Errorf("a message announced past the bound: the client got %d bytes of it", got)
		}
	}
}

// closedPastBound counts the preview_closed events in session id's
// trail (read with the API key key) whose reason is pastBound.
func closedPastBound(t *testing.T, e *testEnv, key, id string) int {
	n := 0
	for _, ev := range e.events(t, key, id) {
		if ev.Type == "preview_closed" && ev.Fields["reason"] == pastBound {
			n++
		}
	}
	return n
}
