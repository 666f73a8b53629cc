package test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
	"github.com/gorilla/websocket"

	"github.com/sandgate/sandgate/desktop"
)

// wsStream makes a binary WebSocket an io.ReadWriteCloser, as noVNC uses it.
type wsStream struct {
	c  *websocket.Conn
	r  io.Reader
	mu sync.Mutex
}

func (s *wsStream) Read(p []byte) (int, error) {
	for {
		if s.r == nil {
			_, r, err := s.c.NextReader()
			if err != nil {
				return 0, err
			}
			s.r = r
		}
		n, err := s.r.Read(p)
		if err == io.EOF {
			s.r = nil
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
}

func (s *wsStream) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(p), s.c.WriteMessage(websocket.BinaryMessage, p)
}

func (s *wsStream) Close() error { return s.c.Close() }

func (e *testEnv) vncPreview(t testing.TB, key, id, scope string, viewOnly bool, ttl int) previewInfo {
	t.Helper()
	status, body := e.api(t, key, "POST", "/v1/sessions/"+id+"/previews", map[string]any{"scope": scope, "ttl_seconds": ttl, "view_only": viewOnly})
	if status != 201 {
		t.Fatalf("preview: %d %s", status, body)
	}
	var p previewInfo
	json.Unmarshal(body, &p)
	e.mu.Lock()
	e.tokens = append(e.tokens, p.URL[strings.LastIndex(p.URL, "/")+1:])
	e.mu.Unlock()
	return p
}

// rfbThroughGateway opens an RFB session over /vnc/{token}.
func rfbThroughGateway(t testing.TB, p previewInfo) (*desktop.Client, *websocket.Conn) {
	t.Helper()
	u := strings.Replace(strings.Replace(p.URL, "http://", "ws://", 1), "/view/", "/vnc/", 1)
	conn, resp, err := websocket.DefaultDialer.Dial(u, nil)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial vnc: %v (%d)", err, status)
	}
	c, err := desktop.Handshake(&wsStream{c: conn}, 3840, 2160)
	if err != nil {
		conn.Close()
		t.Fatalf("rfb handshake through the gateway: %v", err)
	}
	return c, conn
}

func (e *testEnv) action(t testing.TB, key, id string, a map[string]any) (int, []byte) {
	t.Helper()
	return e.api(t, key, "POST", "/v1/sessions/"+id+"/actions", a)
}

func (e *testEnv) mustAction(t testing.TB, key, id string, a map[string]any) []byte {
	t.Helper()
	status, body := e.action(t, key, id, a)
	if status != 200 {
		t.Fatalf("action %v: %d %s", a, status, body)
	}
	return body
}

func (e *testEnv) cursor(t testing.TB, id string) (int, int) {
	t.Helper()
	var r struct{ Cursor struct{ X, Y int } }
	json.Unmarshal(e.mustAction(t, e.keyA, id, map[string]any{"action": "cursor_position"}), &r)
	return r.Cursor.X, r.Cursor.Y
}

