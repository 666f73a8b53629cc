package gateway

import (
	"bytes"
	"embed"
	"html/template"
	"io/fs"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/session"
)

// The viewer page and its assets, noVNC bundled from the pinned npm
// package (gateway/viewer/package.json, `make viewer`).
//
//go:embed viewer/viewer.html viewer/static
var viewerFS embed.FS

var viewerPage = template.Must(template.ParseFS(viewerFS, "viewer/viewer.html"))

var viewerAssets = map[string]string{
	"novnc.js":   "text/javascript; charset=utf-8",
	"viewer.js":  "text/javascript; charset=utf-8",
	"viewer.css": "text/css; charset=utf-8",
}

// viewerAsset serves the viewer's static files; they hold no secrets.
func (s *Server) viewerAsset(c *fiber.Ctx) error {
	name := c.Params("name")
	ct, ok := viewerAssets[name]
	if !ok {
		return errNotFound("no such asset")
	}
	data, err := fs.ReadFile(viewerFS, "viewer/static/"+name)
	if err != nil {
		return errNotFound("no such asset")
	}
	c.Set(fiber.HeaderContentType, ct)
	c.Set(fiber.HeaderCacheControl, "public, max-age=3600")
	return c.Send(data)
}

// viewPage serves the live viewer of a `view` preview.
func (s *Server) viewPage(c *fiber.Ctx) error {
	claims := c.Locals(localClaims).(*previewClaims)
	info := c.Locals(localInfo).(session.Info) // as admitted (previewAuth)
	var b bytes.Buffer
	err := viewerPage.Execute(&b, map[string]any{
		"Session":   claims.Session,
		"WSURL":     s.wsScheme + "://" + c.Hostname() + "/vnc/" + c.Params("token"),
		"ExpiresAt": claims.ExpiresAt.Time.UTC().Format(time.RFC3339),
		"ViewOnly":  claims.ViewOnly,
		"Isolation": info.Isolation,
	})
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderContentType, fiber.MIMETextHTMLCharsetUTF8)
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Set("Referrer-Policy", "no-referrer")
	c.Set("Content-Security-Policy", "default-src 'self'; connect-src 'self' "+s.wsScheme+"://"+c.Hostname()+"; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; worker-src blob:")
	return c.Send(b.Bytes())
}
