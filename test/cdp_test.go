package test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
	"github.com/go-rod/rod"
	"github.com/go-rod/rod/lib/proto"
	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"
)

// testPages is where the test pages are, as sessions see them: a name
// on every test tenant's default allow list, served from the test's hosts
// namespace and reached through the egress proxy.
func testPages(t testing.TB) string {
	t.Helper()
	return "http://pages.sandgate.test"
}

// pagesMux serves the test pages.
func pagesMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/hello.html", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<!doctype html><html><head><title>Sandgate test page</title></head>
<body><h1 id="greeting">hello from the test</h1><script>window.answer = 6 * 7;</script></body></html>`)
	})
	mux.HandleFunc("/input.html", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<!doctype html><html><head><title>input</title><style>
html,body{margin:0;height:100%}#field{box-sizing:border-box;width:100%;height:50%;font-size:40px}
#go{width:100%;height:20%;font-size:40px}#tall{height:4000px;background:linear-gradient(#fff,#06c)}</style></head>
<body><input id="field" autofocus><button id="go" onclick="document.title='clicked'">Go</button>
<div id="tall"></div></body></html>`)
	})
	mux.HandleFunc("/toggle.html", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<!doctype html><html><head><title>toggle</title><style>html,body{margin:0;height:100%;background:#c00}</style></head>
<body onmousedown="document.body.style.background = document.body.style.background === 'rgb(0, 0, 204)' ? '#c00' : '#00c'"></body></html>`)
	})
	mux.HandleFunc("/colors.html", func(w http.ResponseWriter, r *http.Request) {
		// One colour a second, through the palette, from the page's load.
		fmt.Fprintf(w, `<!doctype html><html><head><title>colors</title><style>html,body{margin:0;height:100%%}</style></head>
<body><script>const p = %s; const t0 = Date.now();
function paint() { document.body.style.background = p[Math.floor((Date.now() - t0) / 1000) %% p.length]; }
paint(); setInterval(paint, 50);</script></body></html>`, paletteJS())
	})
	mux.HandleFunc("/busy.html", func(w http.ResponseWriter, r *http.Request) {
		// A screen that changes everywhere all the time, as video does.
		fmt.Fprint(w, `<!doctype html><html><head><title>busy</title><style>html,body{margin:0;height:100%;overflow:hidden}</style></head>
<body><canvas id="c"></canvas><script>const c = document.getElementById("c"); c.width = innerWidth; c.height = innerHeight;
const g = c.getContext("2d"); function draw() { for (let i = 0; i < 200; i++) { g.fillStyle = "hsl(" + (Math.random() * 360) + ",80%,50%)";
g.fillRect(Math.random() * c.width, Math.random() * c.height, 80, 60); } requestAnimationFrame(draw); } draw();</script></body></html>`)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		// A download that lasts: a KiB every 100 ms for ?seconds= (1 to
		// 30), slowBytes in all.
		secs, _ := strconv.Atoi(r.URL.Query().Get("seconds"))
		secs = min(max(secs, 1), 30)
		w.Header().Set("Content-Length", fmt.Sprint(slowBytes(secs)))
		chunk := bytes.Repeat([]byte("s"), 1024)
		for range secs * 10 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
	})
	mux.HandleFunc("/download.html", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<!doctype html><html><head><title>download</title></head><body><a id="dl" href="/file.bin">get the report</a></body></html>`)
	})
	mux.HandleFunc("/file.bin", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", `attachment; filename="report data.bin"`)
		w.Write(downloadBody)
	})
	return mux
}

// slowBytes is what /slow sends in secs seconds.
func slowBytes(secs int) int { return secs * 10 * 1024 }

