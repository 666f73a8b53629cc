package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	sandgate "github.com/sandgate/sandgate/sdk/go"
)

// TestMCP: the Go SDK's MCP client drives `sandgate mcp` over stdio and
// the gateway's /mcp over streamable HTTP the same way: list the tools,
// create a desktop session, click and type through computer (the screen
// changes, and what was typed ran), run a command, write and read a
// file, zoom, hand out a preview, delete the session.
func TestMCP(t *testing.T) {
	e := needE2E(t)
	t.Run("stdio", func(t *testing.T) {
		cs := mcpConnect(t, &mcp.CommandTransport{Command: e.mcpCommand(e.keyA)})
		e.mcpDesktopFlow(t, cs)
	})
	t.Run("http", func(t *testing.T) {
		cs := mcpConnect(t, e.mcpHTTP(e.keyA))
		e.mcpDesktopFlow(t, cs)
	})
}

// TestMCPBadKey: a bad API key gets an MCP error and no session, over
// HTTP (the gateway refuses the request: 401) and over stdio (the tool
// call fails with the gateway's unauthenticated); TestMCP is the control
// with a good key.
func TestMCPBadKey(t *testing.T) {
	e := needE2E(t)
	before := e.sessionCount(t, e.keyA)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "sandgate-test", Version: "1"}, nil)
	for _, key := range []string{"not-a-key", ""} {
		if cs, err := client.Connect(ctx, e.mcpHTTP(key), nil); err == nil {
			cs.Close()
			t.Fatalf("/mcp with key %q: connected", key)
		} else if !strings.Contains(err.Error(), "401") && !strings.Contains(strings.ToLower(err.Error()), "unauthorized") {
			t.Fatalf("/mcp with key %q: %v, want a 401", key, err)
		}
	}
	status, body := e.rawPost(t, "/mcp", "Bearer not-a-key", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if status != 401 || !strings.Contains(string(body), `"unauthenticated"`) {
		t.Fatalf("/mcp with a bad key: %d %s", status, body)
	}

	cs := mcpConnect(t, &mcp.CommandTransport{Command: e.mcpCommand("not-a-key")})
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "session_create", Arguments: map[string]any{"kind": "desktop"}})
	if err != nil {
		t.Fatalf("stdio session_create with a bad key: a protocol error %v, want a tool error", err)
	}
	if !res.IsError || !strings.Contains(contentText(res), "unauthenticated") {
		t.Fatalf("stdio session_create with a bad key: %+v", res)
	}
	if after := e.sessionCount(t, e.keyA); after != before {
		t.Fatalf("sessions %d -> %d after calls with a bad key", before, after)
	}
	if strings.Contains(contentText(res), "not-a-key") {
		t.Fatal("the error shows the key")
	}
}

func (e *testEnv) mcpCommand(key string) *exec.Cmd {
	cmd := exec.Command(e.bin, "mcp")
	cmd.Env = append(os.Environ(), "SANDGATE_URL="+e.gwURL, "SANDGATE_API_KEY="+key)
	cmd.Stderr = os.Stderr
	return cmd
}

// bearer adds an API key to each request.
type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.key != "" {
		r.Header.Set("Authorization", "Bearer "+b.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func (e *testEnv) mcpHTTP(key string) *mcp.StreamableClientTransport {
	return &mcp.StreamableClientTransport{
		Endpoint: e.gwURL + "/mcp", MaxRetries: -1, DisableStandaloneSSE: true,
		HTTPClient: &http.Client{Transport: bearer{key}, Timeout: 3 * time.Minute},
	}
}

func mcpConnect(t *testing.T, tr mcp.Transport) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "sandgate-test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("MCP connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// sessionCount counts the tenant's sessions that have not ended.
func (e *testEnv) sessionCount(t *testing.T, key string) int {
	status, body := e.api(t, key, "GET", "/v1/sessions", nil)
	if status != 200 {
		t.Fatalf("list: %d %s", status, body)
	}
	var out struct{ Sessions []struct{ State string } }
	json.Unmarshal(body, &out)
	n := 0
	for _, s := range out.Sessions {
		if s.State == "starting" || s.State == "running" {
			n++
		}
	}
	return n
}

func (e *testEnv) rawPost(t *testing.T, path, auth, body string) (int, []byte) {
	req, _ := http.NewRequest("POST", e.gwURL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, b.Bytes()
}

// callTool calls a tool that must succeed and decodes its structured result
// into out (when not nil).
func callTool(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error: %s", name, contentText(res))
	}
	if out != nil {
		raw, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s: structured content %s: %v", name, raw, err)
		}
	}
	return res
}

func contentText(res *mcp.CallToolResult) string {
	var s []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			s = append(s, tc.Text)
		}
	}
	return strings.Join(s, "\n")
}

