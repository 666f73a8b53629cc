package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// fakeMain is the main of a fake server a session runs in place of one
// of its own (fakeVNC, fakeCDP): it listens on ADDR once the real
// server has let it go, says it is ready (the file READY), and serves
// each connection (serve).
const fakeMain = `func main() {
	var ln net.Listener
	var err error
	for i := 0; i < 400; i++ { // until the real server's port is free
		if ln, err = net.Listen("tcp", "ADDR"); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		os.Exit(1)
	}
	os.WriteFile("READY", nil, 0o644)
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go serve(c)
	}
}
`

// fakeVNC is a VNC server a session can run on its own port 5900: it
// announces a 65535x65535 screen (16 GiB at 32 bits a pixel), then sends
// an endless update of the whole of it.
var fakeVNC = strings.NewReplacer("ADDR", ":5900", "READY", "/tmp/fakevnc.ready").Replace(`package main

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"time"
)

` + fakeMain + `
func serve(c net.Conn) {
	defer c.Close()
	b := make([]byte, 12)
	c.Write([]byte("RFB 003.008\n"))
	if _, err := io.ReadFull(c, b); err != nil {
		return
	}
	c.Write([]byte{1, 1}) // security None
	if _, err := io.ReadFull(c, b[:1]); err != nil {
		return
	}
	c.Write([]byte{0, 0, 0, 0})
	if _, err := io.ReadFull(c, b[:1]); err != nil { // ClientInit
		return
	}
	init := make([]byte, 24, 24+7)
	binary.BigEndian.PutUint16(init[0:], 65535)
	binary.BigEndian.PutUint16(init[2:], 65535)
	copy(init[4:], []byte{32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0})
	binary.BigEndian.PutUint32(init[20:], 7)
	c.Write(append(init, "hostile"...))
	go io.Copy(io.Discard, c)
	c.Write([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	zero := make([]byte, 1<<16)
	for {
		if _, err := c.Write(zero); err != nil {
			return
		}
	}
}
`)

// buildStatic builds a Go program for the session's machine.
func buildStatic(t *testing.T, src string) []byte {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-trimpath", "-o", "prog", "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "prog"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// runInBackground starts a command in the session through the exec API
// and returns at once; the command ends with the session.
func (e *testEnv) runInBackground(t *testing.T, id, script string) {
	t.Helper()
	e.runInBackgroundAs(t, e.keyA, id, script)
}

// runInBackgroundAs is runInBackground with the API key key.
func (e *testEnv) runInBackgroundAs(t *testing.T, key, id, script string) {
	t.Helper()
	raw, _ := json.Marshal(map[string]any{"cmd": []string{"bash", "-c", script}, "timeout_seconds": 900})
	req, _ := http.NewRequest("POST", e.gwURL+"/v1/sessions/"+id+"/exec", bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			resp.Body.Close()
		}
	}()
}

// takeOverDisplay is what a session runs to replace its own VNC server,
// TigerVNC's Xvnc, which is its display too: it stops the session's entry
// point, Xvnc's parent (which would end the session when the display
// exits), kills Xvnc, then runs what follows.
const takeOverDisplay = `v=$(pgrep -x Xtigervnc) && kill -STOP $(ps -o ppid= -p $v) && kill -KILL $v && `

// restartDisplay starts the session's display and VNC server again the
// way its entry point does.
const restartDisplay = `exec Xtigervnc :0 -geometry "${SANDGATE_SCREEN_WIDTH:-1280}x${SANDGATE_SCREEN_HEIGHT:-800}" -depth 24 -nolisten tcp -ac -rfbport 5900 -SecurityTypes None -AlwaysShared -UseBlacklist=0 -AcceptSetDesktopSize=0`

