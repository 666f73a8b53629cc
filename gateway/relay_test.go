package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	fws "github.com/fasthttp/websocket"
	"github.com/gofiber/fiber/v2"
	"github.com/golang-jwt/jwt/v5"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/tenant"
)

// TestRelayAuth: the leader's relay routes take only requests signed
// with one of the gateway's keys, over this path and body, within a
// minute of now (a report once); anything else is a 404, as a route
// that is not there.
// A signed admission with a bad token is a 401, and a signed report
// names a connection with a bad token to be ended. (The relay carrying
// real connections is TestKubeRelay's.)
func TestRelayAuth(t *testing.T) {
	s := newTestServer(t)
	post := func(path string, body []byte, header string) (int, string) {
		t.Helper()
		req := httptest.NewRequest("POST", path, bytes.NewReader(body))
		req.Host = "gw.test:8080"
		req.Header.Set("Content-Type", "application/json")
		if header != "" {
			req.Header.Set(relayHeader, header)
		}
		resp, err := s.App().Test(req, 10000)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	admit, _ := json.Marshal(relayAdmitRequest{Token: "not-a-token"})
	sync, _ := json.Marshal(relaySyncRequest{Relay: "r1", Conns: []relayConnState{{ID: "c1", Token: "not-a-token"}}})
	now := time.Now()
	other := map[string][]byte{"k1": []byte(strings.Repeat("b", 32))}
	sign := func(keys map[string][]byte, at time.Time, path string, body []byte) string {
		return relaySign(keys, "k1", at, randomNonce(), path, body)
	}
	for _, c := range []struct {
		name, path string
		body       []byte
		header     string
		status     int
	}{
		{"unsigned", relayAdmitPath, admit, "", 404},
		{"another key", relayAdmitPath, admit, sign(other, now, relayAdmitPath, admit), 404},
		{"an unknown key id", relayAdmitPath, admit, "k9" + sign(s.tokens.keys, now, relayAdmitPath, admit)[2:], 404},
		{"too old", relayAdmitPath, admit, sign(s.tokens.keys, now.Add(-2*time.Minute), relayAdmitPath, admit), 404},
		{"from the future", relayAdmitPath, admit, sign(s.tokens.keys, now.Add(2*time.Minute), relayAdmitPath, admit), 404},
		{"another path", relaySyncPath, admit, sign(s.tokens.keys, now, relayAdmitPath, admit), 404},
		{"another body", relayAdmitPath, []byte(`{"token":"other"}`), sign(s.tokens.keys, now, relayAdmitPath, admit), 404},
		{"garbage", relayAdmitPath, admit, "k1 x y", 404},
		// Signed (the control): the token is what is wrong.
		{"signed, a bad token", relayAdmitPath, admit, sign(s.tokens.keys, now, relayAdmitPath, admit), 401},
		{"signed, not JSON", relayAdmitPath, []byte("{"), sign(s.tokens.keys, now, relayAdmitPath, []byte("{")), 400},
	} {
		if st, body := post(c.path, c.body, c.header); st != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, st, body, c.status)
		}
	}
	st, body := post(relaySyncPath, sync, sign(s.tokens.keys, now, relaySyncPath, sync))
	var ans relaySyncAnswer
	if err := json.Unmarshal([]byte(body), &ans); st != 200 || err != nil || len(ans.Close) != 1 || ans.Close[0].ID != "c1" {
		t.Errorf("a signed report of a connection with a bad token: %d %s, want it named to end", st, body)
	}
	// A shell's admission: the leader's tenants judge the key; a
	// refusal is an answer.
	for key, want := range map[string]string{"nope": `"status":401`, "good-key": `"status":404`} {
		shell, _ := json.Marshal(relayAdmitRequest{Shell: &relayShellRequest{Session: "not-an-id", Key: key}})
		if st, body := post(relayAdmitPath, shell, sign(s.tokens.keys, now, relayAdmitPath, shell)); st != 200 || !strings.Contains(body, want) || strings.Contains(body, "ticket") {
			t.Errorf("a shell's admission: %d %s, want a refusal with %s", st, body, want)
		}
	}
	// A report is taken once: replayed, it is refused.
	replayed := sign(s.tokens.keys, now, relaySyncPath, sync)
	if st, body := post(relaySyncPath, sync, replayed); st != 200 {
		t.Errorf("a signed report, first: %d %s", st, body)
	}
	if st, body := post(relaySyncPath, sync, replayed); st != 404 {
		t.Errorf("the same signed report again: %d %s, want 404", st, body)
	}
}

// TestRelayLive: the relay's side against a stand-in leader (the
// leader's side is TestRelayAuth's, and both together TestKubeRelay's).
// A token the relay can read and finds bad never reaches the leader; a
// good one is the leader's to admit; a connection the leader
// names is closed; events go with the reports and are not sent twice
// (a change's at once, with the ask to store the trail);
// a leader that refuses the relay's signature makes it unusable for a
// while.
func TestRelayLive(t *testing.T) {
	var mu sync.Mutex
	var admits, syncs, biggest int
	var closeID string
	var got []relayEvent
	var durables []string
	refuse, loseAnswer, received := false, false, 0
	var runs relayRuns // as the leader's relaySync records events
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if refuse || r.Header.Get(relayHeader) == "" {
			w.WriteHeader(404)
			return
		}
		switch r.URL.Path {
		case relayAdmitPath:
			admits++
			json.NewEncoder(w).Encode(relayAdmitAnswer{CDP: "10.0.0.9:9222", VNC: "10.0.0.9:5900", Session: "s-1", Tenant: "t", Scope: ScopeCDP, Preview: "p-1", Expires: time.Now().Add(time.Hour).Unix()})
		case relaySyncPath:
			syncs++
			biggest = max(biggest, len(body))
			var req relaySyncRequest
			json.Unmarshal(body, &req)
			received += len(req.Events)
			runs.record(req, time.Now(), func(ev relayEvent) { got = append(got, ev) })
			durables = append(durables, req.Durable...)
			if loseAnswer {
				w.WriteHeader(500)
				return
			}
			var ans relaySyncAnswer
			for _, c := range req.Conns {
				if c.ID == closeID {
					ans.Close = append(ans.Close, relayClose{ID: c.ID, Reason: "preview revoked or session ended"})
				}
			}
			json.NewEncoder(w).Encode(ans)
		}
	}))
	defer leader.Close()
	srv := testRelay(t, leader.URL, nil)
	l := srv.live.(*relayLive)
	count := func() (int, int) { mu.Lock(); defer mu.Unlock(); return admits, syncs }

	// Junk, and a token of this relay's key whose signature is wrong:
	// refused here.
	good, _ := srv.tokens.issue(previewClaims{Session: "s-1", Tenant: "t", Scope: ScopeCDP, RegisteredClaims: jwt.RegisteredClaims{ID: "p-1", ExpiresAt: jwtTime(time.Now().Add(time.Hour))}})
	for _, tok := range []string{"junk", good[:len(good)-4] + "AAAA"} {
		if _, _, _, err := l.admit(tok); err == nil {
			t.Errorf("admit(%q) passed", tok)
		}
	}
	if a, _ := count(); a != 0 {
		t.Fatalf("bad tokens reached the leader: %d admissions", a)
	}
	// A good one is the leader's to admit, each time (a revocation
	// holds at once).
	c, ep, _, err := l.admit(good)
	if err != nil || c.Session != "s-1" || c.ID != "p-1" || ep.CDP.String() != "10.0.0.9:9222" {
		t.Fatalf("admit(good): %+v %v %v", c, ep, err)
	}
	if a, _ := count(); a != 1 {
		t.Errorf("an admission asked the leader %d times, want 1", a)
	}

	// Two connections; the leader names one to close.
	closed := make(chan string, 2)
	rel1, err1 := l.track(c, closerFunc(func() error { closed <- "one"; return nil }))
	rel2, err2 := l.track(c, closerFunc(func() error { closed <- "two"; return nil }))
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	defer rel1()
	defer rel2()
	l.mu.Lock()
	for id, rc := range l.conns {
		if rc.closer != nil {
			mu.Lock()
			closeID = id
			mu.Unlock()
			break
		}
	}
	l.mu.Unlock()
	l.record(c, "preview_connected", map[string]any{"preview": "p-1", "scope": ScopeCDP})
	l.sync()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection the leader named was not closed")
	}
	select {
	case which := <-closed:
		t.Errorf("both connections were closed (%s too)", which)
	case <-time.After(100 * time.Millisecond):
	}
	l.sync()
	mu.Lock()
	n := len(got)
	mu.Unlock()
	if n != 1 || got[0].Type != "preview_connected" {
		t.Errorf("the leader got events %+v, want one preview_connected, once", got)
	}

	// Commands' events: each argv bounded, each report bounded by
	// size; all arrive, once, in order.
	mu.Lock()
	got = nil
	mu.Unlock()
	big := strings.Repeat("<", 1<<20) // six bytes each in JSON
	for i := range 40 {
		l.record(c, "exec", map[string]any{"argv": []string{"sh", "-c", big}, "user": "sandgate", "exit_code": i, "duration_ms": int64(5),
			"stdout_bytes": int64(7), "env_names": []string{}})
	}
	for range 10 { // each sync sends a few reports
		l.sync()
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 40 {
			break
		}
	}
	mu.Lock()
	if len(got) != 40 {
		t.Errorf("the leader got %d exec events, want 40", len(got))
	}
	for i, ev := range got {
		n := 0
		for _, a := range ev.Argv {
			n += len(a)
		}
		if ev.Type != "exec" || ev.ExitCode != i || !ev.ArgvTruncated || n > relayArgvBytes || ev.Argv[0] != "sh" || ev.StdoutBytes != 7 {
			t.Errorf("exec event %d: %s, exit %d, truncated %v, %d bytes of argv", i, ev.Type, ev.ExitCode, ev.ArgvTruncated, n)
			break
		}
	}
	if biggest > relayReportMax {
		t.Errorf("a report of %d bytes, over relayReportMax", biggest)
	}
	mu.Unlock()

	// Files', actions' and screenshots' events go with the next report
	// (the control); a request that changed its session (changed)
	// reports at once what was kept, with the ask to store the
	// session's trail (the leader answers once it is stored, and the
	// client is answered then).
	mu.Lock()
	got = nil
	mu.Unlock()
	sum := strings.Repeat("ab", 32)
	l.record(c, "file_download", downloadFields("/home/sandgate/d", "dir", 10240))
	l.record(c, "file_upload", uploadFields("/home/sandgate/u.txt", 12, sum))
	mu.Lock()
	if len(got) != 0 || len(durables) != 0 {
		t.Errorf("events reported before the request said it changed its session: %+v %v", got, durables)
	}
	mu.Unlock()
	l.changed(c)
	mu.Lock()
	if len(got) != 2 || got[0].Type != "file_download" || got[0].Kind != "dir" || got[0].Bytes != 10240 ||
		got[1].Type != "file_upload" || got[1].Path != "/home/sandgate/u.txt" || got[1].Bytes != 12 || got[1].SHA256 != sum {
		t.Errorf("once the upload changed its session the leader has %+v, want the download's event and the upload's", got)
	}
	if len(durables) != 1 || durables[0] != c.raw {
		t.Errorf("the leader was asked to store %v, want the session's trail once", durables)
	}
	got = nil
	mu.Unlock()
	l.record(c, "action", map[string]any{"action": "left_click"})
	l.record(c, "screenshot", screenshotFields(recordings.Artifact{ID: "s-1.0123456789abcdef", Size: 99, SHA256: sum}))
	l.record(c, "snapshot_saved", snapshotFields(recordings.Artifact{ID: "s-1.fedcba9876543210", Size: 4096, SHA256: sum}, 3, true, 42))
	l.sync()
	mu.Lock()
	if len(got) != 3 || got[0].Type != "action" || got[0].Action != "left_click" ||
		got[1].Type != "screenshot" || got[1].Artifact != "s-1.0123456789abcdef" || got[1].Bytes != 99 || got[1].SHA256 != sum ||
		got[2].Type != "snapshot_saved" || got[2].Artifact != "s-1.fedcba9876543210" || got[2].Bytes != 4096 || got[2].SHA256 != sum ||
		got[2].Files != 3 || !got[2].Changed || got[2].DurationMS != 42 {
		t.Errorf("the leader has %+v, want the action's event, the screenshot's and the snapshot's", got)
	}
	if len(durables) != 1 {
		t.Errorf("a report of no change asked to store the trail: %v", durables)
	}
	mu.Unlock()

	// A report whose answer is lost, its events recorded, is sent
	// again with what came since: the leader gets the events twice and
	// records them once (relayRuns), in order.
	mu.Lock()
	got, received, loseAnswer = nil, 0, true
	mu.Unlock()
	l.record(c, "action", map[string]any{"action": "left_click"})
	l.record(c, "action", map[string]any{"action": "double_click"})
	l.sync()
	mu.Lock()
	loseAnswer = false
	mu.Unlock()
	l.record(c, "action", map[string]any{"action": "right_click"})
	l.sync()
	mu.Lock()
	var names []string
	for _, ev := range got {
		names = append(names, ev.Action)
	}
	if received != 5 || strings.Join(names, " ") != "left_click double_click right_click" {
		t.Errorf("after a lost answer the leader received %d events and recorded %v; want 5 received (2 again), 3 recorded in order", received, names)
	}
	mu.Unlock()

	// A leader that refuses the signature: not usable for a while.
	if !srv.RelayUsable(Relays{Previews: true}) {
		t.Fatal("unusable before any refusal")
	}
	if srv.RelayUsable(Relays{Actions: true}) {
		t.Error("usable for actions and screenshots without a store to keep the screenshots in")
	}
	if srv.RelayUsable(Relays{Snapshots: true}) {
		t.Error("usable for snapshots without a store to keep them in")
	}
	mu.Lock()
	refuse = true
	mu.Unlock()
	other, _ := srv.tokens.issue(previewClaims{Session: "s-2", Tenant: "t", Scope: ScopeCDP, RegisteredClaims: jwt.RegisteredClaims{ID: "p-2", ExpiresAt: jwtTime(time.Now().Add(time.Hour))}})
	if _, _, _, err := l.admit(other); err == nil {
		t.Error("admitted while the leader refuses")
	}
	if srv.RelayUsable(Relays{Previews: true}) {
		t.Error("still usable after the leader refused its signature")
	}
	// A change with a leader that does not take reports: the request
	// is not held past relayFlushWithin; its event and the ask to store
	// the trail stay for the next report.
	l.record(c, "file_upload", uploadFields("/home/sandgate/v.txt", 1, sum))
	t0 := time.Now()
	l.changed(c)
	if took := time.Since(t0); took > relayFlushWithin {
		t.Errorf("a change waited %v for a leader that refuses reports", took)
	}
	l.mu.Lock()
	kept := len(l.events) > 0 && l.events[len(l.events)-1].Path == "/home/sandgate/v.txt" && l.durable[c.Session] == c.raw
	l.mu.Unlock()
	if !kept {
		t.Error("the upload's event, or the ask to store the trail, was not kept for the next report")
	}
}

