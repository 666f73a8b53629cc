package test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestNodeClients: Playwright's connectOverCDP and Puppeteer's connect
// with the preview URL as given, unmodified (test/node/compat.mjs).
func TestNodeClients(t *testing.T) {
	e := needE2E(t)
	if _, err := os.Stat("node/node_modules/playwright-core"); err != nil {
		t.Fatal("test/node has no node_modules: `make test` runs npm ci there")
	}
	for _, client := range []string{"playwright", "puppeteer", "playwright-header", "puppeteer-header"} {
		t.Run(client, func(t *testing.T) {
			s := e.createSession(t, e.keyA, nil)
			pages := testPages(t)
			p := e.preview(t, e.keyA, s.ID, 300)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", "compat.mjs", client, p.URL, pages+"/hello.html")
			cmd.Dir = "node"
			out, err := cmd.Output()
			if err != nil {
				stderr := ""
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = string(ee.Stderr)
				}
				t.Fatalf("%s: %v\n%s", client, err, stderr)
			}
			var got struct {
				Title  string
				Answer int
			}
			if err := json.Unmarshal(out, &got); err != nil || got.Title != "Sandgate test page" || got.Answer != 42 {
				t.Fatalf("%s: %s (%v)", client, out, err)
			}
			// The client disconnected; the session's browser is still there.
			status, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID, nil)
			if status != 200 || jsonField(body, "state") != "running" {
				t.Fatalf("after %s disconnected: %d %s", client, status, body)
			}
			if _, err := browserWSErr(p.URL); err != nil {
				t.Fatalf("after %s disconnected, CDP discovery fails: %v", client, err)
			}
		})
	}
}

// TestCDPTokenInHeader: CDP tools that take an endpoint and headers
// (Playwright MCP's --cdp-endpoint and --cdp-header) send the preview
// token as "Authorization: Bearer <token>": discovery under /cdp and the
// WebSocket it points at answer with it (the control)
// and refuse without it, with a bad one, with the tenant's API key or
// with a token of another scope.
func TestCDPTokenInHeader(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	p := e.preview(t, e.keyA, s.ID, 300)
	token := p.URL[strings.LastIndex(p.URL, "/")+1:]
	get := func(path, auth string) (int, string) {
		req, _ := http.NewRequest("GET", e.gwURL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, base := range []string{"/cdp"} {
		st, body := get(base+"/json/version", "Bearer "+token)
		want := strings.Replace(e.gwURL, "http", "ws", 1) + base + "/devtools/browser/"
		ws := jsonField([]byte(body), "webSocketDebuggerUrl")
		if st != 200 || !strings.HasPrefix(ws, want) || strings.Contains(ws, token) {
			t.Fatalf("%s/json/version with the token in a header: %d %s", base, st, body)
		}
		hdr := http.Header{"Authorization": {"Bearer " + token}}
		c, _, err := websocket.DefaultDialer.Dial(ws, hdr)
		if err != nil {
			t.Fatalf("%s: %v", ws, err)
		}
		c.WriteJSON(map[string]any{"id": 1, "method": "Browser.getVersion"})
		var m struct {
			ID     int
			Result struct{ Product string }
		}
		if err := c.ReadJSON(&m); err != nil || m.ID != 1 || m.Result.Product == "" {
			t.Fatalf("through %s: %+v %v", ws, m, err)
		}
		c.Close()
		if _, resp, err := websocket.DefaultDialer.Dial(ws, nil); err == nil || resp == nil || resp.StatusCode != 401 {
			t.Fatalf("%s without the header: %v %v", ws, resp, err)
		}
		vnc := e.vncPreview(t, e.keyA, s.ID, "vnc", false, 60).URL
		for name, auth := range map[string]string{
			"none": "", "bad": "Bearer x" + token, "api key": "Bearer " + e.keyA,
			"vnc scope": "Bearer " + vnc[strings.LastIndex(vnc, "/")+1:], "no scheme": token,
		} {
			if st, body := get(base+"/json/version", auth); st != 401 || !strings.Contains(body, `"unauthenticated"`) {
				t.Fatalf("%s/json/version, %s: %d %s", base, name, st, body)
			}
		}
	}
}
