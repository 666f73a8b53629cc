package browser

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
)

// Download is a file Chromium finished downloading: saved under its GUID
// in the session's download directory.
type Download struct {
	GUID string
	URL  string
	Name string // the name the site suggested
}

// WatchDownloads holds a browser-level CDP connection of the gateway's own
// to the session's Chromium: it sends downloads to dir (a path inside the
// session), named by their GUID so no name a site suggests can point
// elsewhere, and calls done for each finished one. It reconnects when
// Chromium restarts and returns when ctx ends.
//
// A client that sets its own download behaviour over CDP (Playwright
// does, for its downloads) takes the session's downloads away from it.
func WatchDownloads(ctx context.Context, cdp netip.AddrPort, dir string, done func(Download)) {
	for ctx.Err() == nil {
		watchOnce(ctx, cdp, dir, done)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func watchOnce(ctx context.Context, cdp netip.AddrPort, dir string, done func(Download)) error {
	wsURL, err := browserWSURL(ctx, cdp)
	if err != nil {
		return err
	}
	actx, cancel := remote.NewAllocator(ctx, wsURL)
	defer cancel()
	cctx, cancel2 := chromedp.NewContext(actx)
	defer cancel2()
	var mu sync.Mutex
	begun := map[string]Download{}
	finished := make(chan Download, 64)
	if err := chromedp.ListenBrowser(cctx, func(ev any) {
		switch e := ev.(type) {
		case *cdpbrowser.EventDownloadWillBegin:
			mu.Lock()
			begun[e.GUID] = Download{GUID: e.GUID, URL: e.URL, Name: e.SuggestedFilename}
			mu.Unlock()
		case *cdpbrowser.EventDownloadProgress:
			if e.State != cdpbrowser.DownloadProgressStateCompleted {
				return
			}
			mu.Lock()
			d, ok := begun[e.GUID]
			delete(begun, e.GUID)
			mu.Unlock()
			if ok {
				select {
				case finished <- d:
				default:
				}
			}
		}
	}); err != nil {
		return err
	}
	yes := true
	if _, err := chromedp.CallBrowser(cctx, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
		Behavior: cdpbrowser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: dir, EventsEnabled: &yes,
	}); err != nil {
		return fmt.Errorf("set download behaviour: %w", err)
	}
	// The context ends when the connection to Chromium is lost.
	lost := cctx.Done()
	for {
		select {
		case d := <-finished:
			done(d)
		case <-lost:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

func browserWSURL(ctx context.Context, cdp netip.AddrPort) (string, error) {
	id, err := BrowserID(ctx, cdp)
	if err != nil {
		return "", err
	}
	return "ws://" + cdp.String() + "/devtools/browser/" + id, nil
}
