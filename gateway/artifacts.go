package gateway

import (
	"bytes"
	"context"
	"errors"
	"image"
	imgpng "image/png"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
)

// maxScreenshots bounds the screenshots (the route's) a gateway takes at
// once.
const maxScreenshots = 8

func (s *Server) screenshot(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	claims, ep, info, err := s.shells.openSession(c, id)
	if err != nil {
		return err
	}
	// A session's browser may answer with up to a CDP message's 64 MiB:
	// a few at a time per replica.
	select {
	case s.shots <- struct{}{}:
		defer func() { <-s.shots }()
	default:
		c.Set(fiber.HeaderRetryAfter, strconv.Itoa(1))
		return &apiError{status: 503, code: "unavailable", msg: "too many screenshots are being taken on this gateway now; retry"}
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	var png []byte
	if info.Kind == session.KindBrowser {
		png, err = browser.Screenshot(ctx, ep.CDP, info.Screen.Width, info.Screen.Height)
		if err == nil {
			// What the browser sent must be a PNG of at most its screen.
			cfg, derr := imgpng.DecodeConfig(bytes.NewReader(png))
			if derr != nil || cfg.Width > info.Screen.Width || cfg.Height > info.Screen.Height {
				err = errors.Join(errors.New("the browser's screenshot is no PNG of its screen"), derr)
			}
		}
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
	s.live.changed(claims) // (not an action's: an agent takes many)
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
