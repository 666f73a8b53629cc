package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sandgate/sandgate/desktop"
)

// The load and soak run of issue 15: bounded in count and time, on
// loopback only. It is not part of make test (it takes about 40 minutes
// with the defaults): make load, or SANDGATE_LOAD=1 with
//   SANDGATE_LOAD_SESSIONS (20), SANDGATE_LOAD_CDP_CLIENTS (200),
//   SANDGATE_LOAD_VNC_VIEWERS (10), SANDGATE_LOAD_DURATION (5m),
//   SANDGATE_SOAK_DURATION (30m), SANDGATE_LOAD_RUNTIME (the default).

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

// window keeps latencies seen early and late in a run.
type window struct {
	mu         sync.Mutex
	start, end []time.Duration
	all        int
}

func (w *window) add(d time.Duration, early, late bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all++
	if early {
		w.start = append(w.start, d)
	}
	if late {
		w.end = append(w.end, d)
	}
}

func (w *window) report(t *testing.T, what string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ms := func(ds []time.Duration, p float64) string {
		if len(ds) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f", float64(percentile(ds, p))/1e6)
	}
	t.Logf("%-22s n=%-6d start p50/p99 %s/%s ms (n=%d)   end p50/p99 %s/%s ms (n=%d)", what, w.all,
		ms(w.start, 0.5), ms(w.start, 0.99), len(w.start), ms(w.end, 0.5), ms(w.end, 0.99), len(w.end))
}

// gatewayStats reads the gateway's goroutines, open files and resident
// memory from /metrics.
func (e *testEnv) gatewayStats(t *testing.T) (goroutines, fds, rssMB float64) {
	return e.metric(t, "sandgate_gateway_goroutines"), e.metric(t, "sandgate_gateway_open_fds"),
		e.metric(t, "sandgate_gateway_resident_bytes") / (1 << 20)
}

// cdpRoundTrip sends Browser.getVersion and waits for its answer.
func cdpRoundTrip(c *websocket.Conn, id int) (time.Duration, error) {
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	t0 := time.Now()
	if err := c.WriteJSON(map[string]any{"id": id, "method": "Browser.getVersion"}); err != nil {
		return 0, err
	}
	for {
		var m struct {
			ID int `json:"id"`
		}
		if err := c.ReadJSON(&m); err != nil {
			return 0, err
		}
		if m.ID == id {
			return time.Since(t0), nil
		}
	}
}

