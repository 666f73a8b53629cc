package test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
)

// TestEveryUsableRuntime drives Chromium through the gateway under each
// runtime handler the gateway found usable; the others are reported with
// the gateway's reason (Kata is not installable on the CI machines).
func TestEveryUsableRuntime(t *testing.T) {
	e := needE2E(t)
	status, body := e.api(t, e.keyA, "GET", "/v1/runtimes", nil)
	if status != 200 {
		t.Fatalf("runtimes: %d %s", status, body)
	}
	var rts struct {
		Runtimes []struct {
			Name, Isolation, Reason string
			Usable                  bool
		}
	}
	if err := json.Unmarshal(body, &rts); err != nil || len(rts.Runtimes) != 3 {
		t.Fatalf("runtimes: %s", body)
	}
	pages := ""
	for _, rt := range rts.Runtimes {
		t.Run(rt.Name, func(t *testing.T) {
			if !rt.Usable {
				t.Skipf("%s (%s isolation) was not tested: not usable on this host: %s", rt.Name, rt.Isolation, rt.Reason)
			}
			s := e.createSession(t, e.keyA, map[string]any{"runtime": rt.Name})
			if pages == "" {
				pages = testPages(t)
			}
			p := e.preview(t, e.keyA, s.ID, 120)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			actx, cancelA := remote.NewAllocator(ctx, browserWS(t, p.URL))
			defer cancelA()
			cctx, cancelC := chromedp.NewContext(actx)
			defer cancelC()
			if err := chromedp.Do(cctx, chromedp.Navigate(pages+"/hello.html")); err != nil {
				t.Fatalf("navigate under %s: %v", rt.Name, err)
			}
			if title, err := chromedp.Run(cctx, chromedp.Title()); err != nil || title != "Sandgate test page" {
				t.Fatalf("title under %s: %q %v", rt.Name, title, err)
			}
		})
	}
}
