// Package browser owns everything Chromium inside a session from the
// gateway's side: CDP endpoint discovery and the rewriting of its
// addresses, the CDP commands of clients that the gateway rewrites
// (download behaviour), screenshots, credential fill and the download
// watcher. Everything read from Chromium is bounded and checked: the
// browser runs inside the session.
package browser

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"time"

	cdpc "github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/gorilla/websocket"
)

// DiscoveryPaths are the CDP HTTP endpoints the gateway serves.
var DiscoveryPaths = map[string]bool{"json/version": true, "json": true, "json/list": true, "json/protocol": true}

// UpstreamHost is the Host header the gateway sends to Chromium. Chromium
// only answers Host headers that are IPs or localhost, and it writes this
// authority into every webSocketDebuggerUrl, which makes them easy to find.
const UpstreamHost = "localhost:9222"

// Bounds on what the gateway reads from a session's discovery endpoints.
// Chromium's own documents are far smaller: /json/version is under 1 KiB,
// /json/protocol about 1 MiB, a target about 1 KiB.
const (
	maxDiscoveryBytes = 1 << 20
	maxProtocolBytes  = 8 << 20
	maxTargets        = 1000
)

// ErrDiscovery is the class of every discovery document the gateway
// refuses: too large, not JSON, or an address outside the session.
var ErrDiscovery = errors.New("cdp discovery: the session's browser sent a document the gateway refuses")

// targetID is what a browser or target id must look like. Chromium's are
// 32 hex digits or a UUID.
var targetID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

var httpClient = &http.Client{Timeout: 10 * time.Second}

// get fetches a discovery path from the session's Chromium, reading at
// most limit bytes; a longer answer is refused, not cut.
func get(ctx context.Context, cdp netip.AddrPort, path string, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+cdp.String()+"/"+path, nil)
	if err != nil {
		return nil, err
	}
	req.Host = UpstreamHost
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cdp discovery: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("cdp discovery: chromium answered %s", resp.Status)
	}
	if resp.ContentLength > limit {
		return nil, fmt.Errorf("%w: %s announces %d bytes, the limit is %d", ErrDiscovery, path, resp.ContentLength, limit)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("cdp discovery: %w", err)
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("%w: %s is over %d bytes", ErrDiscovery, path, limit)
	}
	return body, nil
}

// Discover fetches a CDP discovery document from the session's Chromium,
// checks it, and points its WebSocket URLs at prefix (e.g.
// "ws://gw.example/cdp/TOKEN"). The document is rebuilt from its known
// fields: every address in it is one the gateway made, for an id that
// Chromium gave with its own authority (localhost:9222), so nothing inside
// the session can point a client somewhere else.
func Discover(ctx context.Context, cdp netip.AddrPort, path, prefix string) ([]byte, error) {
	if !DiscoveryPaths[path] {
		return nil, fmt.Errorf("not a discovery path: %q", path)
	}
	if path == "json/protocol" {
		body, err := get(ctx, cdp, path, maxProtocolBytes)
		if err != nil {
			return nil, err
		}
		if !json.Valid(body) {
			return nil, fmt.Errorf("%w: json/protocol is not JSON", ErrDiscovery)
		}
		return body, nil
	}
	body, err := get(ctx, cdp, path, maxDiscoveryBytes)
	if err != nil {
		return nil, err
	}
	if path == "json/version" {
		return rewriteVersion(body, prefix)
	}
	return rewriteTargets(body, prefix)
}

// doc is a discovery object: /json/version, or one target of /json/list.
// Its members are kept as Chromium sent them but for the addresses, which
// the gateway makes, and members the gateway does not know that could
// carry an address (see keep).
type doc map[string]json.RawMessage

func (d doc) str(k string) string {
	var s string
	json.Unmarshal(d[k], &s)
	return s
}

func (d doc) set(k, v string) {
	raw, _ := json.Marshal(v)
	d[k] = raw
}

