package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/recordings"
)

// TestFront: a replica standing by answers its probes itself, forwards
// everything else to the leader byte for byte (keep-alive, bodies), says
// 503 in the API's JSON when nobody leads or the leader is gone, bounds
// what it reads, and hands its listener to the gateway once it leads,
// cutting what it forwarded to the old leader; once the gateway stops
// serving, it keeps the port (503) until it is closed.
func TestFront(t *testing.T) {
	var mu sync.Mutex
	leader := ""
	setLeader := func(a string) { mu.Lock(); leader = a; mu.Unlock() }
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Saw-Forwarded", r.Header.Get(ForwardedHeader))
		fmt.Fprintf(w, "leader %s %s %s", r.Method, r.URL.Path, body)
	}))
	defer old.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := NewFront(ln, func(context.Context) (string, Relays, error) {
		mu.Lock()
		defer mu.Unlock()
		return leader, Relays{}, nil
	}, slog.New(slog.DiscardHandler))
	defer f.Close()
	base := "http://" + ln.Addr().String()
	client := &http.Client{Timeout: 10 * time.Second}
	get := func(method, path, body string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	apiError := func(body string) string {
		var e struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			return "not JSON: " + body
		}
		return e.Error.Code
	}

	// Nobody leads: the probes answer here; the API says retry.
	if st, body, _ := get("GET", "/healthz", ""); st != 200 || !strings.Contains(body, "standby") {
		t.Errorf("healthz standing by: %d %s", st, body)
	}
	if st, body, _ := get("GET", "/readyz", ""); st != 503 || apiError(body) != "unavailable" {
		t.Errorf("readyz standing by: %d %s", st, body)
	}
	if st, body, h := get("POST", "/v1/sessions", `{"kind":"browser"}`); st != 503 || apiError(body) != "unavailable" || h.Get("Retry-After") == "" {
		t.Errorf("no leader: %d %s %v", st, body, h)
	}

	// A leader: forwarded, bodies and all, on one connection or several.
	setLeader(strings.TrimPrefix(old.URL, "http://"))
	time.Sleep(frontLeaderCache) // the empty answer was cached
	// Each connection's first request says it was forwarded (the
	// gateway closes such a connection after its answer; this leader
	// does not, so the later ones on it do not say so).
	saw := map[string]int{}
	for i := 0; i < 3; i++ {
		st, body, h := get("POST", "/v1/sessions", `{"n":1}`)
		if st != 200 || body != `leader POST /v1/sessions {"n":1}` {
			t.Fatalf("forwarded: %d %q", st, body)
		}
		saw[h.Get("X-Saw-Forwarded")]++
	}
	if saw["standby"] != 1 || saw[""] != 2 {
		t.Errorf("the leader saw %s on the first of 3 requests on one connection, %v", ForwardedHeader, saw)
	}
	// The probes still answer here: ready now, there being a leader to
	// forward to (so a Service may send here, and a rolling update
	// goes on), but the replica's own answer, not the leader's
	// (on a connection of its own: the kubelet's probes do not keep
	// theirs; a connection forwarded once is the leader's).
	client.CloseIdleConnections()
	if st, body, _ := get("GET", "/readyz", ""); st != 200 || !strings.Contains(body, "standby") {
		t.Errorf("readyz with a leader: %d %s", st, body)
	}
	// Its metrics, while it has no relay to answer them (it starts):
	// 503, not the leader's (which answers, but would count its
	// sessions twice).
	client.CloseIdleConnections()
	if st, body, _ := get("GET", "/metrics", ""); st != 503 || !strings.Contains(body, "metrics are not served") {
		t.Errorf("metrics with no relay, a leader up: %d %s, want 503", st, body)
	}
	client.CloseIdleConnections()

	// Too long a request line: refused, not read on.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /%s HTTP/1.1\r\n\r\n", strings.Repeat("a", frontMaxLine))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, _ := bufio.NewReader(c).ReadString('\n'); !strings.HasPrefix(line, "HTTP/1.1 431") {
		t.Errorf("an overlong request line: %q", line)
	}
	c.Close()

	// Empty lines before the request line are skipped, as the
	// gateway's server skips them: the request still says it was
	// forwarded.
	c, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "\r\n\r\nGET /late HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.Header.Get("X-Saw-Forwarded") != "standby" {
		t.Errorf("a request after empty lines: %v %v, want it forwarded, saying so", resp, err)
	}
	c.Close()
	// More than the few the Front skips: refused, not forwarded
	// unmarked (the leader would keep the connection).
	c, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "%sGET /late HTTP/1.1\r\nHost: x\r\n\r\n", strings.Repeat("\r\n", 9))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
		t.Errorf("a request after 9 empty lines: %v", err)
	} else if body, _ := io.ReadAll(resp.Body); resp.StatusCode != 400 || !strings.Contains(string(body), "no request line") {
		t.Errorf("a request after 9 empty lines: %d %s, want the Front's 400", resp.StatusCode, body)
	}
	c.Close()

	// A forwarded connection held open (keep-alive) to the old leader.
	held, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	hr := bufio.NewReader(held)
	fmt.Fprintf(held, "GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(hr, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "leader GET /held " {
		t.Fatalf("held connection: %q", b)
	}

	// The leader is gone (its address answers no more): 503, not a
	// hang. The held connection stays open to the old one.
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone.Close()
	setLeader(gone.Addr().String())
	time.Sleep(frontLeaderCache)
	if st, body, _ := get("GET", "/v1/sessions", ""); st != 503 || apiError(body) != "unavailable" {
		t.Errorf("a dead leader: %d %s", st, body)
	}
	// Nor is this replica ready: a Service sends elsewhere while the
	// dead leader's lease runs out.
	if st, body, _ := get("GET", "/readyz", ""); st != 503 || apiError(body) != "unavailable" {
		t.Errorf("readyz with a dead leader: %d %s", st, body)
	}

	// A request whose line is still coming when the lead arrives.
	// (Once the answers above are done, only the held connection holds
	// a slot.)
	slotsAre := func(n int) bool {
		deadline := time.Now().Add(10 * time.Second)
		for len(f.slots) != n && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		return len(f.slots) == n
	}
	if !slotsAre(1) {
		t.Fatalf("%d connections held, want the one", len(f.slots))
	}
	late, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	fmt.Fprint(late, "GET /la")
	if !slotsAre(2) {
		t.Fatal("the late connection was not taken up")
	}

	// This replica takes over: 503 meanwhile; then the gateway serves.
	f.TakingOver()
	if st, body, _ := get("GET", "/v1/sessions", ""); st != 503 || !strings.Contains(body, "taking over") {
		t.Errorf("taking over: %d %s", st, body)
	}
	if st, body, _ := get("GET", "/healthz", ""); st != 200 || !strings.Contains(body, "taking over") {
		t.Errorf("healthz taking over: %d %s", st, body)
	}
	if st, body, _ := get("GET", "/readyz", ""); st != 503 || apiError(body) != "unavailable" {
		t.Errorf("readyz taking over: %d %s", st, body)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "self %s", r.URL.Path)
	})}
	go srv.Serve(f.Listener())
	defer srv.Close()
	f.Lead()
	if st, body, _ := get("GET", "/v1/sessions", ""); st != 200 || body != "self /v1/sessions" {
		t.Errorf("leading: %d %q", st, body)
	}
	if st, body, _ := get("GET", "/healthz", ""); st != 200 || body != "self /healthz" {
		t.Errorf("healthz leading (the gateway's own): %d %q", st, body)
	}
	// The late request reaches the gateway whole.
	fmt.Fprint(late, "te HTTP/1.1\r\nHost: x\r\n\r\n")
	late.SetReadDeadline(time.Now().Add(10 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(late), nil); err != nil {
		t.Errorf("the request begun before the lead: %v", err)
	} else if b, _ := io.ReadAll(resp.Body); string(b) != "self /late" {
		t.Errorf("the request begun before the lead: %q", b)
	}
	// The connection forwarded to the old leader was cut.
	held.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := hr.ReadByte(); err == nil || isTimeout(err) {
		t.Errorf("a connection forwarded to the old leader is still open after the lead: %v", err)
	}

	// The gateway stops serving (it closes its listener): the Front keeps
	// the port, answering 503, until it is closed itself.
	client.CloseIdleConnections()
	srv.Close()
	if st, body, h := get("GET", "/v1/sessions", ""); st != 503 || apiError(body) != "unavailable" || !strings.Contains(body, "stopping") || h.Get("Retry-After") == "" {
		t.Errorf("after the gateway stopped: %d %s", st, body)
	}
	f.Close()
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Error("the port still takes connections after the Front closed")
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// BenchmarkFront: a request through a replica standing by (a new
// connection each, as a client that does not keep its connections)
// against the same request straight to the leader, in the same run.
func BenchmarkFront(b *testing.B) {
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer leader.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := strings.TrimPrefix(leader.URL, "http://")
	f := NewFront(ln, func(context.Context) (string, Relays, error) { return addr, Relays{}, nil }, slog.New(slog.DiscardHandler))
	defer f.Close()
	for _, c := range []struct{ name, url string }{{"direct", leader.URL}, {"through-standby", "http://" + ln.Addr().String()}} {
		b.Run(c.name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			for i := 0; i < b.N; i++ {
				resp, err := client.Get(c.url + "/v1/sessions")
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

// TestFrontRelay: while it stands by, a replica with a relay hands the
// preview connections (CDP, VNC), shells, commands, files, actions,
// screenshots and snapshots taken to it, each kind while the leader admits it, and forwards
// everything else to the leader; it forwards those too to a leader that
// does not answer relaying replicas (an earlier version's, in a rolling
// update).
func TestFrontRelay(t *testing.T) {
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "leader %s", r.URL.Path) }))
	defer leader.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var relays Relays
	addr := strings.TrimPrefix(leader.URL, "http://")
	f := NewFront(ln, func(context.Context) (string, Relays, error) { mu.Lock(); defer mu.Unlock(); return addr, relays, nil }, slog.New(slog.DiscardHandler))
	defer f.Close()
	relay := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "relay %s", r.URL.Path) })}
	go relay.Serve(f.RelayListener(func(Relays) bool { return true }))
	defer relay.Close()
	do := func(method, path string) string {
		t.Helper()
		_, body := frontCall(t, ln, method, path)
		return body
	}
	get := func(path string) string { t.Helper(); return do("GET", path) }
	sid := ids.NewSession()
	shell, exec, files := "/v1/sessions/"+sid+"/shell", "/v1/sessions/"+sid+"/exec", "/v1/sessions/"+sid+"/files"
	// What each request is: a preview's, a shell's or command's, a
	// file's, or neither.
	paths := map[string]string{"GET /cdp/tok/json/version": "preview", "GET /cdp": "preview", "GET /cdp/devtools/browser/x": "preview", "GET /vnc/tok": "preview",
		"GET " + shell: "exec", "POST " + exec: "exec", "GET " + exec: "", "POST " + shell: "", "POST /v1/sessions/junk/exec": "",
		"GET /v1/sessions/junk/shell": "", "GET " + shell + "/x": "", "POST " + files: "", "DELETE " + files: "",
		"GET " + files + "?path=/x": "files", "PUT " + files + "?path=/x": "files", "GET /v1/sessions/junk/files": "", "GET " + files + "/x": "",
		"POST /v1/sessions/" + sid + "/actions": "actions", "POST /v1/sessions/" + sid + "/screenshot": "actions", "GET /v1/sessions/" + sid + "/actions": "",
		"POST /v1/sessions/junk/actions": "", "POST /v1/sessions/" + sid + "/snapshots": "snapshots", "GET /v1/sessions/" + sid + "/snapshots": "",
		"POST /v1/sessions/junk/snapshots": "", "POST /v1/sessions/" + sid + "/snapshots/x": "",
		"GET /v1/sessions": "", "GET /cdpx": "", "GET /vnc": "", "GET /view/tok": "preview", "GET /viewer-assets/novnc.js": "preview",
		"POST /view/tok": "", "GET /view": "", "GET /viewer": "", "GET /review/tok": ""}
	for _, on := range []Relays{{}, {Previews: true}, {Previews: true, Exec: true}, {Previews: true, Exec: true, Files: true},
		{Previews: true, Exec: true, Files: true, Actions: true}, {Previews: true, Exec: true, Files: true, Actions: true, Snapshots: true},
		{Files: true}, {Actions: true}, {Snapshots: true}, {}} {
		mu.Lock()
		relays = on
		mu.Unlock()
		// The Front keeps the leader's word a while: until a preview's
		// path and the shell's show the change (bounded), the rest
		// must agree.
		where := map[bool]string{false: "leader ", true: "relay "}
		deadline := time.Now().Add(10 * time.Second)
		actions, snapshots := "/v1/sessions/"+sid+"/actions", "/v1/sessions/"+sid+"/snapshots"
		for get("/vnc/tok") != where[on.Previews]+"/vnc/tok" || get(shell) != where[on.Exec]+shell || get(files) != where[on.Files]+files ||
			do("POST", actions) != where[on.Actions]+actions || do("POST", snapshots) != where[on.Snapshots]+snapshots {
			if time.Now().After(deadline) {
				t.Fatalf("leader relays %+v: still not shown", on)
			}
			time.Sleep(50 * time.Millisecond)
		}
		for r, kind := range paths {
			method, p, _ := strings.Cut(r, " ")
			bare, _, _ := strings.Cut(p, "?") // what the server's answer names
			want := "leader " + bare
			if kind == "preview" && on.Previews || kind == "exec" && on.Exec || kind == "files" && on.Files || kind == "actions" && on.Actions ||
				kind == "snapshots" && on.Snapshots {
				want = "relay " + bare
			}
			if got := do(method, p); got != want {
				t.Errorf("leader relays %+v: %s: %q, want %q", on, r, got, want)
			}
		}
	}
}

