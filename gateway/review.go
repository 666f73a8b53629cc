package gateway

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/recordings"
)

//go:embed review/review.html
var reviewFS embed.FS

var reviewPage = template.Must(template.ParseFS(reviewFS, "review/review.html"))

// reviewAuth checks a review preview. Unlike the live previews it does
// not need the session to run: a review is for afterwards.
func (s *Server) reviewAuth(c *fiber.Ctx) error {
	claims, err := s.tokens.verify(c.Params("token"), time.Now())
	if err != nil || claims.Scope != ScopeReview || s.sessions.Revoked(claims.Session, claims.ID) || !s.tenants.Enabled(claims.Tenant) {
		return errUnauthenticated("the preview token is missing, invalid or expired")
	}
	c.Locals(localClaims, claims)
	return c.Next()
}

// review serves the review page: the recording in a player and every
// artifact of the session, each behind a fresh presigned link.
func (s *Server) review(c *fiber.Ctx) error {
	claims := c.Locals(localClaims).(*previewClaims)
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	as, err := s.store.List(ctx, claims.Tenant, claims.Session)
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
	}
	data := map[string]any{
		"Session": claims.Session, "Artifacts": as, "Base": "/review/" + c.Params("token"),
		"ExpiresAt": claims.ExpiresAt.Time.UTC().Format(time.RFC3339),
	}
	segments := 0
	for i := range as {
		switch {
		case as[i].Kind == recordings.KindRecording && as[i].ContentType == "video/mp4":
			data["Recording"] = as[i]
		case as[i].Kind == recordings.KindSegment:
			segments++
		}
	}
	data["Segments"] = segments
	var b bytes.Buffer
	if err := reviewPage.Execute(&b, data); err != nil {
		return err
	}
	c.Set(fiber.HeaderContentType, fiber.MIMETextHTMLCharsetUTF8)
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Set("Referrer-Policy", "no-referrer")
	c.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; media-src *; img-src *")
	return c.Send(b.Bytes())
}

// reviewArtifact redirects to a fresh presigned URL of one of the
// session's artifacts.
func (s *Server) reviewArtifact(c *fiber.Ctx) error {
	claims := c.Locals(localClaims).(*previewClaims)
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	a, _, err := s.store.Find(ctx, claims.Tenant, c.Params("id"))
	if errors.Is(err, recordings.ErrNotFound) || (err == nil && a.Session != claims.Session) {
		return errNotFound("no such artifact")
	}
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
	}
	u, err := s.store.PresignedURL(ctx, claims.Tenant, a.ID)
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: fmt.Errorf("presign: %w", err)}
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Redirect(u.String(), fiber.StatusFound)
}
