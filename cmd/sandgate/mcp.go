package main

import (
	"context"
	"net"
	"runtime/debug"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandgate/sandgate/mcpserver"
	sandgate "github.com/sandgate/sandgate/sdk/go"
)

// cmdMCP serves Sandgate's MCP tools over stdio for the gateway at
// SANDGATE_URL with SANDGATE_API_KEY (an MCP client starts it).
func cmdMCP(ctx context.Context, args []string) error {
	if len(args) != 0 {
		return usageError("usage: sandgate mcp   (SANDGATE_URL and SANDGATE_API_KEY in the environment)")
	}
	c, err := sandgate.FromEnv()
	if err != nil {
		return err
	}
	return mcpserver.New(c, version()).Run(ctx, &mcp.StdioTransport{})
}

// version is the binary's VCS revision, or "dev".
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return s.Value[:12]
			}
		}
	}
	return "dev"
}

// loopbackURL is how the gateway's own MCP server reaches the gateway:
// its listen address, with an unspecified host made loopback.
func loopbackURL(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return "http://" + net.JoinHostPort(host, port), nil
}