// TestFrontAnswersAlone: a session read (one session, or the list), a
// session's extension or delete, a preview's issue or revocation, a trail's, an artifact's or a
// session's snapshots' read, or a
// review link's request goes to the leader while one takes the connection;
// once none does (its address refuses, or none leads), the Front hands
// it to the relay, which answers it from the sessions' Pods, while
// everything else gets the Front's 503.
func TestFrontAnswersAlone(t *testing.T) {
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "leader %s %s", r.Method, r.URL.Path) }))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	addr := strings.TrimPrefix(leader.URL, "http://")
	f := NewFront(ln, func(context.Context) (string, Relays, error) {
		mu.Lock()
		defer mu.Unlock()
		return addr, Relays{}, nil
	}, slog.New(slog.DiscardHandler))
	defer f.Close()
	relay := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "relay %s %s", r.Method, r.URL.Path) })}
	go relay.Serve(f.RelayListener(func(Relays) bool { return true }))
	defer relay.Close()
	sid := ids.NewSession()
	pid := ids.NewPreview()
	cid := ids.NewCredential()
	aid := recordings.SegmentID(sid, "audit.jsonl")
	alone := [][2]string{{"POST", "/v1/sessions"}, {"POST", "/v1/sessions?wait=true"}, {"GET", "/v1/sessions"}, {"GET", "/v1/sessions?x=1"}, {"GET", "/v1/sessions/" + sid}, {"POST", "/v1/sessions/" + sid + "/previews"},
		{"DELETE", "/v1/sessions/" + sid + "/previews/" + pid}, {"GET", "/v1/sessions/" + sid + "/events"}, {"GET", "/v1/sessions/" + sid + "/artifacts"},
		{"GET", "/v1/artifacts/" + aid}, {"GET", "/review/tok"}, {"GET", "/review/tok/artifacts/" + aid},
		{"POST", "/v1/sessions/" + sid + "/extend"}, {"DELETE", "/v1/sessions/" + sid},
		{"POST", "/v1/credentials"}, {"GET", "/v1/credentials"}, {"GET", "/v1/credentials/" + cid}, {"DELETE", "/v1/credentials/" + cid},
		{"GET", "/v1/credentials/junk"}, {"GET", "/v1/sessions/" + sid + "/snapshots"},
		{"GET", "/v1/usage"}, {"POST", "/v1/profiles"}, {"GET", "/v1/profiles"}, {"GET", "/v1/profiles/prof_0123456789abcdef"}, {"GET", "/v1/profiles/junk"},
		{"DELETE", "/v1/profiles/prof_0123456789abcdef"}, {"POST", "/v1/profiles/prof_0123456789abcdef/rollback"}, {"DELETE", "/v1/profiles/junk"},
		{"GET", "/v1/runtimes"}, {"GET", "/v1/pools"}, {"GET", "/admin/v1/tenants"}, {"GET", "/admin/v1/tenants/tenant-a"}, {"GET", "/admin/v1/tenants/tenant-a/keys"}, {"GET", "/admin/v1/tenants/Not_A_Name"},
		{"POST", "/mcp"}, {"GET", "/mcp"}, {"DELETE", "/mcp"}, {"GET", "/openapi.yaml"}, {"GET", "/openapi.json"}}
	others := [][2]string{{"PUT", "/v1/sessions"}, {"POST", "/v1/sessions/"}, {"DELETE", "/v1/sessions/junk"}, {"DELETE", "/v1/sessions/" + sid + "/"}, {"GET", "/v1/sessions/junk"},
		{"POST", "/v1/sessions/" + sid + "/extend/x"}, {"POST", "/v1/sessions/junk/extend"}, {"PUT", "/v1/sessions/" + sid + "/extend"},
		{"POST", "/v1/sessions/" + sid + "/events"}, {"GET", "/v1/sessions/" + sid + "/events/x"}, {"GET", "/v1/sessions/junk/artifacts"},
		{"DELETE", "/v1/sessions/" + sid + "/artifacts"}, {"GET", "/v1/artifacts/junk"}, {"GET", "/v1/artifacts/" + aid + "/x"}, {"GET", "/v1/artifacts/"},
		{"GET", "/review/"}, {"GET", "/review//artifacts/" + aid}, {"GET", "/review/tok/"}, {"GET", "/review/tok/artifacts/junk"},
		{"GET", "/review/tok/artifacts/" + aid + "/x"}, {"GET", "/review/tok/x"}, {"POST", "/review/tok"}, {"GET", "/reviewx/tok"},
		{"GET", "/v1/sessions/junk/snapshots"}, {"GET", "/v1/sessions/" + sid + "/snapshots/x"}, {"POST", "/v1/sessions/" + sid + "/snapshots"}, {"GET", "/v1/tenants"}, {"GET", "/v1/sessionsx"},
		{"GET", "/v1/sessions/" + sid + "/"}, {"GET", "/v1/sessions/" + sid + "/previews"}, {"DELETE", "/v1/sessions/" + sid + "/previews/p-junk"}, {"DELETE", "/v1/sessions/" + sid + "/previews/" + pid + "/x"},
		{"GET", "/v1/sessions/" + sid + "/previews/" + pid},
		{"POST", "/v1/sessions/" + sid + "/previews/x"}, {"POST", "/v1/sessions/junk/previews"},
		{"DELETE", "/v1/credentials"}, {"PUT", "/v1/credentials/" + cid}, {"POST", "/v1/credentials/" + cid}, {"PUT", "/v1/credentials"},
		{"GET", "/v1/credentials/" + cid + "/x"}, {"GET", "/v1/credentials/"}, {"GET", "/v1/credentialsx"},
		{"GET", "/v1/profiles/prof_0123456789abcdef/x"}, {"DELETE", "/v1/profiles/prof_0123456789abcdef/x"}, {"DELETE", "/v1/profiles/prof_0123456789abcdef/rollback"},
		{"POST", "/v1/profiles/prof_0123456789abcdef"}, {"POST", "/v1/profiles/prof_0123456789abcdef/rollback/x"}, {"PUT", "/v1/profiles/prof_0123456789abcdef/rollback"},
		{"DELETE", "/v1/profiles/"}, {"POST", "/v1/profiles//rollback"},
		{"GET", "/v1/profiles/"}, {"POST", "/v1/usage"}, {"GET", "/v1/usage/x"}, {"GET", "/v1/usagex"}, {"PUT", "/v1/profiles"}, {"DELETE", "/v1/profiles"}, {"GET", "/v1/profilesx"},
		{"GET", "/v1/pools/x"}, {"POST", "/v1/pools"}, {"POST", "/v1/runtimes"}, {"GET", "/v1/runtimes/x"}, {"POST", "/admin/v1/tenants"}, {"PATCH", "/admin/v1/tenants/tenant-a"},
		{"POST", "/admin/v1/tenants/tenant-a/keys"}, {"DELETE", "/admin/v1/tenants/tenant-a/keys/k-0123"}, {"GET", "/admin/v1/tenants/tenant-a/keys/k-0123"},
		{"GET", "/admin/v1/tenants/"}, {"GET", "/admin/v1/tenants/tenant-a/x"}, {"GET", "/admin/v1/tenantsx"},
		{"PUT", "/mcp"}, {"POST", "/mcp/x"}, {"POST", "/mcpx"}, {"POST", "/openapi.yaml"}, {"GET", "/openapi"}, {"GET", "/openapi.yaml/x"},
		{"POST", "/metrics"}, {"GET", "/metrics/x"}}
	// A replica's own metrics are its relay's, whoever leads.
	own := [][2]string{{"GET", "/metrics"}, {"GET", "/metrics?x=1"}}
	check := func(where string) {
		t.Helper()
		for _, r := range alone {
			bare, _, _ := strings.Cut(r[1], "?")
			if st, got := frontCall(t, ln, r[0], r[1]); st != 200 || got != where+" "+r[0]+" "+bare {
				t.Errorf("%s %s: %d %q, want %s's answer", r[0], r[1], st, got, where)
			}
		}
		for _, r := range own {
			bare, _, _ := strings.Cut(r[1], "?")
			if st, got := frontCall(t, ln, r[0], r[1]); st != 200 || got != "relay "+r[0]+" "+bare {
				t.Errorf("%s %s: %d %q, want the relay's answer", r[0], r[1], st, got)
			}
		}
		for _, r := range others {
			st, got := frontCall(t, ln, r[0], r[1])
			if where == "leader" && got != "leader "+r[0]+" "+r[1] || where != "leader" && (st != 503 || strings.Contains(got, "relay")) {
				t.Errorf("%s %s: %d %q", r[0], r[1], st, got)
			}
		}
	}
	check("leader")
	leader.Close() // its address refuses now
	check("relay")
	mu.Lock()
	addr = "" // nobody leads
	mu.Unlock()
	check("relay") // (the refused address was dropped from the Front's cache)
	// Taking over, its metrics are neither the relay's nor yet the
	// gateway's: 503.
	f.TakingOver()
	if st, got := frontCall(t, ln, "GET", "/metrics"); st != 503 || !strings.Contains(got, "metrics are not served") {
		t.Errorf("GET /metrics taking over: %d %q, want 503", st, got)
	}
}

