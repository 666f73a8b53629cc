package test

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestPlaywrightMCP: Microsoft's Playwright MCP server (@playwright/mcp
// from npm, unmodified) attaches to a session through the gateway with
// --cdp-endpoint http://gw/cdp and the preview token in --cdp-header,
// navigates to a page and reads it. With a wrong token it gets nothing.
func TestPlaywrightMCP(t *testing.T) {
	e := needE2E(t)
	if _, err := os.Stat("node/node_modules/@playwright/mcp/cli.js"); err != nil {
		t.Fatal("test/node has no @playwright/mcp: `make test` runs npm ci there")
	}
	s := e.createSession(t, e.keyA, nil)
	p := e.preview(t, e.keyA, s.ID, 300)
	token := p.URL[strings.LastIndex(p.URL, "/")+1:]
	pages := testPages(t)

	start := func(token string) *mcp.ClientSession {
		cmd := exec.Command("node", "node/node_modules/@playwright/mcp/cli.js",
			"--cdp-endpoint", e.gwURL+"/cdp", "--cdp-header", "Authorization: Bearer "+token,
			"--cdp-timeout", "20000", "--output-dir", t.TempDir())
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1")
		return mcpConnect(t, &mcp.CommandTransport{Command: cmd})
	}
	navigate := func(cs *mcp.ClientSession) (*mcp.CallToolResult, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		return cs.CallTool(ctx, &mcp.CallToolParams{Name: "browser_navigate", Arguments: map[string]any{"url": pages + "/hello.html"}})
	}

	cs := start(token)
	res, err := navigate(cs)
	if err != nil || res.IsError {
		t.Fatalf("browser_navigate: %v %s", err, textOf(res))
	}
	if txt := textOf(res); !strings.Contains(txt, "Sandgate test page") {
		t.Fatalf("browser_navigate did not reach the page:\n%s", txt)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "browser_evaluate", Arguments: map[string]any{"function": "() => String(6 * 7) + ' from ' + location.pathname"}})
	if err != nil || res.IsError || !strings.Contains(textOf(res), "42 from /hello.html") {
		t.Fatalf("browser_evaluate: %v %s", err, textOf(res))
	}
	// The session's own browser did it: its page list shows the page.
	resp, err := http.Get(p.URL + "/json/list")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "/hello.html") {
		t.Fatalf("the session's targets: %d %s", resp.StatusCode, body)
	}

	bad := start("x" + token)
	res, err = navigate(bad)
	if err == nil && !res.IsError {
		t.Fatalf("browser_navigate with a wrong token: %s", textOf(res))
	}
}

func textOf(res *mcp.CallToolResult) string {
	if res == nil {
		return ""
	}
	return contentText(res)
}