// resultImage is the PNG a tool returned.
func resultImage(t *testing.T, res *mcp.CallToolResult) image.Image {
	t.Helper()
	for _, c := range res.Content {
		if ic, ok := c.(*mcp.ImageContent); ok {
			if ic.MIMEType != "image/png" {
				t.Fatalf("image of type %q", ic.MIMEType)
			}
			img, err := png.Decode(bytes.NewReader(ic.Data))
			if err != nil {
				t.Fatalf("the image is no PNG: %v", err)
			}
			return img
		}
	}
	t.Fatalf("no image in %+v", res.Content)
	return nil
}

// changedPixels counts the pixels that differ between two screenshots.
func changedPixels(a, b image.Image) int {
	n := 0
	r := a.Bounds().Intersect(b.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if a.At(x, y) != b.At(x, y) {
				n++
			}
		}
	}
	return n
}

func (e *testEnv) mcpDesktopFlow(t *testing.T, cs *mcp.ClientSession) {
	ctx := context.Background()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*mcp.Tool{}
	for _, tl := range tools.Tools {
		byName[tl.Name] = tl
	}
	for _, name := range []string{"session_create", "session_list", "session_get", "session_extend", "session_delete", "computer", "screenshot", "exec", "read_file", "write_file", "session_snapshot", "preview"} {
		if byName[name] == nil {
			t.Fatalf("no tool %s among %d", name, len(tools.Tools))
		}
	}
	for _, name := range []string{"session_list", "session_get", "screenshot", "read_file"} {
		if a := byName[name].Annotations; a == nil || !a.ReadOnlyHint {
			t.Errorf("%s is not marked read-only", name)
		}
	}
	for _, name := range []string{"session_delete", "write_file", "exec", "computer"} {
		if a := byName[name].Annotations; a == nil || a.ReadOnlyHint || a.DestructiveHint == nil || !*a.DestructiveHint {
			t.Errorf("%s is not marked destructive", name)
		}
	}
	if a := byName["session_create"].Annotations; a == nil || a.DestructiveHint == nil || *a.DestructiveHint {
		t.Error("session_create is marked destructive")
	}

	var s struct{ ID, Kind, State string }
	callTool(t, cs, "session_create", map[string]any{"kind": "desktop", "ttl_seconds": 600, "labels": map[string]string{"test": "mcp"}}, &s)
	t.Cleanup(func() { e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil) })
	if s.Kind != "desktop" || s.State != "running" {
		t.Fatalf("session_create: %+v", s)
	}
	var listed struct{ Sessions []struct{ ID string } }
	callTool(t, cs, "session_list", nil, &listed)
	if !slices.ContainsFunc(listed.Sessions, func(x struct{ ID string }) bool { return x.ID == s.ID }) {
		t.Fatalf("session_list lacks %s", s.ID)
	}

	// The desktop's xterm (at +40+40) and text editor are mapped within
	// moments of the start, longer under gVisor; a click before that, or
	// on the editor's window over the xterm, types into the wrong place.
	var mapped struct {
		ExitCode int `json:"exit_code"`
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		// Both of its windows, then the xterm raised above the editor.
		callTool(t, cs, "exec", map[string]any{"session_id": s.ID, "command": "xdotool search --onlyvisible --class mousepad >/dev/null && xdotool search --onlyvisible --class xterm windowraise"}, &mapped)
		if mapped.ExitCode == 0 || time.Now().After(deadline) {
			break
		}
	}
	if mapped.ExitCode != 0 {
		t.Fatal("the desktop's xterm never showed")
	}
	// Control: the screen settles with no input (the desktop's windows
	// finish drawing), so the change after clicking and typing below is
	// theirs. Two screenshots in a row must agree.
	before := resultImage(t, callTool(t, cs, "screenshot", map[string]any{"session_id": s.ID}, nil))
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		again := resultImage(t, callTool(t, cs, "screenshot", map[string]any{"session_id": s.ID}, nil))
		n := changedPixels(before, again)
		before = again
		if n <= 100 && colours(before) >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the screen never settled (%d pixels changed between the last two screenshots, %d colours)", n, colours(before))
		}
	}

	// Click into the xterm and type a command there.
	res := callTool(t, cs, "computer", map[string]any{"session_id": s.ID, "action": "left_click", "coordinate": []int{200, 150}}, nil)
	resultImage(t, res) // an input action answers with the screen after it
	callTool(t, cs, "computer", map[string]any{"session_id": s.ID, "action": "type", "text": "echo typed-through-mcp > /tmp/mcp-typed"}, nil)
	after := resultImage(t, callTool(t, cs, "computer", map[string]any{"session_id": s.ID, "action": "key", "text": "Return"}, nil))
	if n := changedPixels(before, after); n < 300 {
		t.Fatalf("only %d pixels changed after clicking and typing", n)
	}
	var cur struct{}
	if txt := contentText(callTool(t, cs, "computer", map[string]any{"session_id": s.ID, "action": "cursor_position"}, &cur)); txt != "X=200,Y=150" {
		t.Fatalf("cursor_position: %q", txt)
	}

	// What was typed ran in the session's shell.
	var out struct {
		ExitCode int `json:"exit_code"`
		Stdout   string
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		callTool(t, cs, "exec", map[string]any{"session_id": s.ID, "command": "cat /tmp/mcp-typed 2>/dev/null; true"}, &out)
		if out.Stdout != "" || time.Now().After(deadline) {
			break
		}
	}
	if out.Stdout != "typed-through-mcp\n" || out.ExitCode != 0 {
		f, _ := os.CreateTemp("", "mcp-after-*.png")
		png.Encode(f, after)
		f.Close()
		t.Fatalf("the typed command's file: %+v (the screen after typing: %s)", out, f.Name())
	}
	callTool(t, cs, "exec", map[string]any{"session_id": s.ID, "command": "echo to-stderr >&2; exit 3"}, &out)
	if out.ExitCode != 3 {
		t.Fatalf("exec exit code: %+v", out)
	}
	// A long output is cut to what the model is shown, and says so; the
	// command still ran to its end.
	var long struct {
		ExitCode  int `json:"exit_code"`
		Stdout    string
		Truncated bool
	}
	callTool(t, cs, "exec", map[string]any{"session_id": s.ID, "command": "head -c 3000000 /dev/zero | tr '\\0' a; exit 4"}, &long)
	if long.ExitCode != 4 || !long.Truncated || !strings.HasSuffix(long.Stdout, "[cut]") || len(long.Stdout) > 64<<10+16 || !strings.HasPrefix(long.Stdout, "aaaa") {
		t.Fatalf("a 3 MB output through exec: exit %d, truncated %v, %d bytes", long.ExitCode, long.Truncated, len(long.Stdout))
	}

	callTool(t, cs, "write_file", map[string]any{"session_id": s.ID, "path": "/tmp/mcp-file.txt", "content": "written through MCP\n"}, nil)
	var file struct{ Content string }
	callTool(t, cs, "read_file", map[string]any{"session_id": s.ID, "path": "/tmp/mcp-file.txt"}, &file)
	if file.Content != "written through MCP\n" {
		t.Fatalf("read_file: %q", file.Content)
	}

	zoom := resultImage(t, callTool(t, cs, "computer", map[string]any{"session_id": s.ID, "action": "zoom", "region": []int{40, 40, 440, 240}}, nil))
	if b := zoom.Bounds(); b.Dx() != 400 || b.Dy() != 200 {
		t.Fatalf("zoom image %v, want 400x200", b)
	}
	// It is that part of the screen, pixel for pixel.
	full := resultImage(t, callTool(t, cs, "screenshot", map[string]any{"session_id": s.ID}, nil))
	diff := 0
	for y := 0; y < 200; y++ {
		for x := 0; x < 400; x++ {
			if zoom.At(x, y) != full.At(40+x, 40+y) {
				diff++
			}
		}
	}
	if diff > 100 {
		t.Fatalf("the zoom differs from the screen's region in %d pixels", diff)
	}

	var p struct{ URL, Scope string }
	callTool(t, cs, "preview", map[string]any{"session_id": s.ID, "view_only": true}, &p)
	if p.Scope != "view" || !strings.HasPrefix(p.URL, e.gwURL+"/view/") {
		t.Fatalf("preview: %+v", p)
	}
	e.mu.Lock()
	e.tokens = append(e.tokens, strings.TrimPrefix(p.URL, e.gwURL+"/view/"))
	e.mu.Unlock()
	if resp, err := http.Get(p.URL); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the preview link: %v %v", resp, err)
	}

	// A snapshot of its files, and a session that starts from it.
	callTool(t, cs, "exec", map[string]any{"session_id": s.ID, "command": "echo from-mcp > ~/workspace/mcp.txt"}, nil)
	var snap struct {
		ID            string `json:"id"`
		ProcessesKept bool   `json:"processes_kept"`
	}
	callTool(t, cs, "session_snapshot", map[string]any{"session_id": s.ID}, &snap)
	if snap.ID == "" || snap.ProcessesKept {
		t.Fatalf("session_snapshot: %+v", snap)
	}
	var s2 struct{ ID string }
	callTool(t, cs, "session_create", map[string]any{"kind": "browser", "runtime": "runc", "snapshot": snap.ID, "labels": map[string]string{"test": "mcp"}}, &s2)
	t.Cleanup(func() { e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s2.ID, nil) })
	var rf struct{ Content string }
	callTool(t, cs, "read_file", map[string]any{"session_id": s2.ID, "path": "/home/sandgate/workspace/mcp.txt"}, &rf)
	if rf.Content != "from-mcp\n" {
		t.Fatalf("the session from the snapshot reads %q", rf.Content)
	}

	// An unknown session is a tool error the model can read.
	ctx2, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	bad, err := cs.CallTool(ctx2, &mcp.CallToolParams{Name: "session_get", Arguments: map[string]any{"session_id": "sg-0000000000000000000000"}})
	if err != nil || !bad.IsError || !strings.Contains(contentText(bad), "not_found") {
		t.Fatalf("session_get of an unknown id: %+v %v", bad, err)
	}

	var ended struct{ State string }
	callTool(t, cs, "session_delete", map[string]any{"session_id": s.ID}, &ended)
	if ended.State != "stopped" {
		t.Fatalf("session_delete: %+v", ended)
	}
}