// frontCall sends a request with no body to the Front listening on ln,
// on a connection of its own, and reads the whole answer.
func frontCall(t *testing.T, ln net.Listener, method, path string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	req, _ := http.NewRequest(method, "http://"+ln.Addr().String()+path, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRequestTarget: a request line is split as the gateway's server
// splits it (the method to the first space, the target to the last), so
// that the Front routes what the gateway would serve.
func TestRequestTarget(t *testing.T) {
	for line, want := range map[string]string{
		"GET /v1/sessions HTTP/1.1\r\n":             "GET /v1/sessions",
		"POST /v1/sessions/s-1/exec?x=1 HTTP/1.1\n": "POST /v1/sessions/s-1/exec",
		"GET /a\u00a0b HTTP/1.1\r\n":                "GET /a\u00a0b",
		"GET /a b HTTP/1.1\r\n":                     "GET /a b",
		"GET /\r\n":                                 " ",
		"\r\n":                                      " ",
		"GET  HTTP/1.1\r\n":                         " ",
	} {
		m, p := requestTarget([]byte(line))
		if got := m + " " + p; got != want {
			t.Errorf("requestTarget(%q) = %q, want %q", line, got, want)
		}
	}
}

// TestReplayConnPeek: a connection the Front hands over (replayConn,
// under the relay's eofConn) shows its socket, so that a handler can
// tell its client hung up (watchPeer): not while the client is there,
// once it has gone. The control: a connection with no socket (a pipe)
// cannot be looked at.
func TestReplayConnPeek(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	handed := &eofConn{Conn: &replayConn{Conn: server, r: strings.NewReader("GET / HTTP/1.1\r\n")}}
	if peerGone(handed) {
		t.Fatal("a handed-over connection whose client is there reads as gone")
	}
	client.Close()
	deadline := time.Now().Add(5 * time.Second)
	for !peerGone(handed) {
		if time.Now().After(deadline) {
			t.Fatal("a handed-over connection whose client hung up does not read as gone")
		}
		time.Sleep(10 * time.Millisecond)
	}
	a, b := net.Pipe()
	defer a.Close()
	b.Close()
	if _, err := peekNow(&eofConn{Conn: &replayConn{Conn: a, r: strings.NewReader("")}}); err == nil {
		t.Fatal("a pipe's connection was looked at")
	}
}