// TestRelayShellAdmission: a relay asks the leader about each shell by
// the client's API key, and tells its client what the leader would
// have (its refusal, bounded: a status that is no error, or an answer
// for another session, is a 503); a request with no key never reaches
// the leader. (A shell carried for real is TestKubeRelay's.)
func TestRelayShellAdmission(t *testing.T) {
	sid, other := ids.NewSession(), ids.NewSession()
	var srv *Server
	var err error
	var mu sync.Mutex
	var asked []relayShellRequest
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req relayAdmitRequest
		json.NewDecoder(r.Body).Decode(&req)
		if r.URL.Path != relayAdmitPath || req.Shell == nil {
			w.WriteHeader(400)
			return
		}
		mu.Lock()
		asked = append(asked, *req.Shell)
		mu.Unlock()
		ticket := func(id string) string {
			c := shellClaims("t", id, "")
			c.ExpiresAt = jwtTime(time.Now().Add(time.Hour))
			tok, _ := srv.tokens.issue(*c)
			return tok
		}
		ok := relayAdmitAnswer{Session: req.Shell.Session, Tenant: "t", Scope: scopeShell, Preview: shellPreview, Ticket: ticket(req.Shell.Session)}
		switch req.Shell.Key {
		case "good":
		case "quota-said":
			ok.Quota, ok.MaxArtifactBytes = true, 5
		case "wrong-session":
			ok.Session = other
		case "wrong-ticket":
			ok.Ticket = ticket(other)
		case "junk-ticket":
			ok.Ticket = "junk"
		case "no-ticket":
			ok.Ticket = ""
		case "odd-status":
			ok = relayAdmitAnswer{Refused: &relayRefusal{Status: 200, Code: "ok", Message: "fine"}}
		default:
			ok = relayAdmitAnswer{Refused: &relayRefusal{Status: 404, Code: "not_found", Message: "no such session"}}
		}
		json.NewEncoder(w).Encode(ok)
	}))
	defer leader.Close()
	started := make(chan string, 1)
	srv = testRelay(t, leader.URL, func(id string) session.Sandbox { return failingSandbox{id: id, started: started} })
	shell := func(key string) (int, string) {
		t.Helper()
		req := httptest.NewRequest("GET", "http://gw.test:8080/v1/sessions/"+sid+"/shell", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		return answerOf(t, srv, req)
	}
	for key, want := range map[string]int{"": 401, "missing": 404, "wrong-session": 503, "wrong-ticket": 503, "junk-ticket": 503, "no-ticket": 503, "odd-status": 503} {
		if st, body := shell(key); st != want {
			t.Errorf("a shell with key %q: %d %s, want %d", key, st, body, want)
		}
	}
	// A snapshot the leader's admission says no quota of (a leader of
	// the version before) waits for one that does (503, to retry); the
	// control, with the quota said, goes on to the store (none here).
	for key, want := range map[string]string{"good": "does not say the tenant's quota", "quota-said": "the artifact store is unavailable"} {
		req := httptest.NewRequest("POST", "http://gw.test:8080/v1/sessions/"+sid+"/snapshots", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := srv.App().Test(req, 10000)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || !strings.Contains(string(body), want) || key == "good" && resp.Header.Get("Retry-After") == "" {
			t.Errorf("a snapshot with key %q: %d %s (Retry-After %q), want 503 saying %q", key, resp.StatusCode, body, resp.Header.Get("Retry-After"), want)
		}
	}
	// Without an upgrade: the key is asked for and checked (the leader
	// is asked) first, as the leader checks it.
	for key, want := range map[string]int{"": 401, "good": 400} {
		req := httptest.NewRequest("GET", "http://gw.test:8080/v1/sessions/"+sid+"/shell", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := srv.App().Test(req, 10000)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != want {
			t.Errorf("a shell with key %q and no upgrade: %d, want %d", key, resp.StatusCode, want)
		}
	}
	mu.Lock()
	n := len(asked)
	for _, a := range asked {
		if a.Session != sid || a.Key == "" {
			t.Errorf("the leader was asked %+v", a)
		}
	}
	mu.Unlock()
	if n != 9 {
		t.Errorf("the leader was asked %d times, want 9 (never without a key)", n)
	}
	// The positive control: a good key is upgraded, and the shell is
	// started in the session the leader named, with the ticket for
	// the reports.
	// (Served for real: the upgraded connection is the handler's.)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.App().Listener(ln)
	defer srv.App().Shutdown()
	ws, resp, err := fws.DefaultDialer.Dial("ws://"+ln.Addr().String()+"/v1/sessions/"+sid+"/shell",
		http.Header{"Authorization": {"Bearer good"}, "Host": {"gw.test:8080"}})
	if err != nil {
		st := 0
		if resp != nil {
			st = resp.StatusCode
		}
		t.Fatalf("a shell with a good key: %d %v, want 101", st, err)
	}
	defer ws.Close()
	select {
	case id := <-started:
		if id != sid {
			t.Errorf("the shell started in %s, want %s", id, sid)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the admitted shell was not started")
	}
}

// failingSandbox reports the start of a command and fails it.
type failingSandbox struct {
	session.Sandbox
	id      string
	started chan string
}

func (f failingSandbox) Exec(context.Context, session.ExecSpec, []string) (session.ExecProc, error) {
	f.started <- f.id
	return nil, errors.New("no sandbox in a unit test")
}

// TestBoundArgv: a command cut to its bound keeps whole arguments, cuts
// the one that does not fit at a character's start, and adds no empty
// one.
func TestBoundArgv(t *testing.T) {
	for _, c := range []struct {
		argv []string
		n    int
		want []string
		cut  bool
	}{
		{[]string{"sh", "-c", "true"}, 100, []string{"sh", "-c", "true"}, false},
		{[]string{"aaaa", "rm", "-rf"}, 4, []string{"aaaa"}, true},
		{[]string{"ab", "cdef"}, 4, []string{"ab", "cd"}, true},
		{[]string{"é", "x"}, 1, []string{}, true},
		{[]string{"aé"}, 2, []string{"a"}, true},
		{nil, 10, []string{}, false},
	} {
		got, cut := boundArgv(c.argv, c.n)
		if fmt.Sprint(got) != fmt.Sprint(c.want) || len(got) != len(c.want) || cut != c.cut {
			t.Errorf("boundArgv(%q, %d) = %q %v, want %q %v", c.argv, c.n, got, cut, c.want, c.cut)
		}
	}
}

// TestRelayRuns: a run's report sent again has the events the leader
// recorded skipped, another run's and a run-less report's none; a run's
// reports are taken one at a time.
func TestRelayRuns(t *testing.T) {
	var r relayRuns
	now := time.Now()
	for _, tc := range []struct {
		run         string
		first, n    int
		skip        int
		description string
	}{
		{"a", 0, 3, 0, "a run's first report"},
		{"a", 0, 3, 3, "the same report again"},
		{"a", 2, 4, 1, "a report from within the last"},
		{"a", 6, 1, 0, "the next"},
		{"b", 0, 2, 0, "another run's"},
		{"", 0, 2, 0, "no run (an earlier version)"},
		{"", 0, 2, 0, "no run, again"},
	} {
		skip, done := r.take("relay-1", tc.run, tc.first, now)
		done(tc.n)
		if skip != tc.skip {
			t.Errorf("%s: skip %d, want %d", tc.description, skip, tc.skip)
		}
	}
	skip, done := r.take("relay-2", "a", 0, now)
	done(0)
	if skip != 0 {
		t.Errorf("another relay's run of the same name: skip %d", skip)
	}

	_, done = r.take("relay-1", "a", 7, now)
	second := make(chan int)
	go func() {
		skip, done := r.take("relay-1", "a", 7, now)
		done(1)
		second <- skip
	}()
	select {
	case <-second:
		t.Fatal("a run's second report was taken while the first was recorded")
	case <-time.After(100 * time.Millisecond):
	}
	done(1)
	select {
	case skip := <-second:
		if skip != 1 {
			t.Errorf("the second report, the same as the first: skip %d, want 1", skip)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a run's second report was not taken once the first was done")
	}

	for i := range maxRelayRuns + 10 {
		_, done := r.take("relay-1", fmt.Sprint("run-", i), 0, now.Add(time.Duration(i)))
		done(1)
	}
	r.mu.Lock()
	n := len(r.m)
	r.mu.Unlock()
	if n > maxRelayRuns {
		t.Errorf("%d runs remembered, over %d", n, maxRelayRuns)
	}
}

// TestRelayFillCredential: a relay passes fill_credential to the leader
// whole (the vault is the leader's), key and body, and answers its
// answer, asking no admission of its own; another action is admitted
// first (the control), as it runs here.
func TestRelayFillCredential(t *testing.T) {
	sid := ids.NewSession()
	var mu sync.Mutex
	var admits, passed int
	var got struct{ auth, body string }
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case relayAdmitPath:
			admits++
			json.NewEncoder(w).Encode(relayAdmitAnswer{Refused: &relayRefusal{Status: 404, Code: "not_found", Message: "no such session"}})
		case "/v1/sessions/" + sid + "/actions":
			passed++
			got.auth, got.body = r.Header.Get("Authorization"), string(body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(409)
			w.Write([]byte(`{"error":{"code":"conflict","message":"fill_credential needs a browser session"}}`))
		default:
			w.WriteHeader(400)
		}
	}))
	defer leader.Close()
	srv := testRelay(t, leader.URL, func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} })
	action := func(body string) (int, string) {
		t.Helper()
		req := httptest.NewRequest("POST", "http://gw.test:8080/v1/sessions/"+sid+"/actions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer some-key")
		req.Header.Set("Content-Type", "application/json")
		resp, err := srv.App().Test(req, 10000)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	fill := `{"action":"fill_credential","credential":"cred-0123456789abcdef","selector":"#password"}`
	if st, body := action(fill); st != 409 || !strings.Contains(body, "needs a browser session") {
		t.Errorf("fill_credential through the relay: %d %s, want the leader's 409", st, body)
	}
	mu.Lock()
	if passed != 1 || admits != 0 || got.auth != "Bearer some-key" || got.body != fill {
		t.Errorf("the leader was passed %d requests (%q, %q) and asked %d admissions; want the one request whole, no admission", passed, got.auth, got.body, admits)
	}
	mu.Unlock()
	// A coded body is refused here, never unpacked nor passed on.
	req := httptest.NewRequest("POST", "http://gw.test:8080/v1/sessions/"+sid+"/actions", strings.NewReader(fill))
	req.Header.Set("Authorization", "Bearer some-key")
	req.Header.Set("Content-Encoding", "gzip")
	if resp, err := srv.App().Test(req, 10000); err != nil || resp.StatusCode != 415 {
		t.Errorf("a gzip-coded fill_credential through the relay: %v %v, want 415", resp.StatusCode, err)
	}
	mu.Lock()
	if passed != 1 {
		t.Errorf("a coded body was passed to the leader")
	}
	mu.Unlock()
	if st, body := action(`{"action":"mouse_move","coordinate":[1,2]}`); st != 404 {
		t.Errorf("mouse_move through the relay: %d %s, want the leader's admission's 404", st, body)
	}
	mu.Lock()
	if passed != 1 || admits != 1 {
		t.Errorf("after a mouse_move: %d passed, %d admissions; want 1 and 1", passed, admits)
	}
	mu.Unlock()
}