func colours(img image.Image) int {
	seen := map[uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 7 {
		for x := b.Min.X; x < b.Max.X; x += 7 {
			r, g, bl, _ := img.At(x, y).RGBA()
			seen[r>>8<<16|g>>8<<8|bl>>8] = true
		}
	}
	return len(seen)
}

// cdpPage attaches chromedp to the session's browser through the gateway.
func (e *testEnv) cdpPage(t testing.TB, id string) (context.Context, func()) {
	t.Helper()
	p := e.preview(t, e.keyA, id, 300)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	actx, cancelA := remote.NewAllocator(ctx, browserWS(t, p.URL))
	// Attach to the page the session shows (the first one).
	var pageID string
	resp, err := http.Get(p.URL + "/json/list")
	if err != nil {
		t.Fatal(err)
	}
	var ts []struct{ ID, Type string }
	json.NewDecoder(resp.Body).Decode(&ts)
	resp.Body.Close()
	for _, tg := range ts {
		if tg.Type == "page" {
			pageID = tg.ID
			break
		}
	}
	cctx, cancelC := chromedp.NewContext(actx, chromedp.WithTargetID(targetID(pageID)), chromedp.WithDetachOnCancel())
	return cctx, func() { cancelC(); cancelA(); cancel() }
}

func evalString(t testing.TB, ctx context.Context, js string) string {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// pagePoint turns page coordinates into screen coordinates.
func pagePoint(t testing.TB, ctx context.Context, selector string) (int, int) {
	t.Helper()
	js := fmt.Sprintf(`(() => { const r = document.querySelector(%q).getBoundingClientRect();
		const left = window.screenX + (window.outerWidth - window.innerWidth) / 2;
		const top = window.screenY + (window.outerHeight - window.innerHeight);
		return JSON.stringify([Math.round(left + r.left + r.width / 2), Math.round(top + r.top + r.height / 2)]); })()`, selector)
	var xy []int
	json.Unmarshal([]byte(evalString(t, ctx, js)), &xy)
	return xy[0], xy[1]
}

func TestVNCThroughGateway(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, map[string]any{"kind": "desktop", "screen": map[string]int{"width": 1024, "height": 640}})
	p := e.vncPreview(t, e.keyA, s.ID, "vnc", false, 120)
	c, conn := rfbThroughGateway(t, p)
	defer conn.Close()
	if c.Width != 1024 || c.Height != 640 {
		t.Fatalf("server init says %dx%d, want the session's 1024x640", c.Width, c.Height)
	}
	// The desktop's windows appear within a moment of the session start.
	var img *image.RGBA
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var err error
		if img, err = c.Capture(); err != nil {
			t.Fatalf("framebuffer update: %v", err)
		}
		if colours(img) >= 5 {
			break
		}
	}
	if img.Bounds().Dx() != 1024 || img.Bounds().Dy() != 640 || colours(img) < 5 {
		t.Fatalf("framebuffer %v with %d colours: not the desktop", img.Bounds(), colours(img))
	}
}

// clickedInputPage makes a browser session showing /input.html with its
// text field clicked (focused), and returns it with a CDP context on it.
func (e *testEnv) clickedInputPage(t *testing.T) (sessionInfo, context.Context) {
	t.Helper()
	s := e.createSession(t, e.keyA, nil)
	ctx, done := e.cdpPage(t, s.ID)
	t.Cleanup(done)
	if err := chromedp.Do(ctx, chromedp.Navigate(testPages(t)+"/input.html")); err != nil {
		t.Fatal(err)
	}
	fx, fy := pagePoint(t, ctx, "#field")
	e.mustAction(t, e.keyA, s.ID, map[string]any{"action": "left_click", "coordinate": []int{fx, fy}})
	return s, ctx
}

// TestViewOnlyEnforced: pointer and key events from a view-only viewer
// never reach the session; from an interactive one they do.
func TestViewOnlyEnforced(t *testing.T) {
	e := needE2E(t)
	s, ctx := e.clickedInputPage(t)
	fx, fy := pagePoint(t, ctx, "#field")
	e.mustAction(t, e.keyA, s.ID, map[string]any{"action": "mouse_move", "coordinate": []int{5, 5}})

	send := func(p previewInfo) {
		c, conn := rfbThroughGateway(t, p)
		defer conn.Close()
		c.Pointer(fx, fy+7, 0)
		for _, k := range "xyz" {
			c.Key(true, uint32(k))
			c.Key(false, uint32(k))
		}
		// A request the server must answer proves the events before it
		// were passed or dropped.
		if err := c.RequestUpdate(true); err != nil {
			t.Fatal(err)
		}
		time.Sleep(700 * time.Millisecond)
	}

	send(e.vncPreview(t, e.keyA, s.ID, "vnc", true, 60))
	if x, y := e.cursor(t, s.ID); x != 5 || y != 5 {
		t.Fatalf("a view-only viewer moved the cursor to %d,%d", x, y)
	}
	if v := evalString(t, ctx, `document.getElementById("field").value`); v != "" {
		t.Fatalf("a view-only viewer typed %q", v)
	}

	send(e.vncPreview(t, e.keyA, s.ID, "vnc", false, 60))
	if x, y := e.cursor(t, s.ID); x != fx || y != fy+7 {
		t.Fatalf("an interactive viewer's pointer is at %d,%d, want %d,%d", x, y, fx, fy+7)
	}
	if v := evalString(t, ctx, `document.getElementById("field").value`); v != "xyz" {
		t.Fatalf("an interactive viewer typed %q, want xyz", v)
	}
}

