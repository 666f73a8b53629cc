package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// chromiumFlags are the flags the session image starts Chromium with
// (images/session/rootfs/etc/sandgate/chromium.flags, and what its
// launcher adds), for baselines.
func chromiumFlags(tb testing.TB) []string {
	tb.Helper()
	raw, err := os.ReadFile("../images/session/rootfs/etc/sandgate/chromium.flags")
	if err != nil {
		tb.Fatal(err)
	}
	var flags []string
	for _, line := range strings.Split(string(raw), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			flags = append(flags, line)
		}
	}
	return append(flags, "--window-position=0,0", "--window-size=1280,800")
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p)
	return s[i]
}

func waitJSONVersion(url string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	client := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer", url)
}

// hostChromium starts Xvfb and Chromium on the host with the session's
// flags and returns once CDP answers; stop ends both.
func hostChromium(b testing.TB, display, port int, extra ...string) (stop func()) {
	b.Helper()
	// A display left locked by an earlier, killed run would refuse us.
	os.Remove(fmt.Sprintf("/tmp/.X%d-lock", display))
	os.Remove(fmt.Sprintf("/tmp/.X11-unix/X%d", display))
	xvfb := exec.Command("Xvfb", fmt.Sprintf(":%d", display), "-screen", "0", "1280x800x24", "-nolisten", "tcp")
	if err := xvfb.Start(); err != nil {
		b.Fatalf("Xvfb: %v", err)
	}
	sock := fmt.Sprintf("/tmp/.X11-unix/X%d", display)
	for i := 0; i < 500; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	profile := b.TempDir()
	args := append(append(chromiumFlags(b), extra...), fmt.Sprintf("--remote-debugging-port=%d", port), "--user-data-dir="+profile, "about:blank")
	// Chromium itself, as the session starts it, not Debian's launcher script.
	chrome := exec.Command("/usr/lib/chromium/chromium", args...)
	chrome.Env = append(os.Environ(), fmt.Sprintf("DISPLAY=:%d", display))
	if err := chrome.Start(); err != nil {
		xvfb.Process.Kill()
		b.Fatalf("chromium: %v", err)
	}
	if err := waitJSONVersion(fmt.Sprintf("http://127.0.0.1:%d/json/version", port), 60*time.Second); err != nil {
		b.Fatal(err)
	}
	return func() {
		chrome.Process.Kill()
		chrome.Wait()
		xvfb.Process.Signal(os.Interrupt)
		xvfb.Wait()
		os.Remove(sock)
		os.Remove(fmt.Sprintf("/tmp/.X%d-lock", display))
		os.RemoveAll(filepath.Join(profile))
	}
}

// BenchmarkColdStart: create a session until CDP answers through the
// gateway, under runc and gVisor, each beside Xvfb and the same Chromium
// launched directly on the host in the same iteration, so that the ratio
// holds on a machine others share. The gateway's own per-step times (the
// started event's steps_ms) are reported as medians.
func BenchmarkColdStart(b *testing.B) {
	e := needE2E(b)
	for _, rt := range []string{"runc", "gvisor"} {
		b.Run(rt, func(b *testing.B) {
			if !e.runtimeUsable(b, rt) {
				b.Skipf("%s is not usable here", rt)
			}
			var gw, host []time.Duration
			steps := map[string][]time.Duration{}
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				// Two CPUs, as many as the host baseline's Chromium can use.
				status, body := e.api(b, e.keyA, "POST", "/v1/sessions", map[string]any{"runtime": rt, "labels": map[string]string{"bench": "coldstart"}, "resources": map[string]any{"cpus": 2}})
				if status != 201 {
					b.Fatalf("create: %d %s", status, body)
				}
				id := jsonField(body, "id")
				p := e.preview(b, e.keyA, id, 60)
				if err := waitJSONVersion(p.URL+"/json/version", 60*time.Second); err != nil {
					b.Fatal(err)
				}
				gw = append(gw, time.Since(t0))
				for name, d := range e.startedSteps(b, id) {
					steps[name] = append(steps[name], d)
				}
				e.api(b, e.keyA, "DELETE", "/v1/sessions/"+id, nil)

				port, _ := freePort()
				t1 := time.Now()
				stop := hostChromium(b, 90+i%5, port)
				host = append(host, time.Since(t1))
				stop()
			}
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			b.ReportMetric(ms(percentile(gw, 0.5)), "gateway-p50-ms")
			b.ReportMetric(ms(percentile(gw, 0.95)), "gateway-p95-ms")
			b.ReportMetric(ms(percentile(host, 0.5)), "host-p50-ms")
			b.ReportMetric(ms(percentile(host, 0.95)), "host-p95-ms")
			b.ReportMetric(float64(percentile(gw, 0.5))/float64(percentile(host, 0.5)), "p50-ratio")
			for name, ds := range steps {
				b.ReportMetric(ms(percentile(ds, 0.5)), name+"-p50-ms")
			}
		})
	}
}

