package browser

import (
	"strings"
	"testing"
)

func TestRewrite(t *testing.T) {
	in := `[{"id":"A","webSocketDebuggerUrl":"ws://localhost:9222/devtools/page/A",` +
		`"devtoolsFrontendUrl":"https://x/inspector.html?ws=localhost:9222/devtools/page/A"}]`
	out, err := rewrite([]byte(in), "wss://gw.example/cdp/TOKEN")
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if !strings.Contains(s, `"ws`+`s://gw.example/cdp/TOKEN/devtools/page/A"`) ||
		!strings.Contains(s, "ws=gw.example/cdp/TOKEN/devtools/page/A") || strings.Contains(s, "9222") {
		t.Fatalf("rewrite: %s", s)
	}
	if _, err := rewrite([]byte("{not json"), "ws://x"); err == nil {
		t.Fatal("invalid JSON passed")
	}
}