func TestChromedpThroughGateway(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	pages := testPages(t)
	p := e.preview(t, e.keyA, s.ID, 300)
	ws := browserWS(t, p.URL)
	if !strings.HasPrefix(ws, "ws://"+e.gwAddr+"/cdp/") {
		t.Fatalf("webSocketDebuggerUrl %q does not point at the gateway", ws)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	actx, cancelA := remote.NewAllocator(ctx, ws)
	defer cancelA()
	cctx, cancelC := chromedp.NewContext(actx)
	defer cancelC()
	if err := chromedp.Do(cctx, chromedp.Navigate(pages+"/hello.html")); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	title, err := chromedp.Run(cctx, chromedp.Title())
	if err != nil || title != "Sandgate test page" {
		t.Fatalf("title = %q, %v", title, err)
	}
	answer, err := chromedp.Run(cctx, chromedp.Evaluate[int](`window.answer + document.querySelectorAll("h1").length`))
	if err != nil {
		t.Fatalf("evaluate: %v", err)
	}
	if answer != 43 {
		t.Fatalf("evaluate = %d, want 43", answer)
	}
}

func TestRodThroughGateway(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	pages := testPages(t)
	p := e.preview(t, e.keyA, s.ID, 300)
	ws := browserWS(t, p.URL)

	// Cancelling the context disconnects; Browser.Close would close the
	// session's Chromium itself.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b := rod.New().ControlURL(ws).Context(ctx)
	if err := b.Connect(); err != nil {
		t.Fatalf("rod connect: %v", err)
	}
	page, err := b.Page(protoTarget(pages + "/hello.html"))
	if err != nil {
		t.Fatalf("rod page: %v", err)
	}
	if err := page.WaitLoad(); err != nil {
		t.Fatalf("wait load: %v", err)
	}
	info, err := page.Info()
	if err != nil || info.Title != "Sandgate test page" {
		t.Fatalf("title = %v, %v", info, err)
	}
	res, err := page.Eval(`() => document.getElementById("greeting").textContent + " " + window.answer`)
	if err != nil {
		t.Fatalf("eval: %v", err)
	}
	if got := res.Value.Str(); got != "hello from the test 42" {
		t.Fatalf("eval = %q", got)
	}
}

// TestDiscoveryEndpoints checks what Playwright and Puppeteer read before
// they connect: /json/version (with and without a trailing slash), /json,
// /json/list and /json/protocol.
func TestDiscoveryEndpoints(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	p := e.preview(t, e.keyA, s.ID, 300)
	for _, path := range []string{"/json/version", "/json/version/", "/json", "/json/list", "/json/protocol"} {
		t.Run(strings.Trim(path, "/"), func(t *testing.T) {
			resp, err := http.Get(p.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !json.Valid(body) {
				t.Fatalf("%s: %d %.200s", path, resp.StatusCode, body)
			}
			if bytes.Contains(body, []byte(":9222")) {
				t.Fatalf("%s leaks the session's own CDP address: %.300s", path, body)
			}
			if path != "/json/protocol" && !bytes.Contains(body, []byte(`"webSocketDebuggerUrl": "ws://`+e.gwAddr+`/cdp/`)) {
				t.Fatalf("%s: no gateway webSocketDebuggerUrl: %.300s", path, body)
			}
		})
	}
}

func TestScreenshotToMinIO(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, map[string]any{"screen": map[string]int{"width": 1024, "height": 640}})
	p := e.preview(t, e.keyA, s.ID, 300)
	before := pageIDs(t, p.URL)
	status, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/screenshot", nil)
	if status != 201 {
		t.Fatalf("screenshot: %d %s", status, body)
	}
	var a struct {
		ID, Kind, Name, SHA256, ContentType string
		Size                                int64
	}
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatal(err)
	}
	a.SHA256, a.ContentType = jsonField(body, "sha256"), jsonField(body, "content_type")

	status, body = e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID+"/artifacts", nil)
	if status != 200 || !bytes.Contains(body, []byte(a.ID)) || !bytes.Contains(body, []byte(a.SHA256)) {
		t.Fatalf("artifacts: %d %s", status, body)
	}

	req, _ := http.NewRequest("GET", e.gwURL+"/v1/artifacts/"+a.ID, nil)
	req.Header.Set("Authorization", "Bearer "+e.keyA)
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != 302 || !strings.Contains(loc, e.minioAddr) || !strings.Contains(loc, "X-Amz-Signature") {
		t.Fatalf("artifact: %d Location %q", resp.StatusCode, loc)
	}
	got, err := http.Get(loc)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(got.Body)
	got.Body.Close()
	sum := sha256.Sum256(data)
	if got.StatusCode != 200 || fmt.Sprintf("%x", sum) != a.SHA256 || int64(len(data)) != a.Size {
		t.Fatalf("presigned download: %d, %d bytes, sha256 %x, want %s", got.StatusCode, len(data), sum, a.SHA256)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1024 || b.Dy() != 640 {
		t.Fatalf("screenshot is %dx%d, want the session's 1024x640", b.Dx(), b.Dy())
	}

	// Taking it left the agent's page (and browser) alone.
	if after := pageIDs(t, p.URL); after != before {
		t.Fatalf("the screenshot changed the browser's pages: %q before, %q after", before, after)
	}

	// Tampering with the presigned URL gets nothing.
	bad, err := http.Get(strings.Replace(loc, "X-Amz-Signature=", "X-Amz-Signature=0", 1))
	if err != nil {
		t.Fatal(err)
	}
	bad.Body.Close()
	if bad.StatusCode != 403 {
		t.Fatalf("tampered presigned URL: %d, want 403", bad.StatusCode)
	}
	// Another tenant cannot reach the artifact.
	status, _ = e.api(t, e.keyB, "GET", "/v1/artifacts/"+a.ID, nil)
	if status != 404 {
		t.Fatalf("other tenant's artifact: %d, want 404", status)
	}
}