// testRelay is a relay (no artifact store) whose leader is the
// stand-in at leaderURL; sandbox as NewRelay's.
func testRelay(t *testing.T, leaderURL string, sandbox func(id string) session.Sandbox) *Server {
	t.Helper()
	u, _ := url.Parse("http://gw.test:8080")
	srv, err := NewRelay(Config{PublicURL: u, TokenKeys: map[string]string{"k1": strings.Repeat("a", 32)}, ActiveKey: "k1"}, "relay-1",
		func(context.Context) (string, error) { return strings.TrimPrefix(leaderURL, "http://"), nil }, sandbox, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// TestRelayAlone: while the leader answers, a relay takes its word on a
// shell (here, a refusal); once no leader answers, it admits by its
// copies (RelayAlone) as the leader would: an unknown key 401, a
// disabled tenant's 403, a copy out of date 503, another tenant's
// session, none, a pooled Pod's or an unreadable record 404, a session
// whose Pod does not run or that expired 409; and a good key gets a
// ticket signed with the gateway's keys that lasts as the leader's
// would, with the tenant's limits. A preview's connection is admitted
// the same way, by the copy of the revocations; the copies are read
// again once, as it begins to admit alone.
func TestRelayAlone(t *testing.T) {
	sid := ids.NewSession()
	now := time.Now().UTC()
	rec := func(id, tenantName string, expires time.Time) map[string]string {
		return map[string]string{"sandgate.session": id, session.RecordTenant: tenantName, "sandgate.created": now.Add(-time.Minute).Format(time.RFC3339Nano),
			session.RecordExpires: expires.Format(time.RFC3339Nano), session.RecordAddr: "10.1.2.3",
			"sandgate.info": `{"kind":"desktop","runtime":"runc","screen":{"width":800,"height":600}}`, "sandgate.state": "running"}
	}
	type seen struct {
		r       map[string]string
		running bool
		err     error
	}
	sessions := map[string]seen{
		sid: {rec(sid, "t", now.Add(10*time.Minute)), true, nil},
	}
	ids4 := map[string]string{}
	for _, name := range []string{"other", "stopped", "expired", "pooled", "garbled", "gone", "unreadable", "starting", "stopping", "misnamed"} {
		ids4[name] = ids.NewSession()
	}
	sessions[ids4["other"]] = seen{rec(ids4["other"], "u", now.Add(time.Hour)), true, nil}
	sessions[ids4["stopped"]] = seen{rec(ids4["stopped"], "t", now.Add(time.Hour)), false, nil}
	sessions[ids4["expired"]] = seen{rec(ids4["expired"], "t", now.Add(-time.Second)), true, nil}
	pooled := rec(ids4["pooled"], "t", now.Add(time.Hour))
	pooled["sandgate.pool"] = "desktop-runc"
	sessions[ids4["pooled"]] = seen{pooled, true, nil}
	garbled := rec(ids4["garbled"], "t", now.Add(time.Hour))
	garbled["sandgate.info"] = "{"
	sessions[ids4["garbled"]] = seen{garbled, true, nil}
	sessions[ids4["gone"]] = seen{nil, false, fmt.Errorf("%w: no Pod", session.ErrSandboxGone)}
	sessions[ids4["unreadable"]] = seen{nil, false, errors.New("the API server does not answer")}
	starting := rec(ids4["starting"], "t", now.Add(time.Hour))
	starting["sandgate.state"] = "starting" // not ready yet
	sessions[ids4["starting"]] = seen{starting, true, nil}
	stopping := rec(ids4["stopping"], "t", now.Add(time.Hour))
	stopping["sandgate.state"] = "stopping" // its profile being saved
	sessions[ids4["stopping"]] = seen{stopping, true, nil}
	sessions[ids4["misnamed"]] = seen{rec(sid, "t", now.Add(time.Hour)), true, nil}

	revokedPreview, stalePreview := ids.NewPreview(), ids.NewPreview()
	var asked, refreshed atomic.Int32
	var fresh atomic.Int64
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		json.NewEncoder(w).Encode(relayAdmitAnswer{Refused: &relayRefusal{Status: 404, Code: "not_found", Message: "the leader's no"}})
	}))
	started := make(chan string, 4)
	srv := testRelay(t, leader.URL, func(id string) session.Sandbox { return failingSandbox{id: id, started: started} })
	srv.AdmitAlone(RelayAlone{
		Tenant: testTenants(session.TenantLimits{MaxTTL: 2 * time.Hour, AllowRoot: true, MaxFileBytes: 7, MaxArtifactBytes: 9}),
		Session: func(_ context.Context, id string) (map[string]string, bool, error) {
			if s, ok := sessions[id]; ok {
				return s.r, s.running, s.err
			}
			return nil, false, session.ErrSandboxGone
		},
		Enabled: func(name string) error {
			switch name {
			case "t":
				return nil
			case "off":
				return tenant.ErrDisabled
			case "stale":
				return tenant.ErrStale
			}
			return tenant.ErrNotFound
		},
		// The copies: read again once as it begins to admit alone, but
		// that read fails (fresh stays before the silence) until the
		// test says it was read.
		Refresh: func(context.Context) { refreshed.Add(1) },
		Fresh:   func() time.Time { return time.Unix(0, fresh.Load()) },
		Revoked: func(_, preview string) (bool, error) {
			switch preview {
			case revokedPreview:
				return true, nil
			case stalePreview:
				return false, recordings.ErrStale
			}
			return false, nil
		},
	})
	// A command: an admitted one is started in the sandbox (which
	// fails it: started says it was admitted).
	command := func(id, key string) (int, string) {
		t.Helper()
		req := httptest.NewRequest("POST", "http://gw.test:8080/v1/sessions/"+id+"/exec", strings.NewReader(`{"cmd":["true"]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		return answerOf(t, srv, req)
	}
	// The leader answers: its word, even for a key the copy takes.
	if st, body := command(sid, "good"); st != 404 || !strings.Contains(body, "the leader's no") || asked.Load() != 1 {
		t.Fatalf("with a leader that answers: %d %s (asked %d), want its 404", st, body, asked.Load())
	}
	leader.Close()
	// The copies were not read since the leader went silent: a 503,
	// not an admission by what they held before.
	if st, body := command(sid, "good"); st != 503 || refreshed.Load() != 1 {
		t.Fatalf("no leader, copies not read since: %d %s (refreshed %d), want 503", st, body, refreshed.Load())
	}
	fresh.Store(time.Now().UnixNano()) // read (the copies' own loop)
	cases := []struct {
		id, key string
		want    int
	}{
		{sid, "good", 500}, {sid, "junk", 401}, {sid, "off", 403}, {sid, "stale", 503},
		{ids4["other"], "good", 404}, {ids4["gone"], "good", 404}, {ids4["pooled"], "good", 404}, {ids4["garbled"], "good", 404},
		{ids4["stopped"], "good", 409}, {ids4["expired"], "good", 409}, {ids4["unreadable"], "good", 503}, {"not-a-session", "good", 404},
		{ids4["starting"], "good", 503}, {ids4["stopping"], "good", 409}, {ids4["misnamed"], "good", 404},
	}
	for _, tc := range cases {
		if st, body := command(tc.id, tc.key); st != tc.want {
			t.Errorf("no leader, key %q, session %s: %d %s, want %d", tc.key, tc.id, st, body, tc.want)
		}
	}
	// (The 500 is the stand-in sandbox's failure: the command was
	// admitted and started, in that session alone.)
	select {
	case id := <-started:
		if id != sid || len(started) != 0 {
			t.Errorf("started in %s (and %d more), want %s alone", id, len(started), sid)
		}
	default:
		t.Error("the admitted command was not started")
	}
	if asked.Load() != 1 {
		t.Errorf("the closed leader was asked %d times", asked.Load())
	}

	// The ticket of a good key, read with the gateway's keys.
	l := srv.live.(*relayLive)
	app := fiber.New()
	var claims *previewClaims
	var ans relayAdmitAnswer
	var aerr error
	app.Get("/", func(c *fiber.Ctx) error {
		claims, ans, aerr = l.admitAlone(c, sid, "good")
		return nil
	})
	if _, err := app.Test(httptest.NewRequest("GET", "/", nil)); err != nil || aerr != nil {
		t.Fatalf("the admission: %v %v", err, aerr)
	}
	got, err := srv.tokens.verify(ans.Ticket, time.Now())
	if err != nil || got.Session != sid || got.Tenant != "t" || got.Scope != scopeShell {
		t.Fatalf("the ticket: %+v %v", got, err)
	}
	// created a minute ago, the tenant's longest TTL two hours: the
	// ticket lasts until then, and a minute more.
	if want := now.Add(-time.Minute).Add(2 * time.Hour).Add(time.Minute); got.ExpiresAt.Time.Sub(want).Abs() > time.Second {
		t.Errorf("the ticket expires at %v, want %v", got.ExpiresAt.Time, want)
	}
	if !claims.allowRoot || claims.maxFileBytes != 7 || claims.maxArtifactBytes != 9 || !claims.quotaSaid || claims.raw != ans.Ticket || ans.Kind != session.KindDesktop ||
		ans.CDP != "10.1.2.3:9222" || ans.VNC != "10.1.2.3:5900" || ans.Screen.Width != 800 {
		t.Errorf("the admission: %+v %+v", claims, ans)
	}

	// Previews: the leader's 401 for what it would refuse, a 503 where
	// a copy cannot say; a good token admitted, where its Pod serves.
	token := func(id, tenantName, scope, preview string, ttl time.Duration) string {
		c := previewClaims{Session: id, Tenant: tenantName, Scope: scope}
		c.ID, c.ExpiresAt = preview, jwtTime(time.Now().Add(ttl))
		tok, err := srv.tokens.issue(c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	foreign := func() string { // signed with a key this replica lacks
		c := previewClaims{Session: sid, Tenant: "t", Scope: ScopeCDP}
		c.ID, c.ExpiresAt = ids.NewPreview(), jwtTime(time.Now().Add(time.Hour))
		tok := jwt.NewWithClaims(jwt.SigningMethodHS256, c)
		tok.Header["kid"] = "k2"
		raw, _ := tok.SignedString([]byte(strings.Repeat("b", 32)))
		return raw
	}()
	previews := []struct {
		name, token string
		want        int
	}{
		{"good", token(sid, "t", ScopeCDP, ids.NewPreview(), time.Hour), 0},
		{"revoked", token(sid, "t", ScopeCDP, revokedPreview, time.Hour), 401},
		{"expired", token(sid, "t", ScopeCDP, ids.NewPreview(), -time.Minute), 401},
		{"a shell's ticket", ans.Ticket, 401},
		{"a disabled tenant's", token(sid, "off", ScopeVNC, ids.NewPreview(), time.Hour), 401},
		{"another tenant's session", token(ids4["other"], "t", ScopeVNC, ids.NewPreview(), time.Hour), 401},
		{"a session with no Pod", token(ids4["gone"], "t", ScopeCDP, ids.NewPreview(), time.Hour), 401},
		{"a stopped session", token(ids4["stopped"], "t", ScopeCDP, ids.NewPreview(), time.Hour), 401},
		{"junk", "junk", 401},
		{"revocations out of date", token(sid, "t", ScopeCDP, stalePreview, time.Hour), 503},
		{"tenants out of date", token(sid, "stale", ScopeCDP, ids.NewPreview(), time.Hour), 503},
		{"Pods not listed", token(ids4["unreadable"], "t", ScopeCDP, ids.NewPreview(), time.Hour), 503},
		{"a key this replica lacks", foreign, 401},
		{"a starting session's", token(ids4["starting"], "t", ScopeCDP, ids.NewPreview(), time.Hour), 503},
		{"a stopping session's", token(ids4["stopping"], "t", ScopeCDP, ids.NewPreview(), time.Hour), 401},
	}
	for _, p := range previews {
		c, ep, info, err := l.admit(p.token)
		st, _, _ := publicOf(err)
		if err == nil {
			st = 0
		}
		if st != p.want {
			t.Errorf("preview %s: %d %v, want %d", p.name, st, err, p.want)
		}
		if p.want == 0 && (c == nil || c.Session != sid || ep.CDP.String() != "10.1.2.3:9222" || info.Screen.Width != 800 || info.Tenant != "t") {
			t.Errorf("preview %s: %+v %+v %+v", p.name, c, ep, info)
		}
	}
	if asked.Load() != 1 {
		t.Errorf("the closed leader was asked %d times", asked.Load())
	}
	// The copies were read again once, as it began to admit alone.
	if refreshed.Load() != 1 {
		t.Errorf("the copies were refreshed %d times, want once", refreshed.Load())
	}
}

// testTenants is a copy of the tenants (RelayAlone.Tenant) that knows
// the key "good" (tenant t, with lim), "off" (a disabled tenant's) and
// "stale" (the copy out of date), and no other.
func testTenants(lim session.TenantLimits) func(key string) (string, session.TenantLimits, error) {
	return func(key string) (string, session.TenantLimits, error) {
		switch key {
		case "good":
			return "t", lim, nil
		case "off":
			return "", session.TenantLimits{}, tenant.ErrDisabled
		case "stale":
			return "", session.TenantLimits{}, tenant.ErrStale
		}
		return "", session.TenantLimits{}, tenant.ErrNotFound
	}
}

// answerOf is srv's answer to req: its status and body.
func answerOf(t *testing.T, srv *Server, req *http.Request) (int, string) {
	t.Helper()
	resp, err := srv.App().Test(req, 10000)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestRelayAloneProbes: once a leader has been silent a while, one
// admission at a time asks it again (here it hangs until the ask's
// timeout) while the others are admitted alone at once, none refused
// busy; an admission alone takes a turn as an asked one does.
func TestRelayAloneProbes(t *testing.T) {
	hung, accepted := hungLeader(t)
	sid := ids.NewSession()
	now := time.Now().UTC()
	record := map[string]string{"sandgate.session": sid, session.RecordTenant: "t", "sandgate.created": now.Format(time.RFC3339Nano),
		session.RecordExpires: now.Add(time.Hour).Format(time.RFC3339Nano), session.RecordAddr: "10.1.2.3",
		"sandgate.info": `{"kind":"browser","runtime":"runc"}`, "sandgate.state": "running"}
	started := make(chan string, 64)
	srv := testRelay(t, "http://"+hung, func(id string) session.Sandbox { return failingSandbox{id: id, started: started} })
	srv.AdmitAlone(RelayAlone{
		Tenant: func(string) (string, session.TenantLimits, error) {
			return "t", session.TenantLimits{MaxTTL: time.Hour}, nil
		},
		Session: func(context.Context, string) (map[string]string, bool, error) { return record, true, nil },
	})
	l := srv.live.(*relayLive)
	silent := time.Now().Add(-2 * relayLeaderCache).UnixNano() // silent a while ago
	l.silentAt.Store(silent)
	l.silentSince.Store(silent)

	const n = 12
	type result struct {
		st   int
		took time.Duration
	}
	results := make(chan result, n)
	for range n {
		go func() {
			t0 := time.Now()
			req := httptest.NewRequest("POST", "http://gw.test:8080/v1/sessions/"+sid+"/exec", strings.NewReader(`{"cmd":["true"]}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer good")
			resp, err := srv.App().Test(req, 20000)
			st := 0
			if err == nil {
				st = resp.StatusCode
			}
			results <- result{st, time.Since(t0)}
		}()
	}
	quick := 0
	for range n {
		r := <-results
		// (500: the stand-in sandbox fails the admitted command.)
		if r.st != 500 {
			t.Errorf("an admission after the silence: %d, want it admitted", r.st)
		}
		if r.took < 2*time.Second {
			quick++
		}
	}
	if quick != n-1 {
		t.Errorf("%d of %d admissions answered at once, want all but the one that asked the leader", quick, n)
	}
	if a := accepted.Load(); a != 1 {
		t.Errorf("the silent leader was asked on %d connections, want 1", a)
	}
	if len(started) != n {
		t.Errorf("%d commands started, want %d", len(started), n)
	}
}