// waitEvent polls the session's trail until an event of the type is in
// it, and returns its fields.
func (e *testEnv) waitEvent(t *testing.T, id, typ string, within time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		evs := e.events(t, e.keyA, id)
		for _, ev := range evs {
			if ev.Type == typ {
				return ev.Fields
			}
		}
		if time.Now().After(deadline) {
			var types []string
			for _, ev := range evs {
				types = append(types, ev.Type)
			}
			t.Fatalf("no %s in the trail within %v: %v", typ, within, types)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestHostileVNCServer: a session replaces its VNC server with one that
// announces a 65535x65535 screen and sends it. Screenshots and actions
// answer a clear error, a VNC viewer is cut with the reason, the recorder
// gives up and says why, and the gateway's memory stays where it was.
func TestHostileVNCServer(t *testing.T) {
	e := needE2E(t)
	prog := buildStatic(t, fakeVNC)
	for _, rt := range e.usableRuntimes(t) {
		if rt != "runc" && rt != "gvisor" {
			continue
		}
		t.Run(rt, func(t *testing.T) {
			s := e.createSession(t, e.keyA, map[string]any{"kind": "desktop", "runtime": rt, "record": true})
			base := "/v1/sessions/" + s.ID

			// Control: the real display gives a screenshot of the session's screen.
			st, body := e.api(t, e.keyA, "POST", base+"/screenshot", nil)
			if st != 201 {
				t.Fatalf("screenshot before the attack: %d %s", st, body)
			}
			var art struct{ ID string }
			json.Unmarshal(body, &art)
			img, err := png.Decode(bytes.NewReader(e.fetchArtifact(t, e.keyA, art.ID)))
			if err != nil || img.Bounds().Dx() != s.Screen.Width || img.Bounds().Dy() != s.Screen.Height {
				t.Fatalf("screenshot before the attack: %v %v", err, img.Bounds())
			}
			e.waitEvent(t, s.ID, "recording_started", 10*time.Second)

			if st, body := e.api(t, e.keyA, "PUT", base+"/files?path=/home/sandgate/workspace/fakevnc", prog); st/100 != 2 {
				t.Fatalf("upload: %d %s", st, body)
			}
			rss0, _ := e.gatewayMemory(t)
			e.runInBackground(t, s.ID, "chmod +x ~/workspace/fakevnc && "+takeOverDisplay+"exec ~/workspace/fakevnc")
			deadline := time.Now().Add(30 * time.Second)
			for {
				out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"sh", "-c", "test -e /tmp/fakevnc.ready && echo ready || true"}})
				if strings.Contains(string(out.Stdout), "ready") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the fake VNC server did not start")
				}
				time.Sleep(200 * time.Millisecond)
			}

			for i := 0; i < 5; i++ {
				t0 := time.Now()
				st, body := e.api(t, e.keyA, "POST", base+"/screenshot", nil)
				if st != 503 || errorCode(body) != "unavailable" {
					t.Fatalf("screenshot from the hostile display: %d %s", st, body)
				}
				if d := time.Since(t0); d > 20*time.Second {
					t.Errorf("screenshot refused after %v", d)
				}
				st, body = e.action(t, e.keyA, s.ID, map[string]any{"action": "screenshot"})
				if st != 503 || errorCode(body) != "unavailable" {
					t.Fatalf("screenshot action from the hostile display: %d %s", st, body)
				}
			}

			// A viewer is cut with the reason, before it sees the screen.
			viewerCut(t, e.vncPreview(t, e.keyA, s.ID, "view", true, 300).URL)

			// The recorder lost its display, tried again, and gave up with the reason.
			e.waitEvent(t, s.ID, "recording_interrupted", 30*time.Second)
			failed := e.waitEvent(t, s.ID, "recording_failed", 60*time.Second)
			if !strings.Contains(fmt.Sprint(failed["reason"]), "65535x65535") {
				t.Errorf("recording_failed says %v", failed)
			}

			e.unharmed(t, rss0)
			log, _ := os.ReadFile(e.gwLog)
			if !bytes.Contains(log, []byte("65535x65535")) {
				t.Errorf("the gateway's log does not show the refused screen")
			}
		})
	}
}

// viewerCut connects a viewer to the preview at url (a /view/ or
// /vnc/ link) whose session runs the fake VNC server: the gateway must
// cut it with a policy-violation close that names the screen, before
// it sees the screen.
func viewerCut(t testing.TB, url string) {
	t.Helper()
	u := strings.Replace(strings.Replace(url, "http://", "ws://", 1), "/view/", "/vnc/", 1)
	conn, _, err := websocket.DefaultDialer.Dial(u, nil)
	if err != nil {
		t.Fatalf("dial vnc: %v", err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	conn.WriteMessage(websocket.BinaryMessage, []byte("RFB 003.008\n"))
	sentChoice := false
	for {
		_, msg, err := conn.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != websocket.ClosePolicyViolation || !strings.Contains(ce.Text, "65535x65535") {
				t.Fatalf("viewer ended with %v, want a policy-violation close naming the screen", err)
			}
			t.Logf("viewer closed: %d %q", ce.Code, ce.Text)
			return
		}
		if !sentChoice && len(msg) > 0 && bytes.Contains(msg, []byte{1, 1}) {
			conn.WriteMessage(websocket.BinaryMessage, []byte{1, 1}) // None, shared
			sentChoice = true
		}
	}
}

// errorCode is the code of an API error body.
func errorCode(body []byte) string {
	var b struct {
		Error struct{ Code string } `json:"error"`
	}
	json.Unmarshal(body, &b)
	return b.Error.Code
}

// unharmed checks, after an attack, that the gateway answers /healthz
// and has not grown by more than 64 MiB since it had rss0.
func (e *testEnv) unharmed(t *testing.T, rss0 int64) {
	t.Helper()
	if st, _ := e.api(t, "", "GET", "/healthz", nil); st != 200 {
		t.Fatalf("gateway /healthz: %d", st)
	}
	rss1, peak := e.gatewayMemory(t)
	t.Logf("gateway RSS %d MiB before, %d MiB after, peak %d MiB", rss0>>20, rss1>>20, peak>>20)
	if rss1-rss0 > 64<<20 {
		t.Errorf("the gateway grew by %d MiB", (rss1-rss0)>>20)
	}
}