// runtimeUsable says whether the gateway can run sessions under rt here.
func (e *testEnv) runtimeUsable(t testing.TB, rt string) bool {
	t.Helper()
	_, body := e.api(t, e.keyA, "GET", "/v1/runtimes", nil)
	var rts struct {
		Runtimes []struct {
			Name   string
			Usable bool
		}
	}
	json.Unmarshal(body, &rts)
	for _, r := range rts.Runtimes {
		if r.Name == rt {
			return r.Usable
		}
	}
	return false
}

// startedSteps reads the per-step times of a session's started event.
func (e *testEnv) startedSteps(t testing.TB, id string) map[string]time.Duration {
	t.Helper()
	st, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+id+"/events", nil)
	if st != 200 {
		t.Fatalf("events: %d %s", st, body)
	}
	var evs struct {
		Events []struct {
			Type   string `json:"type"`
			Fields struct {
				Steps map[string]float64 `json:"steps_ms"`
			} `json:"fields"`
		} `json:"events"`
	}
	json.Unmarshal(body, &evs)
	out := map[string]time.Duration{}
	for _, ev := range evs.Events {
		if ev.Type == "started" {
			for name, v := range ev.Fields.Steps {
				out[name] = time.Duration(v * float64(time.Millisecond))
			}
		}
	}
	return out
}

// BenchmarkCDPRoundTrip: Runtime.evaluate of 1+1 through the gateway and
// directly against the same session's Chromium, on a session of each
// runtime (runc has no sandbox between the two paths and Chromium, so it
// shows the gateway's own cost).
func BenchmarkCDPRoundTrip(b *testing.B) {
	for _, rt := range []string{"runc", "gvisor"} {
		b.Run(rt, func(b *testing.B) { benchCDPRoundTrip(b, rt) })
	}
}

func benchCDPRoundTrip(b *testing.B, runtime string) {
	e := needE2E(b)
	s := e.createSession(b, e.keyA, map[string]any{"runtime": runtime})
	p := e.preview(b, e.keyA, s.ID, 600)
	c, err := e.client.LoadContainer(e.ctx(), s.ID)
	if err != nil {
		b.Fatal(err)
	}
	labels, _ := c.Labels(e.ctx())
	addr := labels["sandgate.addr"]
	resp, err := http.Get(p.URL + "/json/list")
	if err != nil {
		b.Fatal(err)
	}
	var targets []struct{ ID, Type, WebSocketDebuggerURL string }
	json.NewDecoder(resp.Body).Decode(&targets)
	resp.Body.Close()
	var page, gwURL string
	for _, t := range targets {
		if t.Type == "page" {
			page, gwURL = t.ID, t.WebSocketDebuggerURL
			break
		}
	}
	if page == "" || !strings.Contains(gwURL, "/cdp/") {
		b.Fatalf("no page target: %+v", targets)
	}
	direct := "ws://" + addr + ":9222/devtools/page/" + page
	conns := map[string]*websocket.Conn{}
	for name, u := range map[string]string{"direct": direct, "gateway": gwURL} {
		c, _, err := websocket.DefaultDialer.DialContext(context.Background(), u, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		conns[name] = c
	}
	id := 0
	eval := func(conn *websocket.Conn) time.Duration {
		id++
		t0 := time.Now()
		if err := conn.WriteJSON(map[string]any{"id": id, "method": "Runtime.evaluate", "params": map[string]any{"expression": "1+1"}}); err != nil {
			b.Fatal(err)
		}
		for {
			var m struct {
				ID     int `json:"id"`
				Result struct {
					Result struct{ Value int } `json:"result"`
				} `json:"result"`
			}
			if err := conn.ReadJSON(&m); err != nil {
				b.Fatal(err)
			}
			if m.ID == id {
				if m.Result.Result.Value != 2 {
					b.Fatalf("1+1 = %d", m.Result.Result.Value)
				}
				return time.Since(t0)
			}
		}
	}
	for i := 0; i < 50; i++ { // warm both paths
		eval(conns["direct"])
		eval(conns["gateway"])
	}
	// Interleaved, so that neither path gains from running second.
	var direct_, gateway_ []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct_ = append(direct_, eval(conns["direct"]))
		gateway_ = append(gateway_, eval(conns["gateway"]))
	}
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	b.ReportMetric(us(percentile(direct_, 0.5)), "direct-p50-us")
	b.ReportMetric(us(percentile(gateway_, 0.5)), "gateway-p50-us")
	b.ReportMetric(us(percentile(gateway_, 0.95)), "gateway-p95-us")
	b.ReportMetric(float64(percentile(gateway_, 0.5))/float64(percentile(direct_, 0.5)), "p50-gateway/direct")
}