// TestRelayAloneEnds: a silence ends with any answer of a leader, a
// refusal included (a revoked preview's 401): the admissions after it
// ask the leader again, not alone; and an admission that would be made
// alone once a leader has answered is refused 503 (asked again, it is
// the leader's), not admitted by the copies.
func TestRelayAloneEnds(t *testing.T) {
	var asked atomic.Int32
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.WriteHeader(http.StatusUnauthorized) // the token is revoked
	}))
	defer leader.Close()
	srv := testRelay(t, leader.URL, nil)
	var refreshed atomic.Int32
	srv.AdmitAlone(RelayAlone{
		Tenant: func(string) (string, session.TenantLimits, error) { return "t", session.TenantLimits{}, nil },
		Session: func(context.Context, string) (map[string]string, bool, error) {
			return nil, false, session.ErrSandboxGone
		},
		Enabled: func(string) error { return nil },
		Revoked: func(string, string) (bool, error) { return false, nil },
		Refresh: func(context.Context) { refreshed.Add(1) },
	})
	l := srv.live.(*relayLive)
	c := previewClaims{Session: ids.NewSession(), Tenant: "t", Scope: ScopeCDP}
	c.ID, c.ExpiresAt = ids.NewPreview(), jwtTime(time.Now().Add(time.Hour))
	token, err := srv.tokens.issue(c)
	if err != nil {
		t.Fatal(err)
	}
	// A silence that began a while ago, admitted alone since.
	silent := time.Now().Add(-2 * relayLeaderCache).UnixNano()
	l.silentAt.Store(silent)
	l.silentSince.Store(silent)
	l.aloneFor.Store(silent)
	for i := range 3 {
		_, _, _, err := l.admit(token)
		if st, _, _ := publicOf(err); st != 401 {
			t.Fatalf("admission %d: %v, want the leader's 401", i, err)
		}
	}
	if asked.Load() != 3 || l.silentAt.Load() != 0 || l.silentSince.Load() != 0 {
		t.Fatalf("after the leader's refusals: asked %d (want 3), silent at %d since %d (want 0)", asked.Load(), l.silentAt.Load(), l.silentSince.Load())
	}
	// An admission that took the way alone as the leader answered.
	l.silentAt.Store(time.Now().UnixNano())
	_, _, _, err = l.admit(token)
	if st, _, _ := publicOf(err); st != 503 || refreshed.Load() != 0 || asked.Load() != 3 {
		t.Fatalf("alone after the leader answered: %v (refreshed %d, asked %d), want a 503 and no new silence", err, refreshed.Load(), asked.Load())
	}
}

