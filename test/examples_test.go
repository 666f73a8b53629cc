package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestExamples runs each program under examples/ against the gateway, as
// its comment says to run it, and checks what it printed.
func TestExamples(t *testing.T) {
	e := needE2E(t)
	if _, err := os.Stat("../examples/node/node_modules/playwright-core"); err != nil {
		t.Fatal("examples/node has no node_modules: `make test` runs npm ci there")
	}
	pages := testPages(t)
	run := func(t *testing.T, env []string, name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), append([]string{"SANDGATE_URL=" + e.gwURL, "SANDGATE_API_KEY=" + e.keyA}, env...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	build := func(t *testing.T, dir string) string {
		t.Helper()
		bin := filepath.Join(t.TempDir(), filepath.Base(dir))
		if out, err := exec.Command("go", "build", "-o", bin, "../examples/"+dir).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", dir, err, out)
		}
		return bin
	}
	want := func(t *testing.T, out string, lines ...string) {
		t.Helper()
		for _, l := range lines {
			if !strings.Contains(out, l) {
				t.Fatalf("the output lacks %q:\n%s", l, out)
			}
		}
	}
	before := e.sessionCount(t, e.keyA)

	t.Run("computer-use", func(t *testing.T) {
		dir := t.TempDir()
		out := run(t, []string{"EXAMPLE_OUT=" + dir}, build(t, "computer-use"))
		want(t, out, "step 5: zoom", "the terminal wrote: agent-was-here", "watch: "+e.gwURL+"/view/")
		if _, err := os.Stat(filepath.Join(dir, "step-5.png")); err != nil {
			t.Fatal(err)
		}
		e.noteTokens(out, "/view/")
	})
	t.Run("chromedp", func(t *testing.T) {
		out := run(t, nil, build(t, "chromedp"), pages+"/hello.html")
		want(t, out, "title: Sandgate test page", "h1: hello from the test")
	})
	t.Run("playwright", func(t *testing.T) {
		out := run(t, nil, "node", "examples/node/playwright.mjs", pages+"/hello.html")
		want(t, out, "title: Sandgate test page", "h1: hello from the test")
	})
	t.Run("puppeteer", func(t *testing.T) {
		out := run(t, nil, "node", "examples/node/puppeteer.mjs", pages+"/hello.html")
		want(t, out, "title: Sandgate test page", "h1: hello from the test")
	})
	t.Run("qa-login", func(t *testing.T) {
		site := e.fillSite(t)
		secret := "fill-secret-" + randHex(12)
		out := run(t, []string{"QA_LOGIN_URL=http://login.sandgate.test:" + fillPort + "/app/login.html", "QA_USER=" + basicUser, "QA_PASSWORD=" + secret},
			build(t, "qa-login"))
		want(t, out, "a placeholder: true", "after logging in the page is: welcome")
		if strings.Contains(out, secret) || !site.saw(secret) {
			t.Fatalf("the site saw the secret: %t; the output:\n%s", site.saw(secret), out)
		}
	})
	// Each example deletes what it made.
	if after := e.sessionCount(t, e.keyA); after > before {
		t.Fatalf("%d sessions before the examples, %d after", before, after)
	}
}

// noteTokens adds the preview tokens in out (after marker) to those the
// log check looks for.
func (e *testEnv) noteTokens(out, marker string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, f := range strings.Fields(out) {
		if i := strings.Index(f, marker); i >= 0 {
			e.tokens = append(e.tokens, f[i+len(marker):])
		}
	}
}