func jsonField(body []byte, k string) string {
	var m map[string]any
	json.Unmarshal(body, &m)
	s, _ := m[k].(string)
	return s
}

// wsDial opens a raw CDP WebSocket through the gateway.
func wsDial(t testing.TB, url string) *websocket.Conn {
	t.Helper()
	c, resp, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial %s: %v (status %d)", redact(url), err, status)
	}
	return c
}

func redact(u string) string {
	if i := strings.Index(u, "/cdp/"); i >= 0 {
		return u[:i] + "/cdp/<token>/..."
	}
	return u
}

// evalOnce sends Runtime.evaluate-free Browser.getVersion and waits for its
// answer, proving the connection works end to end.
func cdpPing(t testing.TB, c *websocket.Conn, id int) {
	t.Helper()
	if err := c.WriteJSON(map[string]any{"id": id, "method": "Browser.getVersion"}); err != nil {
		t.Fatalf("write: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		var m struct {
			ID int `json:"id"`
		}
		if err := c.ReadJSON(&m); err != nil {
			t.Fatalf("read: %v", err)
		}
		if m.ID == id {
			c.SetReadDeadline(time.Time{})
			return
		}
	}
}

// closedWithin waits until the connection is closed by the other side and
// returns when that happened.
func closedAt(c *websocket.Conn, limit time.Duration) (time.Time, bool) {
	c.SetReadDeadline(time.Now().Add(limit))
	for {
		if _, _, err := c.ReadMessage(); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return time.Time{}, false
			}
			return time.Now(), true
		}
	}
}

func TestRevokedTokenClosesWebSocket(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	p := e.preview(t, e.keyA, s.ID, 300)
	c := wsDial(t, browserWS(t, p.URL))
	defer c.Close()
	cdpPing(t, c, 1)

	done := make(chan time.Time, 1)
	go func() { at, _ := closedAt(c, 10*time.Second); done <- at }()
	status, body := e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID+"/previews/"+p.ID, nil)
	revoked := time.Now()
	if status != 204 {
		t.Fatalf("revoke: %d %s", status, body)
	}
	at := <-done
	if at.IsZero() || at.Sub(revoked) > time.Second {
		t.Fatalf("revoked WebSocket closed after %v, want within 1s", at.Sub(revoked))
	}
	t.Logf("closed %v after revocation", at.Sub(revoked).Round(time.Millisecond))
	// And the token no longer opens anything.
	wantStatus(t, p.URL+"/json/version", 401, "revoked token")
}

func TestExpiredTokenClosesWebSocket(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	// Long enough for discovery, dial and one round trip on a slow
	// machine under gVisor (3 s was not, once).
	p := e.preview(t, e.keyA, s.ID, 8)
	c := wsDial(t, browserWS(t, p.URL))
	defer c.Close()
	cdpPing(t, c, 1)
	at, ok := closedAt(c, 15*time.Second)
	if !ok {
		t.Fatal("the WebSocket stayed open past the token's expiry")
	}
	if late := at.Sub(p.ExpiresAt); late > time.Second || late < -100*time.Millisecond {
		t.Fatalf("WebSocket closed %v after expiry, want within 1s", late)
	} else {
		t.Logf("closed %v after expiry", late.Round(time.Millisecond))
	}
	wantStatus(t, p.URL+"/json/version", 401, "expired token")
}