// Members of discovery documents that the gateway reads or writes.
const (
	wsKey       = "webSocketDebuggerUrl"
	frontendKey = "devtoolsFrontendUrl"
)

// known are the members Chromium sends that pass as they are: metadata,
// and the page's own title, URL and icon.
var known = map[string]bool{
	"Browser": true, "Protocol-Version": true, "User-Agent": true, "V8-Version": true, "WebKit-Version": true,
	"description": true, "faviconUrl": true, "id": true, "parentId": true, "title": true, "type": true, "url": true,
}

// keep drops the members of d that the gateway neither knows nor can tell
// carry no address: an unknown member passes only if it is not named like
// an address member and holds no ':' or '/'.
func (d doc) keep() {
	for k, raw := range d {
		if known[k] || k == wsKey || k == frontendKey {
			continue
		}
		if strings.EqualFold(k, wsKey) || strings.EqualFold(k, frontendKey) || bytes.ContainsAny(raw, ":/\\") {
			delete(d, k)
		}
	}
}

// ownWS checks that a WebSocket URL from Chromium is its own address for
// kind ("browser" or "page") and returns the id in it.
func ownWS(ws, kind string) (string, error) {
	id, ok := strings.CutPrefix(ws, "ws://"+UpstreamHost+"/devtools/"+kind+"/")
	if !ok || !targetID.MatchString(id) {
		return "", fmt.Errorf("%w: webSocketDebuggerUrl %.100q is not the session's own %s address", ErrDiscovery, ws, kind)
	}
	return id, nil
}

func parseVersion(body []byte) (doc, string, error) {
	var v doc
	if err := json.Unmarshal(body, &v); err != nil || v == nil {
		return nil, "", fmt.Errorf("%w: json/version is not a JSON object", ErrDiscovery)
	}
	id, err := ownWS(v.str(wsKey), "browser")
	return v, id, err
}

// rewriteVersion checks /json/version and points its WebSocket URL at
// prefix.
func rewriteVersion(body []byte, prefix string) ([]byte, error) {
	v, id, err := parseVersion(body)
	if err != nil {
		return nil, err
	}
	v.keep()
	delete(v, frontendKey)
	v.set(wsKey, prefix+"/devtools/browser/"+id)
	return encode(v)
}

func parseTargets(body []byte) ([]doc, error) {
	var ts []doc
	if err := json.Unmarshal(body, &ts); err != nil {
		return nil, fmt.Errorf("%w: the target list is not a JSON array of objects", ErrDiscovery)
	}
	if len(ts) > maxTargets {
		return nil, fmt.Errorf("%w: %d targets, the limit is %d", ErrDiscovery, len(ts), maxTargets)
	}
	for i, t := range ts {
		if t == nil {
			return nil, fmt.Errorf("%w: target %d is not an object", ErrDiscovery, i)
		}
		id := t.str("id")
		if !targetID.MatchString(id) {
			return nil, fmt.Errorf("%w: target id %.100q", ErrDiscovery, id)
		}
		if _, ok := t[wsKey]; !ok {
			continue
		}
		if wsID, err := ownWS(t.str(wsKey), "page"); err != nil {
			return nil, err
		} else if wsID != id {
			return nil, fmt.Errorf("%w: target %s has the address of %s", ErrDiscovery, id, wsID)
		}
	}
	return ts, nil
}

// rewriteTargets checks /json/list and points its addresses at prefix:
// webSocketDebuggerUrl, and the ws= parameter of a devtoolsFrontendUrl
// that is Chromium's own (a path on the browser, or the hosted DevTools
// frontend); any other frontend URL is dropped, so a session cannot send
// the gateway's address, and the token in it, elsewhere.
func rewriteTargets(body []byte, prefix string) ([]byte, error) {
	ts, err := parseTargets(body)
	if err != nil {
		return nil, err
	}
	_, hostPath, _ := strings.Cut(prefix, "://")
	for _, t := range ts {
		id := t.str("id")
		t.keep()
		if _, ok := t[wsKey]; ok {
			t.set(wsKey, prefix+"/devtools/page/"+id)
		}
		if _, ok := t[frontendKey]; ok {
			if u := frontendURL(t.str(frontendKey), id, hostPath); u != "" {
				t.set(frontendKey, u)
			} else {
				delete(t, frontendKey)
			}
		}
	}
	if ts == nil {
		ts = []doc{}
	}
	return encode(ts)
}

