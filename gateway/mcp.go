package gateway

import (
	"context"
	"mime"
	"net/http"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
)

// mcpBodyLimit bounds a message to /mcp: write_file's 8 MiB, as base64,
// in JSON-RPC.
const mcpBodyLimit = 12 << 20

// WithMCP serves an MCP server (streamable HTTP) at /mcp behind the
// gateway's API-key check: a request without a valid key is refused
// with 401 before it reaches the handler. The handler must answer with
// whole JSON bodies (stateless, no SSE): Fiber's adaptor buffers a
// net/http handler's answer.
func WithMCP(h http.Handler) Option { return func(s *Server) { s.mcp = h } }

// mcpRoutes mounts the MCP server, when there is one, behind
// authenticate (the gateway's API-key check; a relay's, by its copy of
// the tenants). Only POST reaches it: the server is stateless, so it
// offers no SSE stream (GET) and has no session to end (DELETE). Those,
// and a body or Accept header the transport cannot take, get the
// contract's JSON error here rather than the handler's plain text.
func (s *Server) mcpRoutes(authenticate fiber.Handler) {
	if s.mcp == nil {
		return
	}
	s.app.Post("/mcp", s.checkOrigin, authenticate, checkMCPRequest, s.mcpServe())
	notAllowed := func(c *fiber.Ctx) error {
		c.Set(fiber.HeaderAllow, fiber.MethodPost)
		return &apiError{status: 405, code: "invalid_argument", msg: "this MCP server is stateless: send JSON-RPC messages with POST; it has no SSE stream and no session to delete"}
	}
	s.app.Get("/mcp", s.checkOrigin, authenticate, notAllowed)
	s.app.Delete("/mcp", s.checkOrigin, authenticate, notAllowed)
}

// mcpServe runs the MCP server for a request, under a context that
// ends when its client hangs up (watchPeer): a tool's call to the API
// (a create waiting for its session, a command) is cancelled with it,
// and the create rolled back, rather than carried on for nobody.
// Fiber's adaptor hands a net/http handler the server's context, which
// never ends with the connection.
func (s *Server) mcpServe() fiber.Handler {
	h := adaptor.HTTPHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ctx, ok := r.Context().Value(mcpContext{}).(context.Context); ok {
			r = r.WithContext(ctx)
		}
		s.mcp.ServeHTTP(w, r)
	}))
	return func(c *fiber.Ctx) error {
		ctx, cancel := context.WithCancel(c.Context()) // (the server's, too)
		defer cancel()
		stop, _ := watchPeer(c, cancel)
		defer stop()
		c.Context().SetUserValue(mcpContext{}, ctx)
		return h(c)
	}
}

// mcpContext is the key of the context mcpServe hands the MCP server.
type mcpContext struct{}

// checkMCPRequest holds a POST to what the streamable HTTP transport
// requires: a JSON body, and an Accept that takes both JSON and SSE.
func checkMCPRequest(c *fiber.Ctx) error {
	if mt, _, _ := mime.ParseMediaType(c.Get(fiber.HeaderContentType)); mt != "application/json" {
		return &apiError{status: 415, code: "invalid_argument", msg: "the body must be JSON-RPC with Content-Type: application/json"}
	}
	var json, sse bool
	for _, v := range c.Request().Header.PeekAll(fiber.HeaderAccept) {
		for _, part := range strings.Split(string(v), ",") {
			base, _, _ := strings.Cut(part, ";")
			switch strings.ToLower(strings.TrimSpace(base)) {
			case "application/json", "application/*":
				json = true
			case "text/event-stream", "text/*":
				sse = true
			case "*/*":
				json, sse = true, true
			}
		}
	}
	if !json || !sse {
		return errInvalid("Accept must name both application/json and text/event-stream, as MCP's streamable HTTP transport requires")
	}
	return c.Next()
}
