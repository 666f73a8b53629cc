package sandgate

import (
	"context"
	"encoding/base64"
	"net/url"
	"time"
)

// Action is one computer-use action, with Anthropic's computer tool's
// names and fields: screenshot, zoom, cursor_position, mouse_move,
// left_click, right_click, middle_click, double_click, triple_click,
// left_click_drag, left_mouse_down, left_mouse_up, scroll, type, key,
// hold_key, wait.
type Action struct {
	Action          string  `json:"action"`
	Coordinate      []int   `json:"coordinate,omitempty"`
	StartCoordinate []int   `json:"start_coordinate,omitempty"`
	Text            string  `json:"text,omitempty"`
	ScrollDirection string  `json:"scroll_direction,omitempty"`
	ScrollAmount    int     `json:"scroll_amount,omitempty"`
	Duration        float64 `json:"duration,omitempty"`
	// Region is zoom's [x0, y0, x1, y1]: the screen's part to return at
	// full resolution.
	Region []int `json:"region,omitempty"`
}

// ActionResult is what an action returned. Screenshot, zoom and wait
// carry a PNG (also stored as an artifact); cursor_position the cursor.
type ActionResult struct {
	Action   string        `json:"action"`
	Cursor   *Point        `json:"cursor,omitempty"`
	PNG      []byte        `json:"-"`
	Artifact *Artifact     `json:"artifact,omitempty"`
	Took     time.Duration `json:"-"` // from took_ms
}

// Point is a position on the screen.
type Point struct {
	X int `json:"x"`
	Y int `json:"y"`
}

// Act runs one computer-use action in a session.
func (c *Client) Act(ctx context.Context, id string, a Action) (*ActionResult, error) {
	var out struct {
		ActionResult
		Image  string `json:"image"`
		TookMS int64  `json:"took_ms"`
	}
	if err := c.call(ctx, "POST", "/v1/sessions/"+url.PathEscape(id)+"/actions", a, &out); err != nil {
		return nil, err
	}
	res := out.ActionResult
	res.Took = time.Duration(out.TookMS) * time.Millisecond
	if out.Image != "" {
		png, err := base64.StdEncoding.DecodeString(out.Image)
		if err != nil {
			return nil, err
		}
		res.PNG = png
	}
	return &res, nil
}

// FillCredential types a credential bound to the session into the page
// field that selector names, only while the page is at the binding's
// destination. Field is "secret" (default) or "username". Unless the
// binding says fill "value", the page gets a placeholder that the egress
// proxy swaps for the secret: the agent never reads the secret.
func (c *Client) FillCredential(ctx context.Context, id, credential, selector, field string) error {
	in := map[string]string{"action": "fill_credential", "credential": credential, "selector": selector, "field": field}
	return c.call(ctx, "POST", "/v1/sessions/"+url.PathEscape(id)+"/actions", in, nil)
}

// Screenshot stores a PNG of the session's screen as an artifact.
func (c *Client) Screenshot(ctx context.Context, id string) (*Artifact, error) {
	var a Artifact
	if err := c.call(ctx, "POST", "/v1/sessions/"+url.PathEscape(id)+"/screenshot", nil, &a); err != nil {
		return nil, err
	}
	return &a, nil
}
