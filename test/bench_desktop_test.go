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

	directC, err := desktop.Dial(b.Context(), direct, 3840, 2160)
	if err != nil {
		b.Fatal(err)
	}
	defer directC.Close()
	gwC, conn := rfbThroughGateway(b, p)
	defer conn.Close()
	frame := func(rc *desktop.Client) (time.Duration, int) {
		t0 := time.Now()
		if err := rc.RequestUpdate(false); err != nil {
			b.Fatal(err)
		}
		covered, total := image.Rectangle{}, 0
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
		return time.Since(t0), total
	}
	for i := 0; i < 5; i++ {
		frame(directC)
		frame(gwC)
	}
	// Interleaved full-screen frames on both paths.
	var dT, gT []time.Duration
	var dB, gB int
	var dSum, gSum time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, n := frame(directC)
		dT, dB, dSum = append(dT, d), dB+n, dSum+d
		g, m := frame(gwC)
		gT, gB, gSum = append(gT, g), gB+m, gSum+g
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	b.ReportMetric(ms(percentile(dT, 0.5)), "direct-p50-ms/frame")
	b.ReportMetric(ms(percentile(gT, 0.5)), "gateway-p50-ms/frame")
	b.ReportMetric(float64(dB)/dSum.Seconds()/1e6, "direct-MB/s")
	b.ReportMetric(float64(gB)/gSum.Seconds()/1e6, "gateway-MB/s")
	b.ReportMetric(float64(percentile(gT, 0.5))/float64(percentile(dT, 0.5)), "latency-gateway/direct")
	b.ReportMetric((float64(gB)/gSum.Seconds())/(float64(dB)/dSum.Seconds()), "throughput-gateway/direct")
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
	rc, err := desktop.Dial(b.Context(), labels["sandgate.addr"]+":5900", 3840, 2160)
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
