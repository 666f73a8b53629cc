package test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sandgate/sandgate/recordings"
)

// benchStore is the artifact store on the suite's MinIO, in a bucket
// of the benchmarks' own.
func (e *testEnv) benchStore(b *testing.B) *recordings.Store {
	b.Helper()
	store, err := recordings.New(context.Background(), recordings.Config{Endpoint: e.minioAddr, AccessKey: "sandgate", SecretKey: "sandgate-test-secret", Bucket: "sandgate-bench"})
	if err != nil {
		b.Fatal(err)
	}
	return store
}

func cpuTime(who int) time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(who, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRecording: what one recording at 1280x800 costs, for a still
// screen and a busy one (the whole screen repainted all the time): CPU
// cores (the recorder's VNC client plus ffmpeg) and bytes per minute;
// then how many busy recordings this machine keeps at once before frames
// come late. The recorder is the gateway's own (recordings.Recorder),
// writing to the test's MinIO.
func BenchmarkRecording(b *testing.B) {
	e := needE2E(b)
	ctx := context.Background()
	store := e.benchStore(b)
	rec, err := recordings.NewRecorder(recordings.RecorderConfig{Dir: b.TempDir()}, store)
	if err != nil {
		b.Fatal(err)
	}
	s := e.createSession(b, e.keyA, map[string]any{"resources": map[string]any{"cpus": 1}})
	c, err := e.client.LoadContainer(e.ctx(), s.ID)
	if err != nil {
		b.Fatal(err)
	}
	labels, _ := c.Labels(e.ctx())
	vnc := labels["sandgate.addr"] + ":5900"
	show := func(page string) {
		cctx, done := e.cdpPage(b, s.ID)
		defer done()
		if err := chromedp.Do(cctx, chromedp.Navigate(testPages(b)+page)); err != nil {
			b.Fatal(err)
		}
	}
	fake := func() string { return "s-" + randHex(8) }
	const span = 20 * time.Second
	for i := 0; i < b.N; i++ {
		for _, screen := range []struct{ name, page string }{{"still", "/hello.html"}, {"busy", "/busy.html"}} {
			show(screen.page)
			id := fake()
			self, kids, t0 := cpuTime(syscall.RUSAGE_SELF), cpuTime(syscall.RUSAGE_CHILDREN), time.Now()
			rec.Start(recordings.Target{Tenant: "bench", Session: id, VNC: vnc, Width: 1280, Height: 800})
			time.Sleep(span)
			m, err := rec.Finish(ctx, "bench", id, time.Now())
			if err != nil || m == nil {
				b.Fatalf("finish: %v", err)
			}
			wall := time.Since(t0)
			cores := float64(cpuTime(syscall.RUSAGE_SELF)-self+cpuTime(syscall.RUSAGE_CHILDREN)-kids) / float64(wall)
			b.ReportMetric(cores, screen.name+"-cpu-cores")
			b.ReportMetric(float64(m.Size)/m.Duration*60/(1<<20), screen.name+"-MiB-per-min")
		}
		// Concurrent busy recordings until frames come late: the writer
		// keeps the video's clock on the wall clock, so frames it could
		// not write in time are missing from the recording's duration
		// (more than 2% short of the time watched).
		maxOK := 0
		for _, n := range []int{1, 2, 4, 6, 8, 12} {
			ids := make([]string, n)
			t0 := time.Now()
			for j := range ids {
				ids[j] = fake()
				rec.Start(recordings.Target{Tenant: "bench", Session: ids[j], VNC: vnc, Width: 1280, Height: 800})
			}
			time.Sleep(15 * time.Second)
			watched, recorded := 0.0, 0.0
			for _, id := range ids {
				watched += time.Since(t0).Seconds()
				if m, err := rec.Finish(ctx, "bench", id, time.Now()); err == nil && m != nil {
					recorded += m.Duration
				}
			}
			frac := 1 - recorded/watched
			b.ReportMetric(frac, fmt.Sprintf("late-frac-%d", n))
			if frac > 0.02 {
				break
			}
			maxOK = n
		}
		b.ReportMetric(float64(maxOK), "max-concurrent-without-late-frames")
	}
	store.Expire(ctx, "bench", time.Now().Add(time.Hour))
}
