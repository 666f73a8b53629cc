package test

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	sandgate "github.com/sandgate/sandgate/sdk/go"
)

// BenchmarkMCPOverhead: what MCP adds to a call, against the same call
// made with the Go SDK straight to the API in the same run (the
// baseline): session_get and screenshot, over stdio and over /mcp.
func BenchmarkMCPOverhead(b *testing.B) {
	e := needE2E(b)
	s := e.createSession(b, e.keyA, map[string]any{"kind": "desktop"})
	c := sandgate.New(e.gwURL, e.keyA)
	ctx := context.Background()
	client := mcp.NewClient(&mcp.Implementation{Name: "sandgate-bench", Version: "1"}, nil)
	stdio, err := client.Connect(ctx, &mcp.CommandTransport{Command: e.mcpCommand(e.keyA)}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer stdio.Close()
	http, err := client.Connect(ctx, e.mcpHTTP(e.keyA), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer http.Close()
	tool := func(cs *mcp.ClientSession, name string) func(*testing.B) {
		return func(b *testing.B) {
			for b.Loop() {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{"session_id": s.ID}})
				if err != nil || res.IsError {
					b.Fatalf("%s: %v %v", name, err, res)
				}
			}
		}
	}
	b.Run("get/api", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.GetSession(ctx, s.ID); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("get/mcp-stdio", tool(stdio, "session_get"))
	b.Run("get/mcp-http", tool(http, "session_get"))
	b.Run("screenshot/api", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.Act(ctx, s.ID, sandgate.Action{Action: "screenshot"}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("screenshot/mcp-stdio", tool(stdio, "screenshot"))
	b.Run("screenshot/mcp-http", tool(http, "screenshot"))
}