func TestActionsInBrowser(t *testing.T) {
	e := needE2E(t)
	s, ctx := e.clickedInputPage(t)
	e.mustAction(t, e.keyA, s.ID, map[string]any{"action": "type", "text": "Hello, Sandgate!"})
	if v := evalString(t, ctx, `document.getElementById("field").value`); v != "Hello, Sandgate!" {
		t.Fatalf("typed %q", v)
	}

	bx, by := pagePoint(t, ctx, "#go")
	e.mustAction(t, e.keyA, s.ID, map[string]any{"action": "left_click", "coordinate": []int{bx, by}})
	if v := evalString(t, ctx, `document.title`); v != "clicked" {
		t.Fatalf("after the click the title is %q", v)
	}

	e.mustAction(t, e.keyA, s.ID, map[string]any{"action": "scroll", "coordinate": []int{bx, by}, "scroll_direction": "down", "scroll_amount": 5})
	deadline := time.Now().Add(3 * time.Second)
	for evalString(t, ctx, `String(window.scrollY)`) == "0" {
		if time.Now().After(deadline) {
			t.Fatal("scrolling did not move the page")
		}
		time.Sleep(100 * time.Millisecond)
	}

	if v := evalString(t, ctx, `String(document.hasFocus())`); v != "true" {
		t.Fatalf("the page should have focus before ctrl+l, hasFocus=%s", v)
	}
	e.mustAction(t, e.keyA, s.ID, map[string]any{"action": "key", "text": "ctrl+l"})
	time.Sleep(300 * time.Millisecond)
	if v := evalString(t, ctx, `String(document.hasFocus())`); v != "false" {
		t.Fatalf("after ctrl+l the page still has focus: the address bar did not take it")
	}
	e.mustAction(t, e.keyA, s.ID, map[string]any{"action": "type", "text": "typed-into-the-omnibox"})
	if v := evalString(t, ctx, `document.getElementById("field").value`); v != "Hello, Sandgate!" {
		t.Fatalf("text meant for the address bar reached the page: %q", v)
	}

	var shot struct {
		Image    string
		Artifact struct{ ID string }
	}
	json.Unmarshal(e.mustAction(t, e.keyA, s.ID, map[string]any{"action": "screenshot"}), &shot)
	raw, _ := base64.StdEncoding.DecodeString(shot.Image)
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil || img.Bounds().Dx() != 1280 || img.Bounds().Dy() != 800 || shot.Artifact.ID == "" {
		t.Fatalf("screenshot action: %v %v %q", err, img, shot.Artifact.ID)
	}
}