func TestTokenRejections(t *testing.T) {
	e := needE2E(t)
	a := e.createSession(t, e.keyA, nil)
	b := e.createSession(t, e.keyA, nil)
	pa := e.preview(t, e.keyA, a.ID, 300)
	pb := e.preview(t, e.keyA, b.ID, 300)
	tokA := strings.TrimPrefix(pa.URL, e.gwURL+"/cdp/")
	base := e.gwURL + "/cdp/"

	// A's page id, to be asked for with B's token.
	resp, err := http.Get(pa.URL + "/json/list")
	if err != nil {
		t.Fatal(err)
	}
	var targets []struct{ ID, Type string }
	json.NewDecoder(resp.Body).Decode(&targets)
	resp.Body.Close()
	var pageA string
	for _, tg := range targets {
		if tg.Type == "page" {
			pageA = tg.ID
		}
	}
	if pageA == "" {
		t.Fatal("session A has no page")
	}

	forged := forge(t, tokA, "k1", []byte(strings.Repeat("x", 32)), nil)
	otherKid := forge(t, tokA, "k2", []byte(strings.Repeat("y", 32)), nil)
	longer := forge(t, tokA, "k1", []byte(e.tokenKey), func(c jwt.MapClaims) { c["exp"] = float64(time.Now().Add(240 * time.Hour).Unix()); c["sid"] = b.ID })
	parts := strings.Split(tokA, ".")
	tampered := parts[0] + "." + strings.TrimRight(parts[1], "=") + "A." + parts[2]
	none := forge(t, tokA, "k1", nil, nil)
	vncTok := forge(t, tokA, "k1", []byte(e.tokenKey), func(c jwt.MapClaims) { c["scp"] = "vnc" })

	cases := []struct {
		name string
		url  string
		ws   bool
		want int
	}{
		{"missing", base + "/json/version", false, 401},
		{"missing-ws", base + "/devtools/browser/x", true, 401},
		{"malformed", base + "not.a.token/json/version", false, 401},
		{"forged", base + forged + "/json/version", false, 401},
		{"unknown-kid", base + otherKid + "/json/version", false, 401},
		{"tampered", base + tampered + "/json/version", false, 401},
		{"alg-none", base + none + "/json/version", false, 401},
		{"wrong-scope", base + vncTok + "/json/version", false, 401},
		// Control: the same edits signed with the real key pass, so the
		// 401s above come from the signature check, not from the format.
		{"control-signed-with-real-key", base + longer + "/json/version", false, 200},
		{"other-session-page", strings.Replace(pb.URL, "http://", "ws://", 1) + "/devtools/page/" + pageA, true, 401},
		{"unknown-target-kind", base + tokA + "/devtools/worker/123", true, 404},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var status int
			if tc.ws {
				u := strings.Replace(tc.url, "http://", "ws://", 1)
				c, resp, err := websocket.DefaultDialer.Dial(u, nil)
				if err == nil {
					c.Close()
					status = 101
				} else if resp != nil {
					status = resp.StatusCode
				}
			} else {
				resp, err := http.Get(tc.url)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				status = resp.StatusCode
			}
			if status != tc.want {
				t.Fatalf("status %d, want %d", status, tc.want)
			}
		})
	}

	t.Run("foreign-host", func(t *testing.T) {
		req, _ := http.NewRequest("GET", pa.URL+"/json/version", nil)
		req.Host = "evil.example:80"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 403 {
			t.Fatalf("foreign Host: %d, want 403", resp.StatusCode)
		}
	})
	t.Run("foreign-origin", func(t *testing.T) {
		h := http.Header{"Origin": {"http://evil.example"}}
		c, resp, err := websocket.DefaultDialer.Dial(browserWS(t, pa.URL), h)
		if err == nil {
			c.Close()
			t.Fatal("a foreign Origin opened a CDP WebSocket")
		}
		if resp == nil || resp.StatusCode != 403 {
			t.Fatalf("foreign Origin: %v, want 403", resp)
		}
	})
	t.Run("deleted-session", func(t *testing.T) {
		e.api(t, e.keyA, "DELETE", "/v1/sessions/"+b.ID, nil)
		resp, err := http.Get(pb.URL + "/json/version")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Fatalf("token of a deleted session: %d, want 401", resp.StatusCode)
		}
	})
}

// forge re-signs the claims of tok with key under kid, after edit. A nil
// key makes an unsigned ("alg":"none") token.
func forge(t *testing.T, tok, kid string, key []byte, edit func(jwt.MapClaims)) string {
	t.Helper()
	claims := jwt.MapClaims{}
	if _, _, err := jwt.NewParser().ParseUnverified(tok, claims); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(claims)
	}
	if key == nil {
		nt := jwt.NewWithClaims(jwt.SigningMethodNone, claims)
		nt.Header["kid"] = kid
		s, err := nt.SignedString(jwt.UnsafeAllowNoneSignatureType)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	nt := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
	nt.Header["kid"] = kid
	s, err := nt.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func protoTarget(url string) proto.TargetCreateTarget { return proto.TargetCreateTarget{URL: url} }

// pageIDs lists the browser's page targets.
func pageIDs(t testing.TB, previewURL string) string {
	t.Helper()
	resp, err := http.Get(previewURL + "/json/list")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ts []struct{ ID, Type string }
	json.NewDecoder(resp.Body).Decode(&ts)
	var ids []string
	for _, tg := range ts {
		if tg.Type == "page" {
			ids = append(ids, tg.ID)
		}
	}
	return strings.Join(ids, ",")
}

// wantStatus fetches url and checks the status.
func wantStatus(t testing.TB, url string, want int, what string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Fatalf("%s: %d, want %d", what, resp.StatusCode, want)
	}
}
