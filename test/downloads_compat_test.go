package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// nodeDownload is one download a node client made (test/node/downloads.mjs).
type nodeDownload struct {
	Label     string  `json:"label"`
	Suggested string  `json:"suggested"`
	Failure   *string `json:"failure"`
}

// runDownloads starts test/node/downloads.mjs with one client and reads
// what it saw; the client keeps its pages open until finish.
func runDownloads(t *testing.T, client, previewURL, pages, tag string) (saw map[string]nodeDownload, finish func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	cmd := exec.CommandContext(ctx, "node", "downloads.mjs", client, previewURL, pages, tag)
	cmd.Dir = "node"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	finish = func() {
		once.Do(func() {
			stdin.Close()
			cmd.Wait()
			cancel()
		})
	}
	t.Cleanup(finish)
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	var got struct{ Downloads []nodeDownload }
	if err != nil || json.Unmarshal(line, &got) != nil {
		finish()
		t.Fatalf("%s: %q %v\n%s", client, line, err, stderr.String())
	}
	saw = map[string]nodeDownload{}
	for _, d := range got.Downloads {
		saw[d.Label] = d
	}
	return saw, finish
}

// waitDownloads waits until the session has a download artifact of each
// digest (name: content digest), and returns the ones it has then.
func (e *testEnv) waitDownloads(t *testing.T, id string, want map[string]string, limit time.Duration) map[string]artifact {
	t.Helper()
	got := map[string]artifact{}
	deadline := time.Now().Add(limit)
	for {
		for _, a := range e.artifacts(t, e.keyA, id) {
			if a.Kind == "download" {
				got[a.SHA256] = a
			}
		}
		missing := 0
		for _, sum := range want {
			if _, ok := got[sum]; !ok {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			return got
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// TestClientDownloads: downloads started in pages driven by unmodified
// Playwright (connectOverCDP) and Puppeteer (connect, with a download
// behaviour of its own) are stored as artifacts with their digests, and
// Playwright still gets its download events. A Playwright context that
// refuses downloads keeps none. After the clients are gone (Chromium then
// resets the behaviour they set), a download driven by chromedp over the
// gateway is stored again: the gateway's own path still works.
func TestClientDownloads(t *testing.T) {
	e := needE2E(t)
	if _, err := os.Stat("node/node_modules/playwright-core"); err != nil {
		t.Fatal("test/node has no node_modules: `make test` runs npm ci there")
	}
	s := e.createSession(t, e.keyA, nil)
	pages := testPages(t)
	tag := randHex(8)
	content := func(label string) string { return sha([]byte(tag + "-" + label)) }

	pw, finishPW := runDownloads(t, "playwright", e.preview(t, e.keyA, s.ID, 300).URL, pages, tag)
	for _, label := range []string{"link", "own-context"} {
		if d, ok := pw[label]; !ok || d.Failure != nil {
			t.Errorf("playwright %s: %+v", label, d)
		}
	}
	if pw["link"].Suggested != "report data.bin" {
		t.Errorf("playwright saw the link's download as %q", pw["link"].Suggested)
	}
	if d := pw["denied"]; d.Failure == nil {
		t.Errorf("playwright: a download in a context that refuses downloads finished: %+v", d)
	}
	pp, finishPP := runDownloads(t, "puppeteer", e.preview(t, e.keyA, s.ID, 300).URL, pages, tag)
	if _, ok := pp["puppeteer"]; !ok {
		t.Errorf("puppeteer: %+v", pp)
	}

	want := map[string]string{
		"playwright link":        sha(downloadBody),
		"playwright own context": content("own-context"),
		"puppeteer":              content("puppeteer"),
	}
	got := e.waitDownloads(t, s.ID, want, 30*time.Second)
	finishPW()
	finishPP()
	for what, sum := range want {
		if _, ok := got[sum]; !ok {
			t.Errorf("the %s download is not an artifact (have %d downloads)", what, len(got))
		}
	}
	if a, ok := got[sha(downloadBody)]; ok && (a.Name != "report data.bin" || a.Size != int64(len(downloadBody)) || a.SourceURL != pages+"/file.bin") {
		t.Errorf("playwright's link download: %+v", a)
	}
	if a, ok := got[content("own-context")]; ok && a.Name != "own-context.txt" {
		t.Errorf("playwright's blob download is named %q", a.Name)
	}
	if _, ok := got[content("denied")]; ok {
		t.Error("a download Playwright's context refused was stored")
	}

	// The gateway's own path, after the clients left: chromedp clicks, the
	// watcher stores. Chromium resets the default context's behaviour when
	// a client that set it leaves, and the watcher sets it again within a
	// second, so each try is a new file until one is stored.
	ctx, done := e.cdpPage(t, s.ID)
	defer done()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		label := fmt.Sprintf("chromedp-%d", i)
		js := fmt.Sprintf(`(() => { const a = document.createElement("a"); a.href = URL.createObjectURL(new Blob([%q])); a.download = %q; document.body.appendChild(a); a.click(); return true })()`, tag+"-"+label, label+".txt")
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js)); err != nil {
			t.Fatal(err)
		}
		if got := e.waitDownloads(t, s.ID, map[string]string{label: content(label)}, 3*time.Second); got[content(label)].ID != "" {
			if i > 0 {
				t.Logf("the gateway's download path stored try %d (the earlier ones fell in the second after the clients left)", i)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the node clients left, no download driven by chromedp was stored (%d tries)", i+1)
		}
	}

	// Each stored download is in the audit trail.
	n := 0
	for _, ev := range e.events(t, e.keyA, s.ID) {
		if ev.Type == "download" {
			n++
		}
	}
	if n < len(want)+1 {
		t.Errorf("%d download events in the trail, want at least %d", n, len(want)+1)
	}
}