// TestRelayAloneAnswers: a session read handed to a relay is the
// leader's answer while one answers; once none does, the relay
// answers it from the sessions' Pods as the leader shows them (after
// the copies were read since the silence): a session's view with its
// isolation, one the record says runs whose Pod does not (or that
// expired) as stopping, one starting with no address yet as starting;
// the tenant's sessions newest first, another tenant's left out; the
// key checked by the copy of the tenants (401, 403, 503), a missing,
// pooled, garbled or another tenant's session 404, and Pods that
// cannot be read 503 with a Retry-After. A preview's issue is answered
// the same way: signed with the gateway's keys, its preview_issued
// event kept for the next leader; refused as the leader refuses it,
// and a review link 503 (a leader's).
func TestRelayAloneAnswers(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Second)
	rec := func(id, tenantName string, age time.Duration, expires time.Time, state string) map[string]string {
		return map[string]string{"sandgate.session": id, session.RecordTenant: tenantName, "sandgate.created": now.Add(-age).Format(time.RFC3339Nano),
			session.RecordExpires: expires.Format(time.RFC3339Nano), session.RecordAddr: "10.1.2.3", "sandgate.state": state,
			"sandgate.info": `{"kind":"desktop","runtime":"gvisor","screen":{"width":800,"height":600},"labels":{"team":"qa"},"start":"warm"}`}
	}
	type pod struct {
		r       map[string]string
		running bool
	}
	name := map[string]string{}
	for _, n := range []string{"running", "stopped", "expired", "starting", "stopping", "other", "pooled", "garbled", "legacy"} {
		name[n] = ids.NewSession()
	}
	pods := map[string]pod{
		name["running"]:  {rec(name["running"], "t", 1*time.Minute, now.Add(time.Hour), "running"), true},
		name["stopped"]:  {rec(name["stopped"], "t", 2*time.Minute, now.Add(time.Hour), "running"), false},
		name["expired"]:  {rec(name["expired"], "t", 3*time.Minute, now.Add(-time.Second), "running"), true},
		name["starting"]: {rec(name["starting"], "t", 0, now.Add(time.Hour), "starting"), false},
		name["stopping"]: {rec(name["stopping"], "t", 4*time.Minute, now.Add(time.Hour), "stopping"), true},
		name["other"]:    {rec(name["other"], "u", 5*time.Minute, now.Add(time.Hour), "running"), true},
		name["pooled"]:   {rec(name["pooled"], "t", 6*time.Minute, now.Add(time.Hour), "running"), true},
		name["garbled"]:  {rec(name["garbled"], "t", 7*time.Minute, now.Add(time.Hour), "running"), true},
		name["legacy"]:   {rec(name["legacy"], "t", 8*time.Minute, now.Add(time.Hour), ""), true},
	}
	delete(pods[name["starting"]].r, session.RecordAddr) // no Pod IP yet
	pods[name["pooled"]].r["sandgate.pool"] = "desktop-gvisor"
	pods[name["garbled"]].r["sandgate.info"] = "{"
	delete(pods[name["legacy"]].r, "sandgate.state")                                  // an older gateway's record
	pods[name["legacy"]].r["sandgate.info"] = `{"kind":"browser","runtime":"gvisor"}` // with no labels
	unreadable := ids.NewSession()

	var asked atomic.Int32
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		fmt.Fprintf(w, `{"leader":%q}`, r.URL.Path)
	}))
	started := make(chan string, 1)
	srv := testRelay(t, leader.URL, func(id string) session.Sandbox { return failingSandbox{id: id, started: started} })
	var fresh atomic.Int64
	var listFails, storeFails atomic.Bool
	var stored []string
	var storedUntil []time.Time
	srv.AdmitAlone(RelayAlone{
		Tenant: testTenants(session.TenantLimits{}),
		Session: func(_ context.Context, id string) (map[string]string, bool, error) {
			if id == unreadable {
				return nil, false, errors.New("the API server does not answer")
			}
			if p, ok := pods[id]; ok {
				return p.r, p.running, nil
			}
			return nil, false, fmt.Errorf("%w: no Pod", session.ErrSandboxGone)
		},
		// Every Pod, another tenant's too: the relay keeps the tenant's.
		List: func(_ context.Context, tenantName string) ([]AloneRecord, error) {
			if listFails.Load() {
				return nil, errors.New("the API server does not answer")
			}
			var out []AloneRecord
			for _, p := range pods {
				out = append(out, AloneRecord{Record: p.r, Running: p.running})
			}
			return out, nil
		},
		Isolation: func(rt string) string { return map[string]string{"gvisor": "kernel"}[rt] },
		Revoke: func(_ context.Context, id, preview string, until time.Time) error {
			if storeFails.Load() {
				return errors.New("MinIO does not answer")
			}
			stored, storedUntil = append(stored, id+" "+preview), append(storedUntil, until)
			return nil
		},
		Enabled: func(string) error { return nil },
		Revoked: func(string, string) (bool, error) { return false, nil },
		Fresh:   func() time.Time { return time.Unix(0, fresh.Load()) },
	})
	read := func(path, key string) (int, string, string) { t.Helper(); return relayGet(t, srv, path, key) }
	one := "/v1/sessions/" + name["running"]
	// A leader that answers: its word, whatever the Pods say.
	if st, body, _ := read(one, "junk"); st != 200 || body != `{"leader":"`+one+`"}` || asked.Load() != 1 {
		t.Fatalf("with a leader: %d %s (asked %d), want its answer", st, body, asked.Load())
	}
	leader.Close()
	// No leader, the copies not read since: 503, not the Pods' word.
	if st, body, ra := read(one, "good"); st != 503 || ra == "" {
		t.Fatalf("no leader, copies not read since: %d %s (Retry-After %q), want 503", st, body, ra)
	}
	fresh.Store(time.Now().UnixNano())
	view := func(id string) session.Info {
		t.Helper()
		st, body, _ := read("/v1/sessions/"+id, "good")
		var info session.Info
		if err := json.Unmarshal([]byte(body), &info); st != 200 || err != nil {
			t.Fatalf("session %s: %d %s", id, st, body)
		}
		return info
	}
	info := view(name["running"])
	if info.ID != name["running"] || info.State != session.StateRunning || info.Isolation != "kernel" || info.Runtime != "gvisor" || info.Kind != "desktop" ||
		info.Screen.Width != 800 || info.Labels["team"] != "qa" || info.Start != "warm" || !info.ExpiresAt.Equal(now.Add(time.Hour)) || !info.CreatedAt.Equal(now.Add(-time.Minute)) {
		t.Errorf("a running session: %+v", info)
	}
	for n, want := range map[string]session.State{"stopped": session.StateStopping, "expired": session.StateStopping, "starting": session.StateStarting,
		"stopping": session.StateStopping, "legacy": session.StateRunning} {
		if got := view(name[n]).State; got != want {
			t.Errorf("the %s session reads %q, want %q", n, got, want)
		}
	}
	// No labels: {} as the leader shows it, not null.
	if _, body, _ := read("/v1/sessions/"+name["legacy"], "good"); !strings.Contains(body, `"labels":{}`) {
		t.Errorf("a session with no labels: %s, want \"labels\":{}", body)
	}
	for _, tc := range []struct {
		path, key string
		want      int
	}{
		{one, "junk", 401}, {one, "off", 403}, {one, "stale", 503}, {one, "", 401},
		{"/v1/sessions/" + name["other"], "good", 404}, {"/v1/sessions/" + name["pooled"], "good", 404},
		{"/v1/sessions/" + name["garbled"], "good", 404}, {"/v1/sessions/" + ids.NewSession(), "good", 404},
		{"/v1/sessions/not-a-session", "good", 404}, {"/v1/sessions/" + unreadable, "good", 503},
		{"/v1/sessions", "junk", 401}, {"/v1/sessions", "stale", 503},
	} {
		st, body, ra := read(tc.path, tc.key)
		if st != tc.want || (st == 503) != (ra != "") || !strings.Contains(body, `"error"`) {
			t.Errorf("GET %s with key %q: %d %s (Retry-After %q), want %d", tc.path, tc.key, st, body, ra, tc.want)
		}
	}
	st, body, _ := read("/v1/sessions", "good")
	var list struct{ Sessions []session.Info }
	if err := json.Unmarshal([]byte(body), &list); st != 200 || err != nil {
		t.Fatalf("list: %d %s", st, body)
	}
	var got []string
	for _, s := range list.Sessions {
		got = append(got, s.ID)
	}
	want := []string{name["starting"], name["running"], name["stopped"], name["expired"], name["stopping"], name["legacy"]}
	if !slices.Equal(got, want) {
		t.Errorf("list: %v, want %v (newest first, the tenant's readable sessions)", got, want)
	}
	listFails.Store(true)
	if st, body, ra := read("/v1/sessions", "good"); st != 503 || ra == "" {
		t.Errorf("list with the Pods unreadable: %d %s (Retry-After %q), want 503", st, body, ra)
	}

	issue := func(id, key, body string) (int, string, string) {
		t.Helper()
		return relayCall(t, srv, "POST", "/v1/sessions/"+id+"/previews", key, body)
	}
	st, body, _ = issue(name["running"], "good", `{"scope":"cdp","ttl_seconds":60}`)
	var p previewResponse
	if err := json.Unmarshal([]byte(body), &p); st != 201 || err != nil || p.Scope != "cdp" || !strings.HasPrefix(p.WSURL, "ws://gw.test:8080/cdp/") {
		t.Fatalf("a preview issued alone: %d %s", st, body)
	}
	tok := strings.TrimPrefix(p.WSURL, "ws://gw.test:8080/cdp/")
	c, err := srv.tokens.verify(tok, time.Now())
	if err != nil || c.Session != name["running"] || c.Tenant != "t" || c.Scope != ScopeCDP || c.ID != p.ID || !c.ExpiresAt.Time.Equal(p.ExpiresAt) {
		t.Fatalf("the preview issued alone: %+v %v", c, err)
	}
	l := srv.live.(*relayLive)
	l.mu.Lock()
	kept := slices.ContainsFunc(l.events, func(ev relayEvent) bool { return ev.Type == "preview_issued" && ev.Token == tok })
	l.mu.Unlock()
	if !kept {
		t.Error("the preview's issue is not kept for the next leader")
	}
	for _, tc := range []struct {
		id, key, body string
		want          int
	}{
		{name["running"], "junk", `{"scope":"cdp"}`, 401}, {name["running"], "stale", `{"scope":"cdp"}`, 503},
		{ids.NewSession(), "good", `{"scope":"review"}`, 503}, // (no Pod: ended, or none? no store here to say)
		{name["running"], "good", `{"scope":"cdp","view_only":true}`, 400},
		{name["running"], "good", `{"scope":"vnc","ttl_seconds":99999999}`, 400}, {name["running"], "good", `{`, 400},
		{name["starting"], "good", `{"scope":"vnc"}`, 503}, {name["stopping"], "good", `{"scope":"vnc"}`, 409},
		{name["stopped"], "good", `{"scope":"vnc"}`, 409}, {name["other"], "good", `{"scope":"vnc"}`, 404},
		{ids.NewSession(), "good", `{"scope":"vnc"}`, 404}, {unreadable, "good", `{"scope":"vnc"}`, 503},
		// A review link of a session whose Pod does not run, or that
		// expired, waits for a leader (the next would not adopt it);
		// another tenant's is not found.
		{name["stopping"], "good", `{"scope":"review"}`, 503}, {name["stopped"], "good", `{"scope":"review"}`, 503},
		{name["expired"], "good", `{"scope":"review"}`, 503}, {name["other"], "good", `{"scope":"review"}`, 404},
	} {
		st, body, ra := issue(tc.id, tc.key, tc.body)
		if st != tc.want || (st == 503) != (ra != "") || !strings.Contains(body, `"error"`) {
			t.Errorf("a preview %s of %s with key %q: %d %s (Retry-After %q), want %d", tc.body, tc.id, tc.key, st, body, ra, tc.want)
		}
	}
	// A review link's page: a running session's goes on to be served
	// (to the store, none here), its use kept for the next leader; one
	// of a session whose Pod does not run, or that expired, waits for
	// a leader, the store not asked.
	for _, tc := range []struct {
		pod  string
		want string
	}{
		{"running", "the artifact store is unavailable"},
		{"stopped", "cannot check the request"}, {"stopping", "cannot check the request"},
		{"expired", "cannot check the request"}, {"starting", "cannot check the request"},
	} {
		tok, err := srv.tokens.issue(previewClaims{Session: name[tc.pod], Tenant: "t", Scope: ScopeReview,
			RegisteredClaims: jwt.RegisteredClaims{ID: ids.NewPreview(), ExpiresAt: jwtTime(time.Now().Add(time.Hour))}})
		if err != nil {
			t.Fatal(err)
		}
		if st, body, ra := relayGet(t, srv, "/review/"+tok, ""); st != 503 || ra == "" || !strings.Contains(body, tc.want) {
			t.Errorf("the review page of the %s session: %d %s (Retry-After %q), want 503 %q", tc.pod, st, body, ra, tc.want)
		}
	}
	// A revocation: stored, held at once (the copy of the stored ones
	// lags), the preview's connections admitted alone refused since,
	// and its event kept for the next leader's trail.
	revoke := func(id, preview, key string) (int, string, string) {
		t.Helper()
		return relayCall(t, srv, "DELETE", "/v1/sessions/"+id+"/previews/"+preview, key, "")
	}
	if _, _, _, err := l.admit(tok); err != nil {
		t.Fatalf("the preview issued alone, admitted alone before its revocation: %v", err)
	}
	if st, body, _ := revoke(name["running"], p.ID, "good"); st != 204 || len(stored) != 1 || stored[0] != name["running"]+" "+p.ID {
		t.Fatalf("a revocation alone: %d %s (stored %v)", st, body, stored)
	}
	if until := storedUntil[0]; until.Before(time.Now().Add(srv.cfg.MaxPreviewTTL - time.Minute)) {
		t.Errorf("a revocation alone lasts until %v, want the longest a preview lives", until)
	}
	if _, _, _, err := l.admit(tok); err == nil {
		t.Error("the revoked preview is admitted alone")
	}
	l.mu.Lock()
	i := slices.IndexFunc(l.events, func(ev relayEvent) bool { return ev.Type == "preview_revoked" && ev.Preview == p.ID })
	var revokedEv relayEvent
	if i >= 0 {
		revokedEv = l.events[i]
	}
	l.mu.Unlock()
	// The leader takes the event by its token: a ticket of the session.
	if tc, err := srv.tokens.verify(revokedEv.Token, time.Now()); i < 0 || err != nil || tc.Scope != scopeShell || tc.Session != name["running"] || tc.Tenant != "t" {
		t.Errorf("the revocation kept for the next leader: %+v (its token: %v)", revokedEv, err)
	}
	storeFails.Store(true)
	for _, tc := range []struct {
		id, preview, key string
		want             int
	}{
		{name["running"], ids.NewPreview(), "junk", 401}, {name["other"], ids.NewPreview(), "good", 404},
		{ids.NewSession(), ids.NewPreview(), "good", 503}, {name["running"], "p-junk", "good", 404},
		{name["running"], ids.NewPreview(), "good", 503}, {unreadable, ids.NewPreview(), "good", 503},
	} {
		st, body, ra := revoke(tc.id, tc.preview, tc.key)
		if st != tc.want || (st == 503) != (ra != "") || !strings.Contains(body, `"error"`) {
			t.Errorf("a revocation of %s's %s with key %q: %d %s (Retry-After %q), want %d", tc.id, tc.preview, tc.key, st, body, ra, tc.want)
		}
	}
	storeFails.Store(false)
	// One tenant's issues while no leader answers are bounded: each is
	// an event kept among everyone's. Its revocations are counted apart
	// (only those stored): it can still revoke.
	for i := 2; i <= maxIssuedAlone+1; i++ {
		st, body, ra := issue(name["running"], "good", `{"scope":"vnc"}`)
		if i <= maxIssuedAlone && st != 201 || i > maxIssuedAlone && (st != 503 || ra == "") {
			t.Fatalf("issue %d of the tenant's while no leader answers: %d %s", i, st, body)
		}
	}
	for i := 2; i <= maxIssuedAlone+1; i++ {
		st, body, _ := revoke(name["running"], ids.NewPreview(), "good")
		if i <= maxIssuedAlone && st != 204 || i > maxIssuedAlone && st != 503 {
			t.Fatalf("revocation %d of the tenant's while no leader answers, its issues used up: %d %s", i, st, body)
		}
	}
	// A revocation made alone holds here after a leader answers again
	// (until that leader has it: this replica's report), before anyone
	// is asked.
	l.answered()
	if _, _, _, err := l.admit(tok); err == nil || l.silentSince.Load() != 0 {
		t.Errorf("the preview revoked alone, once a leader answered: admitted (%v), or the silence did not end", err)
	}
	if _, err := l.track(c, io.NopCloser(nil)); err == nil {
		t.Error("a connection of the preview revoked alone is tracked (admitted just before its revocation)")
	}
	l.silent() // silent again, the copies read since
	fresh.Store(time.Now().UnixNano())
	// Reads and issues take turns of their own: all of theirs taken,
	// a command is still admitted (500: the stand-in sandbox fails it).
	for range maxAloneAnswers {
		l.aloneAnswers <- struct{}{}
	}
	if st, body, ra := read(one, "good"); st != 503 || ra == "" || !strings.Contains(body, "busy") {
		t.Errorf("a read with the turns taken: %d %s (Retry-After %q), want 503 busy", st, body, ra)
	}
	req := httptest.NewRequest("POST", "http://gw.test:8080/v1/sessions/"+name["running"]+"/exec", strings.NewReader(`{"cmd":["true"]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer good")
	if st, body := answerOf(t, srv, req); st != 500 || len(started) != 1 {
		t.Errorf("a command with the reads' turns taken: %d %s (started %d), want it admitted", st, body, len(started))
	}
	for range maxAloneAnswers {
		<-l.aloneAnswers
	}
	if asked.Load() != 1 {
		t.Errorf("the closed leader was asked %d times", asked.Load())
	}
}

// hungLeader is the address of a leader that takes connections and
// never answers, and a count of those it took.
func hungLeader(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			defer c.Close() // held, never answered
		}
	}()
	return ln.Addr().String(), &accepted
}

// TestRelayAloneLeaderHangs: a read passed on to a leader that takes
// it and does not answer gets a 503, and is not answered alone (that
// leader lives: a preview's issue may have been carried out there),
// nor does it start a silence.
func TestRelayAloneLeaderHangs(t *testing.T) {
	hung, _ := hungLeader(t)
	srv := testRelay(t, "http://"+hung, func(id string) session.Sandbox { return failingSandbox{id: id} })
	var listed atomic.Int32
	srv.AdmitAlone(RelayAlone{
		Tenant: testTenants(session.TenantLimits{}),
		Session: func(context.Context, string) (map[string]string, bool, error) {
			return nil, false, session.ErrSandboxGone
		},
		List: func(context.Context, string) ([]AloneRecord, error) {
			listed.Add(1)
			return nil, nil
		},
		Enabled: func(string) error { return nil },
		Revoked: func(string, string) (bool, error) { return false, nil },
	})
	req := httptest.NewRequest("GET", "http://gw.test:8080/v1/sessions", nil)
	req.Header.Set("Authorization", "Bearer good")
	resp, err := srv.App().Test(req, 10000)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	l := srv.live.(*relayLive)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "may have been carried out") || listed.Load() != 0 || l.silentAt.Load() != 0 {
		t.Errorf("a read the leader took and did not answer: %d %s (Retry-After %q, listed alone %d, silent at %d), want its 503 with a Retry-After, not alone",
			resp.StatusCode, body, resp.Header.Get("Retry-After"), listed.Load(), l.silentAt.Load())
	}
}

// noSandboxes is a session backend that holds no sandboxes: a leader's
// manager with no sessions.
type noSandboxes struct{}

func (noSandboxes) Name() string                { return "none" }
func (noSandboxes) Ready(context.Context) error { return nil }
func (noSandboxes) Runtimes(context.Context) map[string]*session.Runtime {
	return map[string]*session.Runtime{"runc": {Name: "runc", Isolation: "container", Usable: true}}
}
func (noSandboxes) Create(context.Context, session.Info, *session.Runtime, map[string]string, session.Host) (session.Sandbox, <-chan session.Exit, error) {
	return nil, nil, errors.New("no sandboxes here")
}
func (noSandboxes) List(context.Context) ([]session.Sandbox, error) { return nil, nil }
func (noSandboxes) Sweep(func(string) bool)                         {}

// TestRelayRevokedHeld: a revocation a replica made while no leader
// answered, reported to a leader that read the stored revocations
// before it was made, is held by that leader (its admissions refuse
// the preview), not only written in a trail; a report naming no valid
// preview revokes nothing.
func TestRelayRevokedHeld(t *testing.T) {
	srv, mgr := testLeader(t, slog.New(slog.DiscardHandler))
	sid, pid := ids.NewSession(), ids.NewPreview()
	if mgr.Revoked(sid, pid) {
		t.Fatal("revoked before any report")
	}
	srv.relayEvent(shellClaims("t", sid, ""), relayEvent{Type: "preview_revoked", Preview: "p-junk"})
	srv.relayEvent(shellClaims("t", sid, ""), relayEvent{Type: "preview_revoked", Preview: pid})
	if !mgr.Revoked(sid, pid) {
		t.Error("the leader does not hold a revocation a replica reported")
	}
	if mgr.Revoked(sid, "p-junk") {
		t.Error("a report naming no valid preview revoked one")
	}
}

// TestRelayEndsRevoked: while no leader answers, a relay ends the
// connections it carries whose preview its copy of the stored
// revocations has (another replica revoked it alone); not while a
// leader answers (its report answers end them), and not another
// preview's.
func TestRelayEndsRevoked(t *testing.T) {
	srv := testRelay(t, "http://127.0.0.1:1", nil)
	revokedPreview, otherPreview, sid := ids.NewPreview(), ids.NewPreview(), ids.NewSession()
	srv.AdmitAlone(RelayAlone{
		Tenant: testTenants(session.TenantLimits{}),
		Session: func(context.Context, string) (map[string]string, bool, error) {
			return nil, false, session.ErrSandboxGone
		},
		Enabled: func(string) error { return nil },
		Revoked: func(_, preview string) (bool, error) { return preview == revokedPreview, nil },
	})
	l := srv.live.(*relayLive)
	closed := map[string]chan struct{}{revokedPreview: make(chan struct{}), otherPreview: make(chan struct{})}
	for p, ch := range closed {
		c := previewClaims{Session: sid, Tenant: "t", Scope: ScopeCDP}
		c.ID = p
		if _, err := l.track(&c, closerFunc(func() error { close(ch); return nil })); err != nil {
			t.Fatal(err)
		}
	}
	// within: how long a close is waited for (long for one that must
	// come, short for one that must not).
	isClosed := func(p string, within time.Duration) bool {
		select {
		case <-closed[p]:
			return true
		case <-time.After(within):
			return false
		}
	}
	l.endRevoked() // a leader answers
	if isClosed(revokedPreview, 100*time.Millisecond) {
		t.Fatal("a connection ended by the copy while a leader answers")
	}
	l.silent()
	l.endRevoked()
	if !isClosed(revokedPreview, 10*time.Second) {
		t.Error("the revoked preview's connection goes on while no leader answers")
	}
	if isClosed(otherPreview, 100*time.Millisecond) {
		t.Error("another preview's connection ended")
	}
}

// TestRelayViewPage: a relay serves a view preview's page (and its
// assets) itself, by the leader's admission, with the session's
// isolation as the leader said it; a preview of another scope, or a
// token the leader refuses, gets no page.
func TestRelayViewPage(t *testing.T) {
	var asked atomic.Int32
	var srv *Server
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != relayAdmitPath {
			w.WriteHeader(404)
			return
		}
		asked.Add(1)
		var req relayAdmitRequest
		json.NewDecoder(r.Body).Decode(&req)
		c, err := srv.tokens.verify(req.Token, time.Now())
		if err != nil {
			w.WriteHeader(401)
			return
		}
		json.NewEncoder(w).Encode(relayAdmitAnswer{CDP: "10.0.0.9:9222", VNC: "10.0.0.9:5900", Session: "s-1", Tenant: "t", Scope: c.Scope, ViewOnly: true,
			Preview: "p-1", Expires: time.Now().Add(time.Hour).Unix(), Isolation: "container"})
	}))
	defer leader.Close()
	srv = testRelay(t, leader.URL, nil)
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := srv.app.Test(httptest.NewRequest("GET", "http://gw.test:8080"+path, nil), 10000)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	issue := func(scope string) string {
		tok, err := srv.tokens.issue(previewClaims{Session: "s-1", Tenant: "t", Scope: scope, ViewOnly: true,
			RegisteredClaims: jwt.RegisteredClaims{ID: "p-1", ExpiresAt: jwtTime(time.Now().Add(time.Hour))}})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	view := issue(ScopeView)
	st, body := get("/view/" + view)
	if st != 200 || !strings.Contains(body, "/vnc/"+view) || !strings.Contains(body, "NOT ISOLATED") {
		t.Fatalf("the view page through the relay: %d %.300q", st, body)
	}
	if asked.Load() != 1 {
		t.Errorf("the leader was asked %d times, want 1", asked.Load())
	}
	// The leader answers for a CDP preview as it would (its scope is
	// the token's): no page. Junk never reaches the leader.
	if st, _ := get("/view/" + issue(ScopeCDP)); st != 401 {
		t.Errorf("a CDP preview's view page: %d, want 401", st)
	}
	before := asked.Load()
	if st, _ := get("/view/junk"); st != 401 || asked.Load() != before {
		t.Errorf("a junk token: %d, the leader asked %d more", st, asked.Load()-before)
	}
	if st, body := get("/viewer-assets/novnc.js"); st != 200 || len(body) < 1000 {
		t.Errorf("an asset: %d, %d bytes", st, len(body))
	}
	if st, _ := get("/viewer-assets/nope.js"); st != 404 {
		t.Errorf("no such asset: %d", st)
	}
}

// TestRelayAloneReviewGates: while no leader answers, a relay answers a
// review link only for a review preview's token that its copies find
// good (a junk one, another scope's, a revoked one's, a disabled
// tenant's: 401; copies out of date: 503), and trails and artifacts
// only for a key its copy of the tenants knows. What passes reaches the
// store (here none: 503), which TestKubeRelay reads for real.
func TestRelayAloneReviewGates(t *testing.T) {
	leader := httptest.NewServer(http.NotFoundHandler())
	leader.Close() // no leader answers
	sid := ids.NewSession()
	srv := testRelay(t, leader.URL, func(id string) session.Sandbox { return failingSandbox{id: id} })
	var fresh atomic.Int64
	srv.AdmitAlone(RelayAlone{
		Tenant: testTenants(session.TenantLimits{}),
		Session: func(context.Context, string) (map[string]string, bool, error) {
			return nil, false, session.ErrSandboxGone
		},
		List: func(context.Context, string) ([]AloneRecord, error) { return nil, nil },
		Enabled: func(name string) error {
			if name == "off" {
				return tenant.ErrDisabled
			}
			return nil
		},
		Revoked: func(_, preview string) (bool, error) { return preview == "p-revoked", nil },
		Fresh:   func() time.Time { return time.Unix(0, fresh.Load()) },
	})
	token := func(tenantName, scope, preview string) string {
		tok, err := srv.tokens.issue(previewClaims{Session: sid, Tenant: tenantName, Scope: scope,
			RegisteredClaims: jwt.RegisteredClaims{ID: preview, ExpiresAt: jwtTime(time.Now().Add(time.Hour))}})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	get := func(path, key string) (int, string, string) { t.Helper(); return relayGet(t, srv, path, key) }
	good := token("t", ScopeReview, "p-good")
	// Copies not read since the silence began: 503, for a good token.
	if st, body, ra := get("/review/"+good, ""); st != 503 || ra == "" {
		t.Fatalf("copies out of date: %d %s (Retry-After %q), want 503", st, body, ra)
	}
	fresh.Store(time.Now().UnixNano())
	aid := recordings.SegmentID(sid, "audit.jsonl")
	for _, tc := range []struct {
		path, key string
		want      int
		why       string
	}{
		{"/review/" + good, "", 503, "a good review link, no store"},
		{"/review/" + good + "/artifacts/" + aid, "", 503, "a good review link's artifact, no store"},
		{"/review/junk", "", 401, "junk"},
		{"/review/" + token("t", ScopeCDP, "p-cdp"), "", 401, "a CDP preview"},
		{"/review/" + token("t", ScopeView, "p-view") + "/artifacts/" + aid, "", 401, "a view preview"},
		{"/review/" + token("t", ScopeReview, "p-revoked"), "", 401, "a revoked review link"},
		{"/review/" + token("off", ScopeReview, "p-off"), "", 401, "a disabled tenant's"},
		{"/review/" + good[:len(good)-4] + "AAAA", "", 401, "a bad signature"},
		{"/v1/sessions/" + sid + "/events", "good", 503, "a trail, no store"},
		{"/v1/sessions/" + sid + "/artifacts", "good", 503, "artifacts, no store"},
		{"/v1/sessions/" + sid + "/snapshots", "good", 503, "snapshots, no store"},
		{"/v1/sessions/" + sid + "/snapshots", "off", 403, "a disabled tenant's snapshots"},
		{"/v1/sessions/" + sid + "/snapshots", "junk", 401, "a junk key's snapshots"},
		{"/v1/sessions/not-a-session/snapshots", "good", 404, "no session's snapshots"},
		{"/v1/artifacts/" + aid, "good", 503, "an artifact, no store"},
		{"/v1/sessions/" + sid + "/events", "junk", 401, "a junk key's trail"},
		{"/v1/sessions/" + sid + "/artifacts", "off", 403, "a disabled tenant's artifacts"},
		{"/v1/artifacts/" + aid, "stale", 503, "a key the copy cannot say"},
		{"/v1/sessions/not-a-session/events", "good", 404, "no session"},
	} {
		st, body, ra := get(tc.path, tc.key)
		if st != tc.want || (st == 503) != (ra != "") || !strings.Contains(body, `"error"`) {
			t.Errorf("%s (GET %.60s…): %d %s (Retry-After %q), want %d", tc.why, tc.path, st, body, ra, tc.want)
		}
	}
	// The review links' turns are their own: with all taken, a link is
	// busy, a tenant's trail is not (it reaches the store).
	l := srv.live.(*relayLive)
	for range maxReviewAnswers {
		l.reviewAnswers <- struct{}{}
	}
	if st, body, _ := get("/review/"+good, ""); st != 503 || !strings.Contains(body, "busy") {
		t.Errorf("a review link with the review turns taken: %d %s, want busy", st, body)
	}
	if st, body, _ := get("/v1/sessions/"+sid+"/events", "good"); st != 503 || strings.Contains(body, "busy") {
		t.Errorf("a trail with the review turns taken: %d %s, want the store's 503", st, body)
	}
}

// relayGet is srv's answer to a GET of path with key (none when ""):
// its status, body and Retry-After.
func relayGet(t *testing.T, srv *Server, path, key string) (int, string, string) {
	t.Helper()
	return relayCall(t, srv, "GET", path, key, "")
}

// relayCall is srv's answer to a request (a JSON body, when one is
// given): its status, body and Retry-After.
func relayCall(t *testing.T, srv *Server, method, path, key, body string) (int, string, string) {
	t.Helper()
	var in io.Reader
	if body != "" {
		in = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, "http://gw.test:8080"+path, in)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := srv.App().Test(req, 10000)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out), resp.Header.Get("Retry-After")
}

// TestRelayPassOnHidesToken: a review link's request a relay passes on
// to a leader that takes the connection and drops it gets a 503, and
// the relay's log says why without the link's token (the URL's words
// would have it); the control is the cause, in the log.
func TestRelayPassOnHidesToken(t *testing.T) {
	ln := droppingLeader(t)
	var logs bytes.Buffer
	var mu sync.Mutex
	u, _ := url.Parse("http://gw.test:8080")
	srv, err := NewRelay(Config{PublicURL: u, TokenKeys: map[string]string{"k1": strings.Repeat("a", 32)}, ActiveKey: "k1"}, "relay-1",
		func(context.Context) (string, error) { return ln.Addr().String(), nil }, func(id string) session.Sandbox { return failingSandbox{id: id} }, nil,
		slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return logs.Write(p) }), nil)))
	if err != nil {
		t.Fatal(err)
	}
	const token = "eyJsecret.review.token"
	st, body, ra := relayGet(t, srv, "/review/"+token, "")
	mu.Lock()
	defer mu.Unlock()
	if st != 503 || ra == "" {
		t.Errorf("a review link passed on to a leader that drops it: %d %s (Retry-After %q), want 503", st, body, ra)
	}
	// (The cause: the connection ended, or was reset, before an answer.)
	if strings.Contains(logs.String()+body, "secret") || !strings.Contains(logs.String(), "EOF") && !strings.Contains(logs.String(), "reset by peer") {
		t.Errorf("the relay's log and answer: %s %s; want the cause, without the token", logs.String(), body)
	}
}

// A review's use that a relay kept is recorded with the fields the
// leader's own noteReview records, and only then: a review link's token,
// a viewer's digest, a fetched artifact of the link's session. The
// controls: a CDP token, a viewer that is not a digest, another
// session's artifact or junk are refused.
func TestRelayReviewFields(t *testing.T) {
	sid, other := ids.NewSession(), ids.NewSession()
	review := &previewClaims{Session: sid, Tenant: "t", Scope: ScopeReview, RegisteredClaims: jwt.RegisteredClaims{ID: "p-review"}}
	cdp := &previewClaims{Session: sid, Tenant: "t", Scope: ScopeCDP, RegisteredClaims: jwt.RegisteredClaims{ID: "p-cdp"}}
	art := recordings.SegmentID(sid, "shot.png")
	long := strings.Repeat("n", 1000)
	for _, tc := range []struct {
		why    string
		claims *previewClaims
		ev     relayEvent
		want   map[string]any
	}{
		{"an opening", review, relayEvent{Type: "review_opened", Viewer: "0123456789abcdef"},
			map[string]any{"preview": "p-review", "viewer": "0123456789abcdef"}},
		{"a fetch", review, relayEvent{Type: "review_fetched", Viewer: "0123456789abcdef", Artifact: art, Kind: "screenshot", Name: long},
			map[string]any{"preview": "p-review", "viewer": "0123456789abcdef", "artifact": art, "kind": "screenshot", "name": long[:256]}},
		{"a CDP token", cdp, relayEvent{Type: "review_opened", Viewer: "0123456789abcdef"}, nil},
		{"a viewer that is no digest", review, relayEvent{Type: "review_opened", Viewer: "10.0.0.1"}, nil},
		{"an upper-case digest", review, relayEvent{Type: "review_opened", Viewer: "0123456789ABCDEF"}, nil},
		{"another session's artifact", review, relayEvent{Type: "review_fetched", Viewer: "0123456789abcdef", Artifact: recordings.SegmentID(other, "shot.png")}, nil},
		{"a junk artifact", review, relayEvent{Type: "review_fetched", Viewer: "0123456789abcdef", Artifact: sid + ".zz"}, nil},
	} {
		got, ok := reviewFields(tc.claims, tc.ev)
		if ok != (tc.want != nil) || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %v %v, want %v", tc.why, got, ok, tc.want)
		}
	}
}

// TestRelaySnapshotFields: a snapshot_saved a replica reports is
// recorded with the leader's own fields; one whose snapshot id is not
// one of the session's artifacts', or whose digest is none, without
// them (the control: the good one keeps them); a count below 0 is 0.
func TestRelaySnapshotFields(t *testing.T) {
	sid, other := ids.NewSession(), ids.NewSession()
	good := sid + ".0123456789abcdef"
	sum := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		why  string
		ev   relayEvent
		want map[string]any
		ok   bool
	}{
		{"a good one", relayEvent{Type: "snapshot_saved", Artifact: good, Bytes: 10240, SHA256: sum, Files: 3, Changed: true, DurationMS: 42},
			map[string]any{"snapshot": good, "size": int64(10240), "sha256": sum, "files": int64(3), "changed_while_read": true, "took_ms": int64(42)}, true},
		{"another session's", relayEvent{Type: "snapshot_saved", Artifact: other + ".0123456789abcdef", Bytes: 1, SHA256: sum},
			map[string]any{"snapshot": "", "size": int64(1), "sha256": "", "files": int64(0), "changed_while_read": false, "took_ms": int64(0)}, false},
		{"a junk id", relayEvent{Type: "snapshot_saved", Artifact: sid + ".zz", SHA256: sum},
			map[string]any{"snapshot": "", "size": int64(0), "sha256": "", "files": int64(0), "changed_while_read": false, "took_ms": int64(0)}, false},
		{"no digest", relayEvent{Type: "snapshot_saved", Artifact: good, SHA256: "AB" + sum[2:]},
			map[string]any{"snapshot": "", "size": int64(0), "sha256": "", "files": int64(0), "changed_while_read": false, "took_ms": int64(0)}, false},
		{"counts below 0", relayEvent{Type: "snapshot_saved", Artifact: good, SHA256: sum, Bytes: -1, Files: -2, DurationMS: -3},
			map[string]any{"snapshot": good, "size": int64(0), "sha256": sum, "files": int64(0), "changed_while_read": false, "took_ms": int64(0)}, true},
	} {
		got, ok := relayedSnapshot(tc.ev, sid)
		if ok != tc.ok || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %v %v, want %v %v", tc.why, got, ok, tc.want, tc.ok)
		}
	}
}

// A running session's review uses while no leader answers are kept for
// the next leader with noteReview's fields, within bounds: one link's
// uses, a tenant's, and everyone's. Past each, a 503 with nothing kept;
// the control: another link, and another tenant, still keep theirs.
func TestRelayKeepReview(t *testing.T) {
	srv := testRelay(t, "http://127.0.0.1:1", func(id string) session.Sandbox { return failingSandbox{id: id} })
	l := srv.live.(*relayLive)
	sid := ids.NewSession()
	art := recordings.SegmentID(sid, "shot.png")
	keep := func(tenantName, preview, typ string) error {
		f := map[string]any{"preview": preview, "viewer": "0123456789abcdef"}
		if typ == "review_fetched" {
			f["artifact"], f["kind"], f["name"] = art, "screenshot", "shot.png"
		}
		return l.keepReview("tok-"+preview, tenantName, preview, typ, f)
	}
	if err := keep("t", "p-1", "review_opened"); err != nil {
		t.Fatal(err)
	}
	if err := keep("t", "p-1", "review_fetched"); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	got := slices.Clone(l.events)
	l.mu.Unlock()
	if len(got) != 2 || got[0].Type != "review_opened" || got[0].Token != "tok-p-1" || got[0].Viewer != "0123456789abcdef" ||
		got[1].Type != "review_fetched" || got[1].Artifact != art || got[1].Kind != "screenshot" || got[1].Name != "shot.png" {
		t.Fatalf("kept %+v", got)
	}
	kept := func() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.events) }
	refused := func(why string, err error) {
		t.Helper()
		var ae *apiError
		if !errors.As(err, &ae) || ae.status != 503 {
			t.Errorf("%s: %v, want 503", why, err)
		}
	}
	// One link: maxReviewUsesAlone in all.
	for range maxReviewUsesAlone - 2 {
		if err := keep("t", "p-1", "review_fetched"); err != nil {
			t.Fatal(err)
		}
	}
	n := kept()
	refused("a link past its uses", keep("t", "p-1", "review_fetched"))
	if err := keep("t", "p-2", "review_opened"); err != nil {
		t.Errorf("another link of the tenant: %v", err)
	}
	// The tenant: maxIssuedAlone in all.
	for i := 0; kept() < maxIssuedAlone; i++ {
		if err := keep("t", fmt.Sprintf("p-t%d", i), "review_opened"); err != nil {
			t.Fatalf("use %d of the tenant's: %v", kept(), err)
		}
	}
	refused("a tenant past its uses", keep("t", "p-last", "review_opened"))
	if err := keep("u", "p-u", "review_opened"); err != nil {
		t.Errorf("another tenant's: %v", err)
	}
	// Everyone: maxReviewUsesAllAlone in all.
	for i := 0; kept() < maxReviewUsesAllAlone; i++ {
		if err := keep(fmt.Sprintf("t%d", i/maxIssuedAlone), fmt.Sprintf("p-a%d", i), "review_opened"); err != nil {
			t.Fatalf("use %d of everyone's: %v", kept(), err)
		}
	}
	refused("everyone past their uses", keep("fresh", "p-fresh", "review_opened"))
	if kept() != maxReviewUsesAllAlone || n != maxReviewUsesAlone {
		t.Errorf("kept %d (the link %d), want %d (%d)", kept(), n, maxReviewUsesAllAlone, maxReviewUsesAlone)
	}
}

// lockedBuffer is a log sink the test reads while the server writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// A review's use a replica kept, of a session this leader does not hold
// (it ended as the leader took over, and was not adopted), goes to the
// session's stored log, not nowhere: here the store is away, and the
// leader says its use was not taken. The control: one that cannot be a
// review's use is refused before that.
func TestRelayReviewOfUnheld(t *testing.T) {
	var logs lockedBuffer
	srv, _ := testLeader(t, slog.New(slog.NewTextHandler(&logs, nil)))
	sid := ids.NewSession()
	review := &previewClaims{Session: sid, Tenant: "t", Scope: ScopeReview, RegisteredClaims: jwt.RegisteredClaims{ID: "p-review"}}
	srv.relayEvent(review, relayEvent{Type: "review_opened", Viewer: "not a digest"})
	if !strings.Contains(logs.String(), "cannot be; not recorded") {
		t.Errorf("a use that cannot be was not refused:\n%s", logs.String())
	}
	srv.relayEvent(review, relayEvent{Type: "review_opened", Viewer: "0123456789abcdef"})
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "its stored log did not take it") {
		if time.Now().After(deadline) {
			t.Fatalf("the use of an unheld session's review link went nowhere:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testLeader is a leader's server with a session manager of no
// sandboxes and no artifact store.
func testLeader(t *testing.T, log *slog.Logger) (*Server, *session.Manager) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	mgr, err := session.New(ctx, nil, session.Config{Backend: noSandboxes{}, StateDir: t.TempDir()}, log)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse("http://gw.test:8080")
	srv, err := New(Config{PublicURL: u, TokenKeys: map[string]string{"k1": strings.Repeat("a", 32)}, ActiveKey: "k1"}, mgr, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	return srv, mgr
}

// droppingLeader listens as a leader that takes each connection, reads
// the first byte of its request, and closes it without an answer.
func droppingLeader(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.ReadAll(io.LimitReader(c, 1))
			c.Close()
		}
	}()
	return ln
}
