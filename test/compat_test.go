package test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestNodeClients: Playwright's connectOverCDP and Puppeteer's connect
// with the preview URL as given, unmodified (test/node/compat.mjs).
func TestNodeClients(t *testing.T) {
	e := needE2E(t)
	if _, err := os.Stat("node/node_modules/playwright-core"); err != nil {
		t.Fatal("test/node has no node_modules: `make test` runs npm ci there")
	}
	for _, client := range []string{"playwright", "puppeteer"} {
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
