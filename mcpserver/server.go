// Package mcpserver is Sandgate's Model Context Protocol server: tools to
// create and manage sessions, drive a desktop with Anthropic's computer
// tool actions, run commands, read and write files, take screenshots and
// hand a person a preview link. It talks to a gateway through the Go SDK
// with the caller's API key, so every call goes through the gateway's
// authentication, limits and audit trail like any other client's: over
// stdio (`sandgate mcp`) with SANDGATE_API_KEY, and on the gateway's
// /mcp with the key of each HTTP request.
package mcpserver

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	sandgate "github.com/sandgate/sandgate/sdk/go"
)

// clientFunc returns the gateway client a tool call acts with.
type clientFunc func(*mcp.CallToolRequest) (*sandgate.Client, error)

// New returns an MCP server whose tools act through c (stdio).
func New(c *sandgate.Client, version string) *mcp.Server {
	return newServer(func(*mcp.CallToolRequest) (*sandgate.Client, error) { return c, nil }, version)
}

// Handler serves MCP over streamable HTTP for the gateway at base: each
// request's "Authorization: Bearer <key>" is the API key its tool calls
// act with. It is stateless and answers with JSON (no SSE), so it works
// behind a proxy that buffers answers. host, when set, is the Host header
// of the calls (the gateway's public host, when base is its loopback
// address).
//
// Its calls are not retried (sandgate.WithRetry(0)): the gateway serving
// them is the one that would have to come back, and an MCP client that
// wants to retry does so itself. opts change that: a gateway replica
// that serves /mcp while another is to lead retries its tools' calls
// as the gateway says to (a create until a replica leads).
func Handler(base, host, version string, opts ...sandgate.Option) http.Handler {
	opts = append([]sandgate.Option{sandgate.WithRetry(0)}, opts...)
	if host != "" {
		opts = append(opts, sandgate.WithHost(host))
	}
	srv := newServer(func(req *mcp.CallToolRequest) (*sandgate.Client, error) {
		var h http.Header
		if req.Extra != nil {
			h = req.Extra.Header
		}
		key, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
		if !ok || key == "" {
			return nil, errors.New("unauthenticated: an API key is required: Authorization: Bearer <key>")
		}
		return sandgate.New(base, key, opts...), nil
	}, version)
	// A call ends with its HTTP request: the SDK hands the tools a
	// context that does not (its connection's, for the protocol
	// versions before 2026-07-28), so the request's own is kept in the
	// context's values and ends the call's (endsWithRequest).
	srv.AddReceivingMiddleware(endsWithRequest)
	// The SDK's DNS-rebinding guard refuses a non-loopback Host on a
	// loopback listener: the gateway behind a reverse proxy. The gateway
	// checks Host and Origin itself, and a rebinding page has no API key.
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, DisableLocalhostProtection: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestContext{}, r.Context())))
	})
}

// requestContext is the key of the HTTP request's context (Handler).
type requestContext struct{}

// endsWithRequest ends a message's handling (a tool's call to the
// gateway, a create waiting for its session) when the HTTP request that
// brought it ends: its client hung up.
func endsWithRequest(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if rc, ok := ctx.Value(requestContext{}).(context.Context); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
			defer context.AfterFunc(rc, cancel)()
		}
		return next(ctx, method, req)
	}
}

func newServer(client clientFunc, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "sandgate", Title: "Sandgate", Version: version}, &mcp.ServerOptions{
		Instructions: "Sandgate runs disposable, isolated browser and desktop sessions. " +
			"Create a session (kind desktop for computer use, browser for CDP), act in it with computer, exec, read_file and write_file, " +
			"hand a person a view link with preview, and delete the session when done: it also ends at its TTL.",
	})
	t := &tools{client: client}
	t.register(s)
	return s
}

// schemaFor infers T's input schema and sets the enums given per
// property.
func schemaFor[T any](enums map[string][]string) *jsonschema.Schema {
	sc, err := jsonschema.For[T](nil)
	if err != nil {
		panic(err)
	}
	for prop, vals := range enums {
		p := sc.Properties[prop]
		for _, v := range vals {
			p.Enum = append(p.Enum, v)
		}
	}
	return sc
}

func ptr[T any](v T) *T { return &v }

// Annotations of the tools: what a client may call without asking.
var (
	readOnly    = &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)}
	additive    = &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)}
	idempotent  = &mcp.ToolAnnotations{DestructiveHint: ptr(false), IdempotentHint: true, OpenWorldHint: ptr(false)}
	destructive = &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)}
	// In a session: a browser or shell there may reach whatever its
	// egress allows.
	acting = &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(true)}
)

// toolError is what a failed call tells the model: the gateway's code
// and message, never more.
func toolError(err error) error {
	var e *sandgate.Error
	if errors.As(err, &e) {
		return errors.New(e.Code + ": " + e.Message)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return errors.New("timed out")
	}
	return err
}
