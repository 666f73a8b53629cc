package test

import (
	"image"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sandgate/sandgate/desktop"
)

// BenchmarkVNC: full-screen framebuffer updates (raw encoding, 1280x800)
// through the gateway's /vnc WebSocket and directly from the session's VNC
// server: frame latency and throughput, side by side.
func BenchmarkVNC(b *testing.B) {
	e := needE2E(b)
	s := e.createSession(b, e.keyA, map[string]any{"kind": "desktop"})
	c, err := e.client.LoadContainer(e.ctx(), s.ID)
	if err != nil {
		b.Fatal(err)
	}
	labels, _ := c.Labels(e.ctx())
	direct := labels["sandgate.addr"] + ":5900"
	p := e.vncPreview(b, e.keyA, s.ID, "vnc", true, 600)

	results := map[string]time.Duration{}
	bytesPer := map[string]float64{}
	for _, mode := range []string{"direct", "gateway"} {
		b.Run(mode, func(b *testing.B) {
			var rc *desktop.Client
			if mode == "direct" {
				rc, err = desktop.Dial(b.Context(), direct)
				if err != nil {
					b.Fatal(err)
				}
			} else {
				var conn interface{ Close() error }
				rc, conn = rfbThroughGateway(b, p)
				defer conn.Close()
			}
			defer rc.Close()
			if _, err := rc.Capture(); err != nil { // warm up
				b.Fatal(err)
			}
			total := 0
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := rc.RequestUpdate(false); err != nil {
					b.Fatal(err)
				}
				covered := image.Rectangle{}
				for covered != image.Rect(0, 0, rc.Width, rc.Height) {
					rects, n, err := rc.ReadUpdate()
					if err != nil {
						b.Fatal(err)
					}
					total += n
					for _, r := range rects {
						covered = covered.Union(r)
					}
				}
			}
			per := b.Elapsed() / time.Duration(b.N)
			results[mode] = per
			bytesPer[mode] = float64(total) / b.Elapsed().Seconds() / 1e6
			b.ReportMetric(float64(per)/1e6, "ms/frame")
			b.ReportMetric(bytesPer[mode], "MB/s")
		})
	}
	if results["direct"] > 0 && results["gateway"] > 0 {
		b.ReportMetric(float64(results["gateway"])/float64(results["direct"]), "latency-gateway/direct")
		b.ReportMetric(bytesPer["gateway"]/bytesPer["direct"], "throughput-gateway/direct")
	}
}

// BenchmarkActionRoundTrip: a click through the actions API until the
// screen shows its effect (the page changes colour on mousedown), read by
// an RFB client watching the session's screen.
func BenchmarkActionRoundTrip(b *testing.B) {
	e := needE2E(b)
	s := e.createSession(b, e.keyA, nil)
	pages := testPages(b)
	ctx, done := e.cdpPage(b, s.ID)
	defer done()
	if err := chromedp.Do(ctx, chromedp.Navigate(pages+"/toggle.html")); err != nil {
		b.Fatal(err)
	}
	c, err := e.client.LoadContainer(e.ctx(), s.ID)
	if err != nil {
		b.Fatal(err)
	}
	labels, _ := c.Labels(e.ctx())
	rc, err := desktop.Dial(b.Context(), labels["sandgate.addr"]+":5900")
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	const px, py = 640, 500 // inside the page
	sample := func(img *image.RGBA) [3]byte {
		o := img.PixOffset(px, py)
		return [3]byte{img.Pix[o], img.Pix[o+1], img.Pix[o+2]}
	}
	img, err := rc.Capture()
	if err != nil {
		b.Fatal(err)
	}
	last := sample(img)
	var took []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		status, body := e.action(b, e.keyA, s.ID, map[string]any{"action": "left_click", "coordinate": []int{px, py}})
		if status != 200 {
			b.Fatalf("click: %d %s", status, body)
		}
		for {
			img, err := rc.Capture()
			if err != nil {
				b.Fatal(err)
			}
			if now := sample(img); now != last {
				last = now
				break
			}
			if time.Since(t0) > 10*time.Second {
				b.Fatalf("the click did not change the screen (pixel %v)", last)
			}
		}
		took = append(took, time.Since(t0))
		time.Sleep(100 * time.Millisecond) // no double clicks
	}
	b.StopTimer()
	b.ReportMetric(float64(percentile(took, 0.5))/1e6, "p50-ms")
	b.ReportMetric(float64(percentile(took, 0.95))/1e6, "p95-ms")
}