func TestDesktopSession(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, map[string]any{"kind": "desktop"})
	if s.Kind != "desktop" {
		t.Fatalf("kind %q", s.Kind)
	}
	status, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/screenshot", nil)
	if status != 201 {
		t.Fatalf("screenshot: %d %s", status, body)
	}
	// The desktop's windows appear within moments of the start (longer
	// under gVisor).
	var img image.Image
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		var shot struct{ Image string }
		json.Unmarshal(e.mustAction(t, e.keyA, s.ID, map[string]any{"action": "screenshot"}), &shot)
		raw, _ := base64.StdEncoding.DecodeString(shot.Image)
		var err error
		if img, err = png.Decode(bytes.NewReader(raw)); err != nil {
			t.Fatalf("desktop screenshot: %v", err)
		}
		if colours(img) >= 5 || time.Now().After(deadline) {
			break
		}
	}
	if colours(img) < 5 {
		t.Fatalf("desktop screenshot has %d colours: no desktop", colours(img))
	}
	e.mustAction(t, e.keyA, s.ID, map[string]any{"action": "mouse_move", "coordinate": []int{640, 400}})
	if x, y := e.cursor(t, s.ID); x != 640 || y != 400 {
		t.Fatalf("cursor at %d,%d", x, y)
	}
}

