package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// BenchmarkWarmStart: POST /v1/sessions until a CDP client is connected
// through the gateway and has its first answer (Browser.getVersion), for a
// session claimed from a warm pool, beside the cold path of the same
// runtime (a shape no pool has) in the same run. Warm, two ways: with a
// preview asked for apart and discovery (two calls, then /json/version),
// and in one call (the create asks for the preview; the client dials its
// ws_url). Between iterations the pool is let refill, untimed, so that a
// claim never races a refill. The baseline, in the same run: a GET
// /healthz after the same wait.
func BenchmarkWarmStart(b *testing.B) {
	e := needE2E(b)
	runtimes := []string{"runc"}
	if e.runtimeUsable(b, "gvisor") {
		runtimes = append(runtimes, "gvisor")
	}
	var pools []map[string]any
	for _, rt := range runtimes {
		pools = append(pools, map[string]any{"runtime": rt, "size": 1})
	}
	// SANDGATE_POOL_FREEZE=1 measures pools whose sessions are frozen.
	freeze := os.Getenv("SANDGATE_POOL_FREEZE") == "1"
	e.withGatewayConfig(b, func(cfg map[string]any) {
		cfg["pools"] = pools
		cfg["pool_limits"] = map[string]any{"freeze": freeze}
	})
	b.Logf("pooled sessions frozen while they wait: %v", freeze)
	// steps holds, per runtime and path, the time of each step of a
	// connect. Two calls: create, preview, discovery, upgrade, first
	// answer. One call (a create that asks for a CDP preview, then its
	// ws_url, the way a client in a hurry connects): create, upgrade,
	// first answer.
	steps := map[string]map[string][]time.Duration{}
	twoCalls := []string{"create", "preview", "discovery", "upgrade", "answer"}
	oneCall := []string{"create", "upgrade", "answer"}
	connect := func(key string, req map[string]any, path string) (time.Duration, string) {
		var marks []time.Duration
		t0 := time.Now()
		last := t0
		mark := func() { marks = append(marks, time.Since(last)); last = time.Now() }
		one := strings.HasSuffix(path, "one-call")
		if one {
			req["preview"] = map[string]any{"scope": "cdp", "ttl_seconds": 60}
		}
		st, body := e.api(b, key, "POST", "/v1/sessions", req)
		if st != 201 {
			b.Fatalf("create: %d %s", st, body)
		}
		mark()
		id := jsonField(body, "id")
		defer e.api(b, key, "DELETE", "/v1/sessions/"+id, nil)
		var ws string
		if one {
			var out struct {
				Preview struct {
					WSURL string `json:"ws_url"`
				}
			}
			if err := json.Unmarshal(body, &out); err != nil || out.Preview.WSURL == "" {
				b.Fatalf("no ws_url in %s", body)
			}
			ws = out.Preview.WSURL
		} else {
			p := e.preview(b, key, id, 60)
			mark()
			ws = browserWS(b, p.URL)
			mark()
		}
		c, _, err := websocket.DefaultDialer.DialContext(context.Background(), ws, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		mark()
		if err := c.WriteJSON(map[string]any{"id": 1, "method": "Browser.getVersion"}); err != nil {
			b.Fatal(err)
		}
		var m struct {
			ID     int `json:"id"`
			Result struct {
				Product string `json:"product"`
			} `json:"result"`
		}
		if err := c.ReadJSON(&m); err != nil || m.ID != 1 || m.Result.Product == "" {
			b.Fatalf("first answer: %+v %v", m, err)
		}
		mark()
		k := fmt.Sprint(req["runtime"], "-", path)
		if steps[k] == nil {
			steps[k] = map[string][]time.Duration{}
		}
		names := twoCalls
		if one {
			names = oneCall
		}
		for i, name := range names {
			steps[k][name] = append(steps[k][name], marks[i])
		}
		return time.Since(t0), jsonField(body, "start")
	}
	warm := map[string][]time.Duration{}
	warmOne := map[string][]time.Duration{}
	cold := map[string][]time.Duration{}
	// The baseline: one GET /healthz, the least a request to the gateway
	// costs, after the same settling as a claim. On these VMs a process
	// woken after half a second idle answers milliseconds later than one
	// already running (a bare Go HTTP server: 0.4 ms back to back, 3 ms
	// after 300 ms idle, 9 ms after a second).
	var idleRTT []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e.waitPools(b, len(runtimes))
		e.settlePools(b)
		t0 := time.Now()
		if st, body := e.api(b, "", "GET", "/healthz", nil); st != 200 {
			b.Fatalf("healthz: %d %s", st, body)
		}
		idleRTT = append(idleRTT, time.Since(t0))
		b.StartTimer()
		for _, rt := range runtimes {
			// Each path goes first on every other iteration, and claims
			// only settled sessions: one the refill has only just made
			// ready is still busy with its start (its first answer took
			// 200 ms under runc, 1.6 s under gVisor).
			paths := []string{"warm", "warm-one-call"}
			if i%2 == 1 {
				paths[0], paths[1] = paths[1], paths[0]
			}
			for _, path := range paths {
				b.StopTimer()
				e.waitPools(b, len(runtimes))
				e.settlePools(b)
				b.StartTimer()
				d, start := connect(e.keyA, map[string]any{"runtime": rt}, path)
				if start != "warm" {
					b.Fatalf("%s: a request of the pool's shape started %q", rt, start)
				}
				if path == "warm" {
					warm[rt] = append(warm[rt], d)
				} else {
					warmOne[rt] = append(warmOne[rt], d)
				}
			}
		}
	}
	b.StopTimer()
	// The cold path of each runtime, three times, beside.
	for _, rt := range runtimes {
		for i := 0; i < 3; i++ {
			e.waitPools(b, len(runtimes))
			d, start := connect(e.keyA, map[string]any{"runtime": rt, "screen": map[string]int{"width": 1280, "height": 720}}, "cold")
			if start != "cold" {
				b.Fatalf("%s: another shape started %q", rt, start)
			}
			cold[rt] = append(cold[rt], d)
		}
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for k, st := range steps {
		var parts []string
		names := twoCalls
		if strings.HasSuffix(k, "one-call") {
			names = oneCall
		}
		for _, name := range names {
			parts = append(parts, fmt.Sprintf("%s %.1f ms", name, ms(percentile(st[name], 0.5))))
		}
		b.Logf("%s, p50 of each step: %s", k, strings.Join(parts, ", "))
	}
	b.ReportMetric(ms(percentile(idleRTT, 0.5)), "idle-healthz-p50-ms")
	for _, rt := range runtimes {
		b.ReportMetric(ms(percentile(warm[rt], 0.5)), rt+"-warm-p50-ms")
		b.ReportMetric(ms(percentile(warm[rt], 0.99)), rt+"-warm-p99-ms")
		b.ReportMetric(ms(percentile(warmOne[rt], 0.5)), rt+"-warm-one-call-p50-ms")
		b.ReportMetric(ms(percentile(warmOne[rt], 0.99)), rt+"-warm-one-call-p99-ms")
		b.ReportMetric(ms(percentile(cold[rt], 0.5)), rt+"-cold-p50-ms")
		b.ReportMetric(float64(percentile(cold[rt], 0.5))/float64(percentile(warm[rt], 0.5)), rt+"-cold/warm")
	}
}

// settlePools waits until every pooled session uses less than a fifth of
// a core over half a second (a start's burst is most of a core; an idle
// gVisor session about a tenth), or a minute has passed.
func (e *testEnv) settlePools(b *testing.B) {
	deadline := time.Now().Add(time.Minute)
	for id := range e.pooledContainers(b) {
		for time.Now().Before(deadline) {
			c0, _ := e.taskCPU(b, id)
			time.Sleep(500 * time.Millisecond)
			c1, _ := e.taskCPU(b, id)
			if c1-c0 < 100*time.Millisecond {
				break
			}
		}
	}
	if time.Now().After(deadline) {
		b.Logf("pooled sessions still busy after a minute; claiming anyway")
	}
}

// waitPools waits until every pool is full.
func (e *testEnv) waitPools(t testing.TB, n int) {
	t.Helper()
	deadline := time.Now().Add(4 * time.Minute)
	for {
		ps := e.pools(t)
		full := len(ps) == n
		for _, p := range ps {
			full = full && p.Available >= p.Size
		}
		if full {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pools did not fill: %+v", ps)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
