package test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTypeScriptSDK runs the TypeScript SDK's own tests
// (sdk/typescript/test, node's test runner) against this gateway: every
// call of the SDK through the real API, Playwright and Puppeteer through
// its previews, no mocks.
func TestTypeScriptSDK(t *testing.T) {
	e := needE2E(t)
	const dir = "../sdk/typescript"
	if _, err := os.Stat(dir + "/node_modules/playwright-core"); err != nil {
		t.Fatal("sdk/typescript has no node_modules: `make test` runs npm ci there")
	}
	label := t.Name()
	// Whatever the node tests leave behind (a crash, a timeout) goes.
	t.Cleanup(func() {
		_, body := e.api(t, e.keyA, "GET", "/v1/sessions", nil)
		var list struct {
			Sessions []sessionInfo `json:"sessions"`
		}
		json.Unmarshal(body, &list)
		for _, s := range list.Sessions {
			if s.Labels["test"] == label && s.State != "stopped" {
				e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1", "test/sdk.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"SANDGATE_URL="+e.gwURL,
		"SANDGATE_API_KEY="+e.keyA,
		"SANDGATE_TEST_PAGE="+testPages(t)+"/hello.html",
		"SANDGATE_TEST_LABEL="+label,
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test: %v\n%s\nthe tests that failed:\n%s", err, out, notOK(out))
	}
	// Passing is not enough: the tests must have run, none skipped.
	count := func(what string) int {
		m := regexp.MustCompile(`(?m)^# ` + what + ` (\d+)$`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("no %q in the node output:\n%s", what, out)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	if pass, fail, skipped := count("pass"), count("fail"), count("skipped"); pass < 17 || fail != 0 || skipped != 0 {
		t.Fatalf("node --test: %d passed, %d failed, %d skipped:\n%s\nthe tests that failed:\n%s", pass, fail, skipped, out, notOK(out))
	}
	t.Logf("node --test:\n%s", out)
}

// notOK picks the failed tests out of node's TAP output, each with the
// report under it, so a failure's reason shows at the end of a long log
// (CI shows the end).
func notOK(out []byte) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(string(out), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "not ok "):
			in = true
		case in && (strings.HasPrefix(trimmed, "ok ") || strings.HasPrefix(trimmed, "# ")):
			in = false
		}
		if in {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}