func TestLoadAndSoak(t *testing.T) {
	if os.Getenv("SANDGATE_LOAD") == "" {
		t.Skip("the load and soak run takes about 40 minutes: make load (SANDGATE_LOAD=1)")
	}
	e := needE2E(t)
	nSessions := envInt("SANDGATE_LOAD_SESSIONS", 20)
	nCDP := envInt("SANDGATE_LOAD_CDP_CLIENTS", 200)
	nVNC := envInt("SANDGATE_LOAD_VNC_VIEWERS", 10)
	loadFor := envDuration("SANDGATE_LOAD_DURATION", 5*time.Minute)
	soakFor := envDuration("SANDGATE_SOAK_DURATION", 30*time.Minute)
	runtime := os.Getenv("SANDGATE_LOAD_RUNTIME")
	edge := min(time.Minute, loadFor/4)

	// A tenant of its own, without a session limit.
	name := "load-" + randHex(4)
	e.admin(t, "POST", "/tenants", map[string]any{"name": name, "max_ttl_seconds": 7200}, 201, nil)
	defer e.api(t, e.adminKey, "PATCH", "/admin/v1/tenants/"+name, map[string]any{"disabled": true})
	var k adminKey
	e.admin(t, "POST", "/tenants/"+name+"/keys", map[string]any{"name": "load"}, 201, &k)
	key := k.APIKey
	req := map[string]any{"ttl_seconds": 7200}
	if runtime != "" {
		req["runtime"] = runtime
	}
	var errs atomic.Int64
	var errMu sync.Mutex
	var firstErrs []string
	fail := func(format string, args ...any) {
		if errs.Add(1) <= 10 {
			errMu.Lock()
			firstErrs = append(firstErrs, fmt.Sprintf(format, args...))
			errMu.Unlock()
		}
	}
	client := &http.Client{Timeout: 5 * time.Minute}
	post := func(path string, body any) (int, []byte, time.Duration) {
		raw, _ := json.Marshal(body)
		r, _ := http.NewRequest("POST", e.gwURL+path, bytes.NewReader(raw))
		r.Header.Set("Authorization", "Bearer "+key)
		r.Header.Set("Content-Type", "application/json")
		t0 := time.Now()
		resp, err := client.Do(r)
		if err != nil {
			return 0, []byte(err.Error()), time.Since(t0)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out, time.Since(t0)
	}
	del := func(id string) {
		r, _ := http.NewRequest("DELETE", e.gwURL+"/v1/sessions/"+id, nil)
		r.Header.Set("Authorization", "Bearer "+key)
		if resp, err := client.Do(r); err != nil || resp.StatusCode != 200 {
			fail("delete %s: %v", id, err)
		} else {
			resp.Body.Close()
		}
	}
	previewURL := func(id, scope string, viewOnly bool) string {
		st, body, _ := post("/v1/sessions/"+id+"/previews", map[string]any{"scope": scope, "ttl_seconds": 7200, "view_only": viewOnly})
		if st != 201 {
			fail("preview: %d %s", st, body)
			return ""
		}
		return jsonField(body, "url")
	}

	// Phase 1: nSessions sessions, nCDP CDP clients, nVNC viewers and an
	// action loop per session, for loadFor.
	var creates, cdp, actions, frames window
	ids := make([]string, nSessions)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			st, body, d := post("/v1/sessions", req)
			if st != 201 {
				fail("create: %d %s", st, body)
				return
			}
			ids[i] = jsonField(body, "id")
			creates.add(d, true, false)
		}()
	}
	wg.Wait()
	defer func() {
		for _, id := range ids {
			if id != "" {
				del(id)
			}
		}
	}()
	if errs.Load() > 0 {
		t.Fatalf("creating %d sessions: %v", nSessions, firstErrs)
	}
	start := time.Now()
	deadline := start.Add(loadFor)
	early := func() bool { return time.Since(start) < edge }
	late := func() bool { return time.Until(deadline) < edge }
	cdpURLs := make([]string, nSessions)
	for i, id := range ids {
		if cdpURLs[i] = previewURL(id, "cdp", false); cdpURLs[i] != "" {
			cdpURLs[i] = browserWS(t, cdpURLs[i])
		}
	}
	for c := range nCDP {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := cdpURLs[c%nSessions]
			var conn *websocket.Conn
			for n := 1; time.Now().Before(deadline); n++ {
				if conn == nil {
					var err error
					if conn, _, err = websocket.DefaultDialer.Dial(u, nil); err != nil {
						fail("cdp dial: %v", err)
						conn = nil
						time.Sleep(time.Second)
						continue
					}
				}
				d, err := cdpRoundTrip(conn, n)
				if err != nil {
					fail("cdp round trip: %v", err)
					conn.Close()
					conn = nil
					continue
				}
				cdp.add(d, early(), late())
				time.Sleep(time.Duration(150+rand.IntN(100)) * time.Millisecond)
			}
			if conn != nil {
				conn.Close()
			}
		}()
	}
	for v := range nVNC {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := previewURL(ids[v%nSessions], "vnc", true)
			if u == "" {
				return
			}
			u = strings.Replace(strings.Replace(u, "http://", "ws://", 1), "/view/", "/vnc/", 1)
			conn, _, err := websocket.DefaultDialer.Dial(u, nil)
			if err != nil {
				fail("vnc dial: %v", err)
				return
			}
			defer conn.Close()
			rc, err := desktop.Handshake(&wsStream{c: conn}, 3840, 2160)
			if err != nil {
				fail("rfb handshake: %v", err)
				return
			}
			for time.Now().Before(deadline) {
				conn.SetReadDeadline(time.Now().Add(30 * time.Second))
				t0 := time.Now()
				if err := rc.RequestUpdate(false); err != nil {
					fail("rfb request: %v", err)
					return
				}
				covered := image.Rectangle{}
				for covered != image.Rect(0, 0, rc.Width, rc.Height) {
					rects, _, err := rc.ReadUpdate()
					if err != nil {
						fail("rfb update: %v", err)
						return
					}
					for _, r := range rects {
						covered = covered.Union(r)
					}
				}
				frames.add(time.Since(t0), early(), late())
				time.Sleep(time.Second)
			}
		}()
	}
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				st, body, d := post("/v1/sessions/"+id+"/actions", map[string]any{"action": "mouse_move", "coordinate": []int{10 + rand.IntN(600), 10 + rand.IntN(400)}})
				if st != 200 {
					fail("action: %d %s", st, body)
				} else {
					actions.add(d, early(), late())
				}
				time.Sleep(2 * time.Second)
			}
		}()
	}
	wg.Wait()
	t.Logf("load: %d sessions (runtime %q), %d CDP clients, %d VNC viewers, an action loop per session, for %s; %d errors",
		nSessions, runtime, nCDP, nVNC, loadFor, errs.Load())
	creates.report(t, "create (4 at a time)")
	cdp.report(t, "CDP round trip")
	actions.report(t, "action (mouse_move)")
	frames.report(t, "VNC full frame")
	g, f, r := e.gatewayStats(t)
	t.Logf("gateway under load: %.0f goroutines, %.0f open files, %.0f MB resident", g, f, r)
	for i, id := range ids {
		del(id)
		ids[i] = ""
	}
	if n := errs.Load(); n > 0 {
		t.Errorf("%d errors under load; the first: %v", n, firstErrs)
	}

	// Phase 2: create, drive, delete cycles for soakFor, two at a time.
	settle := func() (float64, float64, float64) {
		deadline := time.Now().Add(2 * time.Minute)
		for e.usage(t, key).Sessions > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Second)
		}
		time.Sleep(10 * time.Second) // connections and timers of the ended sessions wind down
		return e.gatewayStats(t)
	}
	g0, f0, r0 := settle()
	t.Logf("gateway before the soak: %.0f goroutines, %.0f open files, %.0f MB resident", g0, f0, r0)
	errs.Store(0)
	firstErrs = nil
	var sCreates, sCDP, sActions window
	start = time.Now()
	deadline = start.Add(soakFor)
	edge = min(3*time.Minute, soakFor/4)
	var cycles atomic.Int64
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				st, body, d := post("/v1/sessions", req)
				if st != 201 {
					fail("soak create: %d %s", st, body)
					time.Sleep(time.Second)
					continue
				}
				id := jsonField(body, "id")
				sCreates.add(d, early(), late())
				if u := previewURL(id, "cdp", false); u != "" {
					if ws, err := browserWSErr(u); err != nil {
						fail("soak discovery: %v", err)
					} else if conn, _, err := websocket.DefaultDialer.Dial(ws, nil); err != nil {
						fail("soak cdp dial: %v", err)
					} else {
						for n := 1; n <= 5; n++ {
							if d, err := cdpRoundTrip(conn, n); err != nil {
								fail("soak cdp: %v", err)
								break
							} else {
								sCDP.add(d, early(), late())
							}
						}
						conn.Close()
					}
				}
				st, body, d = post("/v1/sessions/"+id+"/actions", map[string]any{"action": "mouse_move", "coordinate": []int{100, 100}})
				if st != 200 {
					fail("soak action: %d %s", st, body)
				} else {
					sActions.add(d, early(), late())
				}
				del(id)
				cycles.Add(1)
			}
		}()
	}
	wg.Wait()
	t.Logf("soak: %d create-drive-delete cycles in %s, two at a time; %d errors", cycles.Load(), soakFor, errs.Load())
	sCreates.report(t, "create")
	sCDP.report(t, "CDP round trip")
	sActions.report(t, "action (mouse_move)")
	g1, f1, r1 := settle()
	t.Logf("gateway after the soak: %.0f goroutines (%+.0f), %.0f open files (%+.0f), %.0f MB resident (%+.0f)", g1, g1-g0, f1, f1-f0, r1, r1-r0)
	if n := errs.Load(); n > 0 {
		t.Errorf("%d errors in the soak; the first: %v", n, firstErrs)
	}
	// Noise: a few goroutines and files come and go with timers and idle
	// connections; growth per cycle would be hundreds.
	if g1 > g0+30 || f1 > f0+30 || r1 > r0*1.5+64 {
		t.Errorf("the gateway grew over the soak: goroutines %.0f -> %.0f, files %.0f -> %.0f, RSS %.0f -> %.0f MB", g0, g1, f0, f1, r0, r1)
	}
	if l := e.leaks(); len(l) > 0 {
		t.Errorf("left behind after the soak: %v", l)
	}
}
