package mcpserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	sandgate "github.com/sandgate/sandgate/sdk/go"
)

type tools struct {
	client clientFunc
}

// Bounds of what a tool hands the model.
const (
	maxToolOutput = 64 << 10 // exec's stdout and stderr, each
	maxReadFile   = 1 << 20
	maxWriteFile  = 8 << 20
)

type sessionID struct {
	SessionID string `json:"session_id" jsonschema:"the session's id (sg-...)"`
}

type createIn struct {
	Kind         string            `json:"kind,omitempty" jsonschema:"desktop (a VNC desktop with Chromium, for computer use) or browser (Chromium for CDP clients); default browser"`
	Runtime      string            `json:"runtime,omitempty" jsonschema:"runtime handler (kata, gvisor, runc); default: the gateway's"`
	TTLSeconds   int               `json:"ttl_seconds,omitempty" jsonschema:"seconds until the session ends; default: the tenant's"`
	ScreenWidth  int               `json:"screen_width,omitempty" jsonschema:"display width in pixels"`
	ScreenHeight int               `json:"screen_height,omitempty" jsonschema:"display height in pixels"`
	Record       bool              `json:"record,omitempty" jsonschema:"record the screen for reviewers"`
	Allow        []string          `json:"allow,omitempty" jsonschema:"destinations the session may reach, host:port or *.domain:port"`
	Labels       map[string]string `json:"labels,omitempty" jsonschema:"labels to find the session by"`
	Profile      string            `json:"profile,omitempty" jsonschema:"a browser profile to start with (prof_...): its cookies, local storage and logins"`
	KeepProfile  bool              `json:"keep_profile,omitempty" jsonschema:"write the profile back when the session ends cleanly (the session holds it alone meanwhile)"`
	Snapshot     string            `json:"snapshot,omitempty" jsonschema:"a workspace snapshot to start from (the id session_snapshot returned): its files, not its processes"`
}

type sessionsOut struct {
	Sessions []sandgate.Session `json:"sessions"`
}

type extendIn struct {
	SessionID  string `json:"session_id" jsonschema:"the session's id"`
	TTLSeconds int    `json:"ttl_seconds" jsonschema:"the session ends this many seconds from now (bounded by the tenant's maximum)"`
}

type computerIn struct {
	SessionID       string  `json:"session_id" jsonschema:"the session's id (a desktop session)"`
	Action          string  `json:"action" jsonschema:"the action, as in Anthropic's computer tool"`
	Coordinate      []int   `json:"coordinate,omitempty" jsonschema:"[x, y] in screen pixels"`
	StartCoordinate []int   `json:"start_coordinate,omitempty" jsonschema:"[x, y] where left_click_drag starts"`
	Text            string  `json:"text,omitempty" jsonschema:"text to type; keys for key and hold_key (xdotool names such as ctrl+l, Return); modifiers held during a click or scroll"`
	ScrollDirection string  `json:"scroll_direction,omitempty" jsonschema:"up, down, left or right"`
	ScrollAmount    int     `json:"scroll_amount,omitempty" jsonschema:"scroll wheel clicks"`
	Duration        float64 `json:"duration,omitempty" jsonschema:"seconds, for wait and hold_key"`
	Region          []int   `json:"region,omitempty" jsonschema:"zoom: [x0, y0, x1, y1], the part of the screen to see at full resolution"`
}

type execIn struct {
	SessionID      string            `json:"session_id" jsonschema:"the session's id"`
	Command        string            `json:"command" jsonschema:"a bash command line, run with bash -lc"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds; default: the gateway's"`
}

type execOut struct {
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
}

type readIn struct {
	SessionID string `json:"session_id" jsonschema:"the session's id"`
	Path      string `json:"path" jsonschema:"absolute path in the session"`
}

type readOut struct {
	Path string `json:"path"`
	Size int    `json:"size"`
	// Content is the file as text; ContentBase64 when it is not UTF-8.
	Content       string `json:"content,omitempty"`
	ContentBase64 string `json:"content_base64,omitempty"`
}

type writeIn struct {
	SessionID     string `json:"session_id" jsonschema:"the session's id"`
	Path          string `json:"path" jsonschema:"absolute path in the session; parent directories are made"`
	Content       string `json:"content,omitempty" jsonschema:"the file's text"`
	ContentBase64 string `json:"content_base64,omitempty" jsonschema:"the file's bytes, base64 (instead of content)"`
}

