package test

import (
	"bytes"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// BenchmarkUpload: a 1 KiB upload through the API, to a new path and
// over an existing file, beside the round trip of `true` through the
// API in the same session (the least an exec costs), per runtime.
func BenchmarkUpload(b *testing.B) {
	e := needE2E(b)
	runtimes := []string{"runc"}
	if e.runtimeUsable(b, "gvisor") {
		runtimes = append(runtimes, "gvisor")
	}
	body := bytes.Repeat([]byte("u"), 1024)
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	for _, rt := range runtimes {
		s := e.createSession(b, e.keyA, map[string]any{"runtime": rt})
		put := func(path string) time.Duration {
			req, _ := http.NewRequest("PUT", e.gwURL+"/v1/sessions/"+s.ID+"/files?path="+url.QueryEscape(path), bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+e.keyA)
			t0 := time.Now()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 201 {
				b.Fatalf("upload: %d", resp.StatusCode)
			}
			return time.Since(t0)
		}
		var fresh, over, exec []time.Duration
		put("/tmp/over.bin")
		for i := 0; i < b.N; i++ {
			fresh = append(fresh, put("/tmp/new-"+randHex(6)))
			over = append(over, put("/tmp/over.bin"))
			t0 := time.Now()
			e.apiExecBytes(b, s.ID, "true")
			exec = append(exec, time.Since(t0))
		}
		b.ReportMetric(ms(percentile(fresh, 0.5)), rt+"-upload-new-p50-ms")
		b.ReportMetric(ms(percentile(over, 0.5)), rt+"-upload-over-p50-ms")
		b.ReportMetric(ms(percentile(exec, 0.5)), rt+"-exec-true-p50-ms")
		b.ReportMetric(float64(percentile(over, 0.5))/float64(percentile(exec, 0.5)), rt+"-upload-over/exec")
		e.api(b, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil)
	}
}
