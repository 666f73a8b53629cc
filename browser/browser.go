// Package browser owns everything Chromium inside a session from the
// gateway's side: CDP endpoint discovery and the rewriting of its
// addresses, and screenshots through CDP.
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
	"time"

	cdpc "github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
)

// DiscoveryPaths are the CDP HTTP endpoints the gateway serves.
var DiscoveryPaths = map[string]bool{"json/version": true, "json": true, "json/list": true, "json/protocol": true}

// upstreamHost is the Host header the gateway sends to Chromium. Chromium
// only answers Host headers that are IPs or localhost, and it writes this
// authority into every webSocketDebuggerUrl, which makes them easy to find.
const upstreamHost = "localhost:9222"

var httpClient = &http.Client{Timeout: 10 * time.Second}

// Discover fetches a CDP discovery document from the session's Chromium and
// points its WebSocket URLs at prefix (e.g. "ws://gw.example/cdp/TOKEN").
func Discover(ctx context.Context, cdp netip.AddrPort, path, prefix string) ([]byte, error) {
	if !DiscoveryPaths[path] {
		return nil, fmt.Errorf("not a discovery path: %q", path)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+cdp.String()+"/"+path, nil)
	if err != nil {
		return nil, err
	}
	req.Host = upstreamHost
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cdp discovery: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return nil, fmt.Errorf("cdp discovery: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("cdp discovery: chromium answered %s", resp.Status)
	}
	if path == "json/protocol" {
		return body, nil
	}
	return rewrite(body, prefix)
}

// rewrite replaces Chromium's own WebSocket addresses in a discovery
// document with the gateway's, in webSocketDebuggerUrl and in the ws=
// parameter of devtoolsFrontendUrl.
func rewrite(body []byte, prefix string) ([]byte, error) {
	if !json.Valid(body) {
		return nil, errors.New("cdp discovery: chromium sent invalid JSON")
	}
	wsPrefix := prefix // ws://host/cdp/TOKEN
	_, hostPath, _ := bytes.Cut([]byte(prefix), []byte("://"))
	body = bytes.ReplaceAll(body, []byte("ws://"+upstreamHost), []byte(wsPrefix))
	body = bytes.ReplaceAll(body, []byte("ws="+upstreamHost), append([]byte("ws="), hostPath...))
	return body, nil
}

// Target is one entry of /json/list.
type Target struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	URL  string `json:"url"`
}

// Targets lists the session's CDP targets.
func Targets(ctx context.Context, cdp netip.AddrPort) ([]Target, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+cdp.String()+"/json/list", nil)
	if err != nil {
		return nil, err
	}
	req.Host = upstreamHost
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cdp targets: %w", err)
	}
	defer resp.Body.Close()
	var ts []Target
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&ts); err != nil {
		return nil, fmt.Errorf("cdp targets: %w", err)
	}
	return ts, nil
}

// BrowserID returns the id of the session's browser target.
func BrowserID(ctx context.Context, cdp netip.AddrPort) (string, error) {
	body, err := Discover(ctx, cdp, "json/version", "ws://x")
	if err != nil {
		return "", err
	}
	var v struct {
		WS string `json:"webSocketDebuggerUrl"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return "", err
	}
	const marker = "/devtools/browser/"
	i := bytes.Index([]byte(v.WS), []byte(marker))
	if i < 0 {
		return "", errors.New("cdp: no browser id")
	}
	return v.WS[i+len(marker):], nil
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
	actx, cancel := remote.NewAllocator(ctx, "http://"+cdp.String())
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
	actx, cancel := remote.NewAllocator(ctx, "http://"+cdp.String())
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