type previewIn struct {
	SessionID  string `json:"session_id" jsonschema:"the session's id"`
	Scope      string `json:"scope,omitempty" jsonschema:"view (a page a person opens to watch, default), cdp (an endpoint for CDP clients), vnc (a raw VNC WebSocket) or review (recording, downloads and audit trail)"`
	TTLSeconds int    `json:"ttl_seconds,omitempty" jsonschema:"seconds the link works; default 300"`
	ViewOnly   bool   `json:"view_only,omitempty" jsonschema:"the person can watch but not type or click"`
}

type screenshotOut struct {
	Artifact string `json:"artifact"`
	Width    int    `json:"width"`
	Height   int    `json:"height"`
}

func (t *tools) register(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: "session_create", Title: "Create a session", Annotations: additive,
		Description: "Create a disposable, isolated session and wait until it runs. kind desktop is for computer use; browser for CDP clients.",
		InputSchema: schemaFor[createIn](map[string][]string{"kind": {"browser", "desktop"}})}, t.create)
	mcp.AddTool(s, &mcp.Tool{Name: "session_list", Title: "List sessions", Annotations: readOnly,
		Description: "List your sessions, running and recently ended."}, t.list)
	mcp.AddTool(s, &mcp.Tool{Name: "session_get", Title: "Get a session", Annotations: readOnly,
		Description: "Show one session: state, kind, screen, when it expires."}, t.get)
	mcp.AddTool(s, &mcp.Tool{Name: "session_extend", Title: "Extend a session", Annotations: idempotent,
		Description: "Set a session to end ttl_seconds from now."}, t.extend)
	mcp.AddTool(s, &mcp.Tool{Name: "session_delete", Title: "Delete a session", Annotations: destructive,
		Description: "Stop a session for good. Its recording, downloads and audit trail stay for reviewers."}, t.delete)
	mcp.AddTool(s, &mcp.Tool{Name: "computer", Title: "Use the computer", Annotations: acting,
		Description: "Use a desktop session's mouse, keyboard and screen with the actions of Anthropic's computer tool " +
			"(computer_20251124, zoom included). screenshot, zoom and wait return the screen; after an input action the screen as it is then.",
		InputSchema: schemaFor[computerIn](map[string][]string{
			"action":           {"screenshot", "zoom", "cursor_position", "mouse_move", "left_click", "right_click", "middle_click", "double_click", "triple_click", "left_click_drag", "left_mouse_down", "left_mouse_up", "scroll", "type", "key", "hold_key", "wait"},
			"scroll_direction": {"up", "down", "left", "right"},
		})}, t.computer)
	mcp.AddTool(s, &mcp.Tool{Name: "screenshot", Title: "Take a screenshot", Annotations: readOnly,
		Description: "Return the session's screen as a PNG image (also stored for reviewers)."}, t.screenshot)
	mcp.AddTool(s, &mcp.Tool{Name: "exec", Title: "Run a command", Annotations: acting,
		Description: "Run a bash command line in the session as its user and return its exit code, stdout and stderr (each cut at 64 KiB)."}, t.exec)
	mcp.AddTool(s, &mcp.Tool{Name: "read_file", Title: "Read a file", Annotations: readOnly,
		Description: "Read a file of the session (at most 1 MiB): text as is, other bytes as base64."}, t.readFile)
	mcp.AddTool(s, &mcp.Tool{Name: "write_file", Title: "Write a file", Annotations: destructive,
		Description: "Write a file in the session (at most 8 MiB), replacing what is there."}, t.writeFile)
	mcp.AddTool(s, &mcp.Tool{Name: "session_snapshot", Title: "Save a session's files", Annotations: additive,
		Description: "Save the session's home directory and workspace (files only: running processes are not kept). A new session_create with snapshot starts with them."}, t.snapshot)
	mcp.AddTool(s, &mcp.Tool{Name: "preview", Title: "Share a preview link", Annotations: additive,
		Description: "Make an expiring link to the session: view for a person to watch (view_only) or take over, cdp for a CDP client, review for its recording and audit trail.",
		InputSchema: schemaFor[previewIn](map[string][]string{"scope": {"view", "cdp", "vnc", "review"}})}, t.preview)
}