// TestViewerPage opens /view/{token} in headless Chromium on the host: the
// page connects by itself, its canvas shows the desktop and changes after
// an action changes the screen.
func TestViewerPage(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, map[string]any{"kind": "desktop"})
	p := e.vncPreview(t, e.keyA, s.ID, "view", true, 300)

	actx, cancelA := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath("/usr/bin/chromium"), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.WindowSize(1300, 900), chromedp.UserDataDir(t.TempDir()))
	defer cancelA()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, 90*time.Second)
	defer cancelT()
	if err := chromedp.Do(ctx, chromedp.Navigate(p.URL), chromedp.WaitVisible(chromedp.CSS("body.connected"))); err != nil {
		t.Fatalf("viewer did not connect: %v", err)
	}
	header, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("header").innerText`))
	if err != nil || !strings.Contains(header, s.ID) || !strings.Contains(header, "VIEW ONLY") || !strings.Contains(header, "expires in") {
		t.Fatalf("viewer header %q (%v)", header, err)
	}
	canvas := func() image.Image {
		t.Helper()
		time.Sleep(500 * time.Millisecond)
		buf, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS("#screen canvas")))
		if err != nil {
			t.Fatalf("canvas screenshot: %v", err)
		}
		img, err := png.Decode(bytes.NewReader(buf))
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	// The desktop's windows appear within a moment of the session start
	// (the VNC server, which is the display, answers before they draw).
	before := canvas()
	for deadline := time.Now().Add(60 * time.Second); colours(before) < 5 && time.Now().Before(deadline); {
		before = canvas()
	}
	if colours(before) < 5 {
		t.Fatalf("the viewer's canvas has %d colours: not showing the desktop", colours(before))
	}
	e.mustAction(t, e.keyA, s.ID, map[string]any{"action": "left_click", "coordinate": []int{300, 200}})
	e.mustAction(t, e.keyA, s.ID, map[string]any{"action": "type", "text": "echo the viewer sees this\n"})
	after := canvas()
	if bytes.Equal(before.(*image.RGBA).Pix, after.(*image.RGBA).Pix) {
		t.Fatal("the viewer's canvas did not change after typing into the terminal")
	}
}

// TestBadRFB: garbage and oversized RFB messages close that connection with
// a reason; the session keeps working.
func TestBadRFB(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, map[string]any{"kind": "desktop"})
	p := e.vncPreview(t, e.keyA, s.ID, "vnc", false, 120)
	for name, payload := range map[string][]byte{
		"garbage":       {77, 1, 2, 3},
		"oversized-cut": {6, 0, 0, 0, 0x7f, 0, 0, 0},
	} {
		t.Run(name, func(t *testing.T) {
			_, conn := rfbThroughGateway(t, p)
			defer conn.Close()
			conn.WriteMessage(websocket.BinaryMessage, payload)
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			var err error
			for err == nil {
				_, _, err = conn.ReadMessage()
			}
			ce, ok := err.(*websocket.CloseError)
			if !ok || ce.Code != websocket.ClosePolicyViolation || !strings.Contains(ce.Text, "rfb protocol error") {
				t.Fatalf("closed with %v, want a policy-violation close with the reason", err)
			}
		})
	}
	t.Run("text-frames", func(t *testing.T) {
		u := strings.Replace(p.URL, "http://", "ws://", 1)
		conn, _, err := websocket.DefaultDialer.Dial(u, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.WriteMessage(websocket.TextMessage, []byte("RFB 003.008\n"))
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		for err == nil {
			_, _, err = conn.ReadMessage()
		}
		if ce, ok := err.(*websocket.CloseError); !ok || ce.Code != websocket.CloseUnsupportedData {
			t.Fatalf("text frames: %v", err)
		}
	})
	// The session is unharmed: a new viewer gets the screen.
	c, conn := rfbThroughGateway(t, p)
	defer conn.Close()
	if _, err := c.Capture(); err != nil {
		t.Fatalf("after bad viewers: %v", err)
	}
}

func TestBadActions(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	for name, a := range map[string]string{
		"unknown-action": `{"action":"teleport"}`,
		"unknown-key":    `{"action":"key","text":"ctrl+warp"}`,
		"off-screen":     `{"action":"left_click","coordinate":[5000,10]}`,
		"negative":       `{"action":"mouse_move","coordinate":[-1,10]}`,
		"unknown-field":  `{"action":"left_click","button":"left"}`,
		"malformed":      `{"action":`,
		"long-wait":      `{"action":"wait","duration":999}`,
	} {
		t.Run(name, func(t *testing.T) {
			status, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/actions", a)
			if status != 400 || !bytes.Contains(body, []byte(`"invalid_argument"`)) {
				t.Fatalf("%d %s", status, body)
			}
		})
	}
	e.mustAction(t, e.keyA, s.ID, map[string]any{"action": "mouse_move", "coordinate": []int{11, 12}})
	if x, y := e.cursor(t, s.ID); x != 11 || y != 12 {
		t.Fatalf("after bad actions the cursor is at %d,%d", x, y)
	}
	if status, _ := e.action(t, e.keyB, s.ID, map[string]any{"action": "cursor_position"}); status != 404 {
		t.Fatalf("another tenant's action: %d", status)
	}
}

// TestSessionsCannotReachEachOther: a session's Chromium cannot connect to
// another session's CDP or VNC port.
func TestSessionsCannotReachEachOther(t *testing.T) {
	e := needE2E(t)
	a := e.createSession(t, e.keyA, map[string]any{"egress": map[string]any{"allow": []string{}}})
	b := e.createSession(t, e.keyA, map[string]any{"kind": "desktop"})
	cb, err := e.client.LoadContainer(e.ctx(), b.ID)
	if err != nil {
		t.Fatal(err)
	}
	labels, _ := cb.Labels(e.ctx())
	addrB := labels["sandgate.addr"]
	sh := func(script string) execOut {
		return e.execIn(t, e.keyA, a.ID, map[string]any{"cmd": []string{"bash", "-c", script}, "timeout_seconds": 30})
	}
	if out := sh("curl -sf --max-time 10 " + testPages(t) + "/hello.html"); !strings.Contains(string(out.Stdout), "hello from the test") {
		t.Fatalf("control: the test pages are not reachable from the session: %q %q", out.Stdout, out.Stderr)
	}
	for _, port := range []string{"9222", "5900"} {
		// Directly: isolated bridge ports and the kernel rules.
		direct := fmt.Sprintf(`perl -MIO::Socket::INET -e 'IO::Socket::INET->new(PeerAddr => "%s:%s", Timeout => 3) or exit 1; exit 0'`, addrB, port)
		if out := sh(direct); out.ExitCode == 0 {
			t.Errorf("session A connected to session B's port %s", port)
		}
		// Through the proxy: not on the allow list, and a private address.
		if out := sh(fmt.Sprintf("curl -sf --max-time 10 http://%s:%s/", addrB, port)); out.ExitCode == 0 {
			t.Errorf("session A reached session B's port %s through the proxy: %q", port, out.Stdout)
		}
	}
}

func targetID(id string) target.ID { return target.ID(id) }
