package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/desktop"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
)

// sessionExec runs commands in one session for desktop actions.
type sessionExec struct {
	s      *Server
	claims *previewClaims
}

// maxActionOutput bounds what is kept of an action's command's output
// (it comes from inside the session).
const maxActionOutput = 64 << 10

func (e sessionExec) Exec(ctx context.Context, argv []string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	code, err := e.s.runSpec(ctx, e.claims, session.ExecSpec{Args: argv,
		Stdout: &limitWriter{w: &stdout, n: maxActionOutput}, Stderr: &limitWriter{w: &stderr, n: 256}})
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, fmt.Errorf("%s exited %d: %s", argv[0], code, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// screenPNG captures the session's whole screen over VNC, from outside
// the sandbox, and encodes it as PNG. The VNC server may announce at most
// the session's configured screen. A non-empty crop (inside the screen)
// keeps only that part, at full resolution (zoom).
func screenPNG(ctx context.Context, ep session.Endpoint, screen session.Screen, crop image.Rectangle) ([]byte, error) {
	img, err := desktop.Capture(ctx, ep.VNC.String(), screen.Width, screen.Height)
	if err != nil {
		return nil, err
	}
	var out image.Image = img
	if !crop.Empty() {
		if !crop.In(img.Bounds()) {
			return nil, fmt.Errorf("zoom region %v is outside the captured screen %v", crop, img.Bounds())
		}
		out = img.SubImage(crop)
	}
	var b bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	if err := enc.Encode(&b, out); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

type actionResponse struct {
	Action   string               `json:"action"`
	Cursor   *cursor              `json:"cursor,omitempty"`
	Image    string               `json:"image,omitempty"` // base64 PNG
	Artifact *recordings.Artifact `json:"artifact,omitempty"`
	TookMS   int64                `json:"took_ms"`
}

type cursor struct {
	X int `json:"x"`
	Y int `json:"y"`
}

// action runs one computer-use action. Input goes through xdotool inside
// the session (containerd exec); screenshots are read over VNC from the
// gateway's side.
func (s *Server) action(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	if fillsCredential(c.Body()) {
		return s.fillCredential(c, tenantOf(c), id)
	}
	var a desktop.Action
	if err := decode(c, &a); err != nil {
		return err
	}
	claims, ep, info, err := s.shells.openSession(c, id)
	if err != nil {
		return err
	}
	steps, err := desktop.Plan(a, info.Screen.Width, info.Screen.Height)
	if errors.Is(err, desktop.ErrInvalid) {
		return errInvalid(strings.TrimPrefix(err.Error(), desktop.ErrInvalid.Error()+": "))
	}
	if err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 60*time.Second)
	defer cancel()
	start := time.Now()
	ex := sessionExec{s: s, claims: claims}
	if err := desktop.Run(ctx, ex, steps); err != nil {
		return actionError(err)
	}
	s.live.touch(claims)
	s.live.record(claims, "action", map[string]any{"action": a.Action})
	resp := actionResponse{Action: a.Action}
	switch a.Action {
	case "cursor_position":
		x, y, err := desktop.CursorPosition(ctx, ex)
		if err != nil {
			return actionError(err)
		}
		resp.Cursor = &cursor{X: x, Y: y}
	case "screenshot", "wait", "zoom":
		var crop image.Rectangle
		if a.Action == "zoom" {
			crop, _ = desktop.ZoomRect(a.Region, info.Screen.Width, info.Screen.Height) // checked by Plan
		}
		png, err := screenPNG(ctx, ep, info.Screen, crop)
		if err != nil {
			return &apiError{status: 503, code: "unavailable", msg: "the session's display did not deliver a screenshot", err: err}
		}
		art, err := s.storeScreenshot(ctx, claims, png)
		if err != nil {
			return err
		}
		resp.Image = base64.StdEncoding.EncodeToString(png)
		resp.Artifact = &art
	}
	resp.TookMS = time.Since(start).Milliseconds()
	s.log.Info("action carried out", "session", id, "action", a.Action, "took_ms", resp.TookMS)
	return c.JSON(resp)
}

// fillsCredential: the action body asks for fill_credential, which the
// vault's holder carries out (the leader: a relay passes it on whole).
func fillsCredential(body []byte) bool {
	var kind struct {
		Action string `json:"action"`
	}
	return json.Unmarshal(body, &kind) == nil && kind.Action == "fill_credential"
}

func actionError(err error) error {
	var pe *session.PublicError
	if errors.As(err, &pe) {
		return err
	}
	return &apiError{status: 503, code: "unavailable", msg: "the action could not be carried out in the session", err: err}
}
