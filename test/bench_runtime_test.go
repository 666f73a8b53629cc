package test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// BenchmarkRuntimes: cold start (create until CDP answers through the
// gateway), idle memory, and the CDP round trip through the gateway, for
// every usable runtime side by side.
func BenchmarkRuntimes(b *testing.B) {
	e := needE2E(b)
	_, body := e.api(b, e.keyA, "GET", "/v1/runtimes", nil)
	var rts struct {
		Runtimes []struct {
			Name   string
			Usable bool
		}
	}
	json.Unmarshal(body, &rts)
	cold := map[string][]time.Duration{}
	rtt := map[string][]time.Duration{}
	mem := map[string][]int64{}
	for i := 0; i < b.N; i++ {
		for _, rt := range rts.Runtimes {
			if !rt.Usable {
				continue
			}
			t0 := time.Now()
			status, body := e.api(b, e.keyA, "POST", "/v1/sessions", map[string]any{"runtime": rt.Name, "labels": map[string]string{"bench": "runtimes"}})
			if status != 201 {
				b.Fatalf("create %s: %d %s", rt.Name, status, body)
			}
			id := jsonField(body, "id")
			p := e.preview(b, e.keyA, id, 300)
			if err := waitJSONVersion(p.URL+"/json/version", 60*time.Second); err != nil {
				b.Fatal(err)
			}
			cold[rt.Name] = append(cold[rt.Name], time.Since(t0))
			time.Sleep(3 * time.Second) // idle
			if n, ok := sessionMemory(id); ok {
				mem[rt.Name] = append(mem[rt.Name], n)
			}
			resp, err := http.Get(p.URL + "/json/list")
			if err != nil {
				b.Fatal(err)
			}
			var ts []struct{ Type, WebSocketDebuggerURL string }
			json.NewDecoder(resp.Body).Decode(&ts)
			resp.Body.Close()
			for _, tg := range ts {
				if tg.Type != "page" {
					continue
				}
				c, _, err := websocket.DefaultDialer.DialContext(context.Background(), tg.WebSocketDebuggerURL, nil)
				if err != nil {
					b.Fatal(err)
				}
				for j := 1; j <= 30; j++ {
					t1 := time.Now()
					c.WriteJSON(map[string]any{"id": j, "method": "Runtime.evaluate", "params": map[string]any{"expression": "1+1"}})
					for {
						var m struct{ ID int }
						if err := c.ReadJSON(&m); err != nil {
							b.Fatal(err)
						}
						if m.ID == j {
							break
						}
					}
					if j > 5 {
						rtt[rt.Name] = append(rtt[rt.Name], time.Since(t1))
					}
				}
				c.Close()
				break
			}
			e.api(b, e.keyA, "DELETE", "/v1/sessions/"+id, nil)
		}
	}
	for name := range cold {
		b.ReportMetric(float64(percentile(cold[name], 0.5))/1e6, name+"-cold-p50-ms")
		b.ReportMetric(float64(percentile(cold[name], 0.95))/1e6, name+"-cold-p95-ms")
		b.ReportMetric(float64(percentile(rtt[name], 0.5))/1e3, name+"-cdp-p50-us")
		if ms := mem[name]; len(ms) > 0 {
			var sum int64
			for _, m := range ms {
				sum += m
			}
			b.ReportMetric(float64(sum)/float64(len(ms))/(1<<20), name+"-idle-MiB")
		}
	}
	if len(cold["runc"]) > 0 && len(cold["gvisor"]) > 0 {
		b.ReportMetric(float64(percentile(cold["gvisor"], 0.5))/float64(percentile(cold["runc"], 0.5)), "cold-gvisor/runc")
		b.ReportMetric(float64(percentile(rtt["gvisor"], 0.5))/float64(percentile(rtt["runc"], 0.5)), "cdp-gvisor/runc")
	}
}