// TestMCPHangUp: a session_create over /mcp whose client hangs up while
// the session starts is rolled back, as a create through the API whose
// client hangs up is: the MCP server's call ends with its client, and
// the create with it. TestMCP's creates, whose clients wait, are the
// control.
func TestMCPHangUp(t *testing.T) {
	e := needE2E(t)
	label := map[string]string{"test": t.Name() + "-" + randHex(4)}
	mine := func() []sandgate.Session {
		t.Helper()
		st, body := e.api(t, e.keyA, "GET", "/v1/sessions", nil)
		var out struct{ Sessions []sandgate.Session }
		if err := json.Unmarshal(body, &out); st != 200 || err != nil {
			t.Fatalf("list: %d %s", st, body)
		}
		var got []sandgate.Session
		for _, s := range out.Sessions {
			if s.Labels["test"] == label["test"] {
				got = append(got, s)
			}
		}
		return got
	}
	c, err := net.DialTimeout("tcp", e.gwAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Whatever this test leaves (it failed) is deleted.
	t.Cleanup(func() {
		for _, s := range mine() {
			e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil)
		}
	})
	// A screen no warm pool keeps, under gVisor: a cold start, which
	// takes seconds.
	call, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{
		"name": "session_create", "arguments": map[string]any{"kind": "browser", "runtime": "gvisor", "screen_width": 1000, "screen_height": 700, "labels": label}}})
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s",
		e.gwAddr, e.keyA, len(call), call)
	var ss []sandgate.Session
	for deadline := time.Now().Add(60 * time.Second); len(ss) == 0; ss = mine() {
		if time.Now().After(deadline) {
			t.Fatal("the session the MCP call creates did not appear within 60 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ss[0].State != "starting" {
		t.Fatalf("the session was %s when first seen, not starting: the test shows nothing", ss[0].State)
	}
	c.Close()
	id := ss[0].ID
	for deadline := time.Now().Add(90 * time.Second); ; {
		st, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+id, nil)
		var s sandgate.Session
		json.Unmarshal(body, &s)
		if st == 404 || s.State == "failed" || s.State == "stopped" {
			t.Logf("the session of an MCP create whose client hung up: %d %s (%s)", st, s.State, s.Failure)
			break
		}
		if s.State == "running" {
			t.Fatalf("the session of an MCP create whose client hung up runs: %s", body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session of an MCP create whose client hung up is still %s after 90 s", s.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