func (t *tools) create(ctx context.Context, req *mcp.CallToolRequest, in createIn) (*mcp.CallToolResult, *sandgate.Session, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, nil, err
	}
	r := sandgate.SessionRequest{Kind: in.Kind, Runtime: in.Runtime, TTLSeconds: in.TTLSeconds, Record: in.Record, Labels: in.Labels}
	if in.ScreenWidth != 0 || in.ScreenHeight != 0 {
		r.Screen = &sandgate.Screen{Width: in.ScreenWidth, Height: in.ScreenHeight}
	}
	if len(in.Allow) > 0 {
		r.Egress = &sandgate.EgressRequest{Allow: in.Allow}
	}
	if in.Profile != "" {
		r.Profile = &sandgate.ProfileUse{ID: in.Profile, Persist: in.KeepProfile}
	}
	r.Snapshot = in.Snapshot
	s, err := c.CreateSession(ctx, r)
	if err != nil {
		return nil, nil, toolError(err)
	}
	return nil, s, nil
}

func (t *tools) snapshot(ctx context.Context, req *mcp.CallToolRequest, in sessionID) (*mcp.CallToolResult, *sandgate.Snapshot, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, nil, err
	}
	snap, err := c.CreateSnapshot(ctx, in.SessionID)
	if err != nil {
		return nil, nil, toolError(err)
	}
	return nil, snap, nil
}

func (t *tools) list(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, *sessionsOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, nil, err
	}
	ss, err := c.ListSessions(ctx)
	if err != nil {
		return nil, nil, toolError(err)
	}
	if ss == nil {
		ss = []sandgate.Session{}
	}
	return nil, &sessionsOut{Sessions: ss}, nil
}

func (t *tools) get(ctx context.Context, req *mcp.CallToolRequest, in sessionID) (*mcp.CallToolResult, *sandgate.Session, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, nil, err
	}
	s, err := c.GetSession(ctx, in.SessionID)
	if err != nil {
		return nil, nil, toolError(err)
	}
	return nil, s, nil
}

func (t *tools) extend(ctx context.Context, req *mcp.CallToolRequest, in extendIn) (*mcp.CallToolResult, *sandgate.Session, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, nil, err
	}
	s, err := c.ExtendSession(ctx, in.SessionID, time.Duration(in.TTLSeconds)*time.Second)
	if err != nil {
		return nil, nil, toolError(err)
	}
	return nil, s, nil
}

func (t *tools) delete(ctx context.Context, req *mcp.CallToolRequest, in sessionID) (*mcp.CallToolResult, *sandgate.Session, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, nil, err
	}
	s, err := c.DeleteSession(ctx, in.SessionID)
	if err != nil {
		return nil, nil, toolError(err)
	}
	return nil, s, nil
}

// computer runs one action. Like the reference computer tool, an input
// action answers with the screen as it is afterwards, so the model sees
// what its action did.
func (t *tools) computer(ctx context.Context, req *mcp.CallToolRequest, in computerIn) (*mcp.CallToolResult, any, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, nil, err
	}
	res, err := c.Act(ctx, in.SessionID, sandgate.Action{
		Action: in.Action, Coordinate: in.Coordinate, StartCoordinate: in.StartCoordinate, Text: in.Text,
		ScrollDirection: in.ScrollDirection, ScrollAmount: in.ScrollAmount, Duration: in.Duration, Region: in.Region,
	})
	if err != nil {
		return nil, nil, toolError(err)
	}
	switch {
	case res.Cursor != nil:
		return text(fmt.Sprintf("X=%d,Y=%d", res.Cursor.X, res.Cursor.Y)), nil, nil
	case res.PNG != nil:
		return image(res.PNG, res.Artifact), nil, nil
	}
	// Give the page a moment to answer the input before looking.
	select {
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case <-time.After(300 * time.Millisecond):
	}
	shot, err := c.Act(ctx, in.SessionID, sandgate.Action{Action: "screenshot"})
	if err != nil {
		return text(in.Action + " done; the screenshot after it failed: " + toolError(err).Error()), nil, nil
	}
	r := image(shot.PNG, shot.Artifact)
	r.Content = append([]mcp.Content{&mcp.TextContent{Text: in.Action + " done"}}, r.Content...)
	return r, nil, nil
}

func (t *tools) screenshot(ctx context.Context, req *mcp.CallToolRequest, in sessionID) (*mcp.CallToolResult, any, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, nil, err
	}
	res, err := c.Act(ctx, in.SessionID, sandgate.Action{Action: "screenshot"})
	if err != nil {
		return nil, nil, toolError(err)
	}
	return image(res.PNG, res.Artifact), nil, nil
}

