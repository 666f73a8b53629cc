package test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strconv"
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
		t.Fatalf("node --test: %v\n%s", err, out)
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
		t.Fatalf("node --test: %d passed, %d failed, %d skipped:\n%s", pass, fail, skipped, out)
	}
	t.Logf("node --test:\n%s", out)
}
