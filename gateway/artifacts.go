package gateway

import (
	"context"
	"errors"
	"image"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
)

func (s *Server) screenshot(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	claims, ep, info, err := s.shells.openSession(c, id)
	if err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	var png []byte
	if info.Kind == session.KindBrowser {
		png, err = browser.Screenshot(ctx, ep.CDP, info.Screen.Width, info.Screen.Height)
	} else {
		png, err = screenPNG(ctx, ep, info.Screen, image.Rectangle{})
	}
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the session did not deliver a screenshot", err: err}
	}
	a, err := s.storeScreenshot(ctx, claims, png)
	if err != nil {
		return err
	}
	s.log.Info("screenshot stored", "session", id, "artifact", a.ID, "bytes", a.Size)
	return c.Status(fiber.StatusCreated).JSON(a)
}

func (s *Server) storeScreenshot(ctx context.Context, claims *previewClaims, png []byte) (recordings.Artifact, error) {
	name := "screenshot-" + time.Now().UTC().Format("20060102T150405.000Z") + ".png"
	if s.store == nil {
		return recordings.Artifact{}, &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable"}
	}
	a, err := s.store.Put(ctx, claims.Tenant, claims.Session, recordings.KindScreenshot, name, "image/png", png)
	if err != nil {
		return a, &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
	}
	s.live.record(claims, "screenshot", screenshotFields(a))
	return a, nil
}

// screenshotFields are the fields of a screenshot's event in the trail:
// the same whichever replica took it.
func screenshotFields(a recordings.Artifact) map[string]any {
	return map[string]any{"artifact": a.ID, "size": a.Size, "sha256": a.SHA256}
}

func (s *Server) listArtifacts(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	tenant := tenantOf(c)
	_, known := s.sessions.Get(tenant, id)
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	as, err := s.store.List(ctx, tenant, id)
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
	}
	if known != nil && len(as) == 0 {
		return errNotFound("no such session")
	}
	return c.JSON(fiber.Map{"artifacts": as})
}

func (s *Server) getArtifact(c *fiber.Ctx) error {
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	u, err := s.store.PresignedURL(ctx, tenantOf(c), c.Params("id"))
	if errors.Is(err, recordings.ErrNotFound) {
		return errNotFound("no such artifact")
	}
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Redirect(u.String(), fiber.StatusFound)
}
