package test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// BenchmarkCDPConnect: a new CDP client's connect until its first answer
// (Browser.getVersion on the browser target), directly to the session's
// Chromium and through the gateway's ws_url, interleaved in the same run,
// split into the WebSocket dial and the first answer. A warm claim's
// client pays exactly this after its create.
func BenchmarkCDPConnect(b *testing.B) {
	e := needE2E(b)
	s := e.createSession(b, e.keyA, map[string]any{"runtime": "runc"})
	c, err := e.client.LoadContainer(e.ctx(), s.ID)
	if err != nil {
		b.Fatal(err)
	}
	labels, _ := c.Labels(e.ctx())
	resp, err := http.Get("http://" + labels["sandgate.addr"] + ":9222/json/version")
	if err != nil {
		b.Fatal(err)
	}
	var v struct{ WebSocketDebuggerURL string }
	json.NewDecoder(resp.Body).Decode(&v)
	resp.Body.Close()
	if !strings.HasPrefix(v.WebSocketDebuggerURL, "ws://") {
		b.Fatalf("direct /json/version: %+v", v)
	}
	direct := "ws://" + labels["sandgate.addr"] + ":9222" + v.WebSocketDebuggerURL[strings.Index(v.WebSocketDebuggerURL[5:], "/")+5:]
	st, body := e.api(b, e.keyA, "POST", "/v1/sessions/"+s.ID+"/previews", map[string]any{"scope": "cdp", "ttl_seconds": 600})
	gw := jsonField(body, "ws_url")
	if st != 201 || gw == "" {
		b.Fatalf("preview: %d %s", st, body)
	}
	connect := func(u string) (dial, answer time.Duration) {
		t0 := time.Now()
		conn, _, err := websocket.DefaultDialer.DialContext(context.Background(), u, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		t1 := time.Now()
		if err := conn.WriteJSON(map[string]any{"id": 1, "method": "Browser.getVersion"}); err != nil {
			b.Fatal(err)
		}
		var m struct {
			ID     int                      `json:"id"`
			Result struct{ Product string } `json:"result"`
		}
		if err := conn.ReadJSON(&m); err != nil || m.ID != 1 || m.Result.Product == "" {
			b.Fatalf("first answer: %+v %v", m, err)
		}
		return t1.Sub(t0), time.Since(t1)
	}
	for i := 0; i < 5; i++ { // warm both paths
		connect(direct)
		connect(gw)
	}
	var dd, da, gd, ga, dt, gt []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d1, a1 := connect(direct)
		d2, a2 := connect(gw)
		dd, da, dt = append(dd, d1), append(da, a1), append(dt, d1+a1)
		gd, ga, gt = append(gd, d2), append(ga, a2), append(gt, d2+a2)
	}
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	b.ReportMetric(us(percentile(dd, 0.5)), "direct-dial-p50-us")
	b.ReportMetric(us(percentile(da, 0.5)), "direct-answer-p50-us")
	b.ReportMetric(us(percentile(gd, 0.5)), "gateway-dial-p50-us")
	b.ReportMetric(us(percentile(ga, 0.5)), "gateway-answer-p50-us")
	b.ReportMetric(float64(percentile(gt, 0.5))/float64(percentile(dt, 0.5)), "p50-gateway/direct")
}