const hostedFrontend = "https://chrome-devtools-frontend.appspot.com/"

func frontendURL(u, id, hostPath string) string {
	if !strings.HasPrefix(u, "/devtools/") && !strings.HasPrefix(u, hostedFrontend) {
		return ""
	}
	p, err := url.Parse(u)
	if err != nil || p.Query().Get("ws") != UpstreamHost+"/devtools/page/"+id || len(p.Query()) != 1 || p.Fragment != "" {
		return ""
	}
	p.RawQuery = "ws=" + hostPath + "/devtools/page/" + id
	return p.String()
}

// encode writes a document as Chromium does: indented by three spaces.
func encode(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "   ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Target is one entry of /json/list.
type Target struct {
	ID   string
	Type string
	URL  string
}

// Targets lists the session's CDP targets.
func Targets(ctx context.Context, cdp netip.AddrPort) ([]Target, error) {
	body, err := get(ctx, cdp, "json/list", maxDiscoveryBytes)
	if err != nil {
		return nil, err
	}
	docs, err := parseTargets(body)
	if err != nil {
		return nil, err
	}
	ts := make([]Target, len(docs))
	for i, d := range docs {
		ts[i] = Target{ID: d.str("id"), Type: d.str("type"), URL: d.str("url")}
	}
	return ts, nil
}

// BrowserID returns the id of the session's browser target.
func BrowserID(ctx context.Context, cdp netip.AddrPort) (string, error) {
	body, err := Version(ctx, cdp)
	if err != nil {
		return "", err
	}
	return VersionID(body)
}

// Version fetches the session's /json/version as Chromium sent it
// (bounded, unchecked): for VersionID and RewriteVersion, which check it.
func Version(ctx context.Context, cdp netip.AddrPort) ([]byte, error) {
	return get(ctx, cdp, "json/version", maxDiscoveryBytes)
}

// VersionID checks a /json/version document and returns the browser
// target's id in it.
func VersionID(body []byte) (string, error) {
	_, id, err := parseVersion(body)
	return id, err
}

// RewriteVersion checks a /json/version document and points its
// WebSocket URL at prefix, as Discover does.
func RewriteVersion(body []byte, prefix string) ([]byte, error) {
	return rewriteVersion(body, prefix)
}

// browserWSURL is the session's browser-level WebSocket address, for the
// gateway's own CDP connections: built from a checked id, so chromedp
// never reads a discovery document itself.
func browserWSURL(ctx context.Context, cdp netip.AddrPort) (string, error) {
	id, err := BrowserID(ctx, cdp)
	if err != nil {
		return "", err
	}
	return "ws://" + cdp.String() + "/devtools/browser/" + id, nil
}

// Screenshot captures the session's first page as a PNG of width x height
// pixels.
func Screenshot(ctx context.Context, cdp netip.AddrPort, width, height int) ([]byte, error) {
	ts, err := Targets(ctx, cdp)
	if err != nil {
		return nil, err
	}
	var pageID string
	for _, t := range ts {
		if t.Type == "page" {
			pageID = t.ID
			break
		}
	}
	if pageID == "" {
		return nil, errors.New("screenshot: the browser has no page open")
	}
	actx, cancel, err := allocator(ctx, cdp, maxOwnMessage)
	if err != nil {
		return nil, err
	}
	defer cancel()
	// Detach on cancel: closing the agent's page would close its browser.
	cctx, cancel2 := chromedp.NewContext(actx, chromedp.WithTargetID(target.ID(pageID)), chromedp.WithDetachOnCancel())
	defer cancel2()
	t, f := true, true
	png, err := chromedp.Run(cctx, chromedp.Action[[]byte](func(ctx context.Context, tg *chromedp.Target) ([]byte, error) {
		r, err := cdpc.Call(ctx, tg, page.CaptureScreenshot, page.CaptureScreenshotParams{
			Format:                page.CaptureScreenshotFormatPng,
			Clip:                  &page.Viewport{X: 0, Y: 0, Width: float64(width), Height: float64(height), Scale: 1},
			CaptureBeyondViewport: &t,
			FromSurface:           &f,
		})
		if err != nil {
			return nil, err
		}
		return r.Data, nil
	}))
	if err != nil {
		return nil, fmt.Errorf("screenshot: %w", err)
	}
	return png, nil
}

// Fill types text into the first element matching a CSS selector on the
// browser's first page, from the gateway's own CDP connection: the text
// goes through Input.insertText, so it never passes through the agent's
// CDP connection, requests or responses. Whatever was in the field is
// replaced.
func Fill(ctx context.Context, cdp netip.AddrPort, selector, text string) error {
	pageID, err := firstPage(ctx, cdp)
	if err != nil {
		return err
	}
	actx, cancel, err := allocator(ctx, cdp, maxOwnMessage)
	if err != nil {
		return err
	}
	defer cancel()
	cctx, cancel2 := chromedp.NewContext(actx, chromedp.WithTargetID(target.ID(pageID)), chromedp.WithDetachOnCancel())
	defer cancel2()
	err = chromedp.Do(cctx,
		chromedp.WaitVisible(chromedp.CSS(selector)),
		chromedp.Focus(chromedp.CSS(selector)),
		// Select what the field holds, so the text replaces it.
		chromedp.Action[chromedp.Void](func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
			_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const e = document.activeElement; if (e && e.select) { e.select(); return true } return false })()`))
			return chromedp.Void{}, err
		}),
		chromedp.Action[chromedp.Void](func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
			_, err := cdpc.Call(ctx, t, input.InsertText, input.InsertTextParams{Text: text})
			return chromedp.Void{}, err
		}),
	)
	if err != nil {
		// chromedp's errors name the selector, never the text.
		return fmt.Errorf("fill %s: %w", selector, err)
	}
	return nil
}

func firstPage(ctx context.Context, cdp netip.AddrPort) (string, error) {
	ts, err := Targets(ctx, cdp)
	if err != nil {
		return "", err
	}
	for _, t := range ts {
		if t.Type == "page" {
			return t.ID, nil
		}
	}
	return "", errors.New("the browser has no page open")
}

// maxCloseReply bounds what Close reads back from the browser.
const maxCloseReply = 1 << 20

// Close asks the session's browser to close cleanly (CDP Browser.close),
// as a person closing its last window would: it writes its state (the
// cookie store among it) before it exits. A SIGTERM does not do that
// under every runtime. Close returns once the browser answered or hung
// up, or ctx ended.
func Close(ctx context.Context, cdp netip.AddrPort) error {
	ws, err := browserWSURL(ctx, cdp)
	if err != nil {
		return err
	}
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	c, resp, err := d.DialContext(ctx, ws, nil)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		return fmt.Errorf("close the browser: %w", err)
	}
	defer c.Close()
	c.SetReadLimit(maxCloseReply)
	if dl, ok := ctx.Deadline(); ok {
		c.SetReadDeadline(dl)
		c.SetWriteDeadline(dl)
	}
	if err := c.WriteMessage(websocket.TextMessage, []byte(`{"id":1,"method":"Browser.close"}`)); err != nil {
		return fmt.Errorf("close the browser: %w", err)
	}
	for {
		_, msg, err := c.ReadMessage()
		if err != nil {
			// The browser hangs up as it exits: that is a close too.
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return nil
		}
		var r struct {
			ID int `json:"id"`
		}
		if json.Unmarshal(msg, &r) == nil && r.ID == 1 {
			return nil
		}
	}
}
