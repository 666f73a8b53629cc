package gateway

import (
	"net/http"

	"github.com/gofiber/fiber/v2/middleware/adaptor"
)

// WithMCP serves an MCP server (streamable HTTP) at /mcp behind the
// gateway's API-key check: a request without a valid key is refused
// with 401 before it reaches the handler. The handler must answer with
// whole JSON bodies (stateless, no SSE): Fiber's adaptor buffers a
// net/http handler's answer.
func WithMCP(h http.Handler) Option { return func(s *Server) { s.mcp = h } }

// mcpRoutes mounts the MCP server, when there is one.
func (s *Server) mcpRoutes() {
	if s.mcp == nil {
		return
	}
	s.app.All("/mcp", s.checkOrigin, s.authenticate, adaptor.HTTPHandler(s.mcp))
}
