// Command chromedp drives a Sandgate session's Chromium with chromedp,
// unmodified: the session's CDP preview URL is the endpoint.
//
//	SANDGATE_URL=... SANDGATE_API_KEY=... go run ./examples/chromedp https://example.com
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"

	sandgate "github.com/sandgate/sandgate/sdk/go"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

// run does the work; its deferred deletes run even when it fails.
func run() error {
	if len(os.Args) != 2 {
		return errors.New("usage: chromedp URL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := sandgate.FromEnv()
	if err != nil {
		return err
	}
	// The session comes with a CDP preview; chromedp takes its ws_url,
	// the browser's WebSocket endpoint, as it is (NoModifyURL: no
	// discovery request, which chromedp would send to the host's root).
	s, err := c.CreateSession(ctx, sandgate.SessionRequest{Kind: "browser", TTLSeconds: 300,
		Preview: &sandgate.PreviewRequest{Scope: "cdp", TTLSeconds: 300}})
	if err != nil {
		return err
	}
	defer c.DeleteSession(context.WithoutCancel(ctx), s.ID)
	actx, cancelA := remote.NewAllocator(ctx, s.Preview.WSURL, remote.NoModifyURL)
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	if err := chromedp.Do(bctx, chromedp.Navigate(os.Args[1])); err != nil {
		return err
	}
	title, err := chromedp.Run(bctx, chromedp.Title())
	if err != nil {
		return err
	}
	h1, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector("h1")?.textContent ?? ""`))
	if err != nil {
		return err
	}
	fmt.Printf("title: %s\nh1: %s\n", title, h1)
	return nil
}