func (t *tools) exec(ctx context.Context, req *mcp.CallToolRequest, in execIn) (*mcp.CallToolResult, *execOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, nil, err
	}
	if strings.TrimSpace(in.Command) == "" {
		return nil, nil, fmt.Errorf("invalid_argument: command is empty")
	}
	// Only what the model is shown is kept: the gateway runs this tool
	// for any number of callers at once (found by review: 16 MiB kept
	// per stream cost 86 MiB of heap per call to show 64 KiB).
	res, err := c.RunUpTo(ctx, in.SessionID, sandgate.ExecRequest{
		Cmd: []string{"bash", "-lc", in.Command}, Cwd: in.Cwd, Env: in.Env, TimeoutSeconds: in.TimeoutSeconds,
	}, maxToolOutput+4)
	if err != nil {
		return nil, nil, toolError(err)
	}
	out := &execOut{ExitCode: res.ExitCode, TimedOut: res.TimedOut, Truncated: res.Truncated}
	var cut bool
	out.Stdout, cut = cutText(res.Stdout, maxToolOutput)
	out.Truncated = out.Truncated || cut
	out.Stderr, cut = cutText(res.Stderr, maxToolOutput)
	out.Truncated = out.Truncated || cut
	return nil, out, nil
}

func (t *tools) readFile(ctx context.Context, req *mcp.CallToolRequest, in readIn) (*mcp.CallToolResult, *readOut, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, nil, err
	}
	body, ctype, err := c.GetFile(ctx, in.SessionID, in.Path)
	if err != nil {
		return nil, nil, toolError(err)
	}
	defer body.Close()
	if ctype == "application/x-tar" {
		return nil, nil, fmt.Errorf("invalid_argument: %s is a directory; list it with exec", in.Path)
	}
	b, err := io.ReadAll(io.LimitReader(body, maxReadFile+1))
	if err != nil {
		return nil, nil, err
	}
	if len(b) > maxReadFile {
		return nil, nil, fmt.Errorf("invalid_argument: %s is larger than %d bytes; read parts of it with exec", in.Path, maxReadFile)
	}
	out := &readOut{Path: in.Path, Size: len(b)}
	if utf8.Valid(b) {
		out.Content = string(b)
	} else {
		out.ContentBase64 = base64.StdEncoding.EncodeToString(b)
	}
	return nil, out, nil
}

func (t *tools) writeFile(ctx context.Context, req *mcp.CallToolRequest, in writeIn) (*mcp.CallToolResult, *sandgate.FileInfo, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, nil, err
	}
	data := []byte(in.Content)
	if in.ContentBase64 != "" {
		if in.Content != "" {
			return nil, nil, fmt.Errorf("invalid_argument: give content or content_base64, not both")
		}
		if data, err = base64.StdEncoding.DecodeString(in.ContentBase64); err != nil {
			return nil, nil, fmt.Errorf("invalid_argument: content_base64 is not base64")
		}
	}
	if len(data) > maxWriteFile {
		return nil, nil, fmt.Errorf("invalid_argument: the file is larger than %d bytes", maxWriteFile)
	}
	fi, err := c.PutFile(ctx, in.SessionID, in.Path, strings.NewReader(string(data)))
	if err != nil {
		return nil, nil, toolError(err)
	}
	return nil, fi, nil
}

func (t *tools) preview(ctx context.Context, req *mcp.CallToolRequest, in previewIn) (*mcp.CallToolResult, *sandgate.Preview, error) {
	c, err := t.client(req)
	if err != nil {
		return nil, nil, err
	}
	if in.Scope == "" {
		in.Scope = "view"
	}
	if in.TTLSeconds == 0 {
		in.TTLSeconds = 300
	}
	p, err := c.CreatePreview(ctx, in.SessionID, sandgate.PreviewRequest{Scope: in.Scope, TTLSeconds: in.TTLSeconds, ViewOnly: in.ViewOnly})
	if err != nil {
		return nil, nil, toolError(err)
	}
	return nil, p, nil
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// image is a screenshot result: the PNG, and the artifact it is stored
// as for reviewers.
func image(png []byte, a *sandgate.Artifact) *mcp.CallToolResult {
	r := &mcp.CallToolResult{Content: []mcp.Content{&mcp.ImageContent{Data: png, MIMEType: "image/png"}}}
	if a != nil {
		r.Content = append(r.Content, &mcp.TextContent{Text: "stored as artifact " + a.ID})
	}
	return r
}

// cutText returns b as text, cut at n bytes on a rune boundary.
func cutText(b []byte, n int) (string, bool) {
	if len(b) <= n {
		return strings.ToValidUTF8(string(b), "\uFFFD"), false
	}
	// A rune split at the cut becomes U+FFFD with any other bad bytes.
	return strings.ToValidUTF8(string(b[:n]), "\uFFFD") + "\n[cut]", true
}
