package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/profile"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/tenant"
	"github.com/sandgate/sandgate/vault"
)

// closeCount counts its closes: a connection a relay carries.
type closeCount struct {
	mu sync.Mutex
	n  int
}

func (c *closeCount) Close() error { c.mu.Lock(); c.n++; c.mu.Unlock(); return nil }
func (c *closeCount) closed() int  { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// TestRelayAloneExtendsAndDeletes: while no leader answers, a relay
// extends a session by its Pod's record (the new expiry written, within
// the tenant's maximum TTL) and deletes one by marking the record
// stopping with the time asked, ending the connections it carries to
// that session and no other's. A stopping session is deleted again
// (nothing written) and not extended (409); a starting one waits for a
// leader (503); another tenant's, a pooled Pod's or none is not found
// (404), and nothing is written for them; an API server that does not
// answer is a 503; bad input is a 400 and an unknown key a 401, before
// anything is read. The control: with a leader, the leader answers
// and no record is touched.
func TestRelayAloneExtendsAndDeletes(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Second)
	rec := func(id, tenantName string, age time.Duration, state string) map[string]string {
		return map[string]string{"sandgate.session": id, session.RecordTenant: tenantName, "sandgate.created": now.Add(-age).Format(time.RFC3339Nano),
			session.RecordExpires: now.Add(10 * time.Minute).Format(time.RFC3339Nano), session.RecordAddr: "10.1.2.3", session.RecordState: state,
			"sandgate.info": `{"kind":"browser","runtime":"gvisor","screen":{"width":800,"height":600}}`}
	}
	name := map[string]string{}
	for _, n := range []string{"running", "doomed", "starting", "stopping", "other", "pooled", "old"} {
		name[n] = ids.NewSession()
	}
	var mu sync.Mutex
	pods := map[string]map[string]string{
		name["running"]: rec(name["running"], "t", time.Minute, "running"), name["doomed"]: rec(name["doomed"], "t", time.Minute, "running"),
		name["starting"]: rec(name["starting"], "t", 0, "starting"), name["stopping"]: rec(name["stopping"], "t", time.Minute, "stopping"),
		name["other"]: rec(name["other"], "u", time.Minute, "running"), name["pooled"]: rec(name["pooled"], "t", time.Minute, "running"),
		name["old"]: rec(name["old"], "t", 50*time.Minute, "running"),
	}
	pods[name["pooled"]]["sandgate.pool"] = "browser-gvisor"
	unreadable := ids.NewSession()
	writes := map[string]int{}
	snapshot := func() map[string]map[string]string {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]map[string]string{}
		for id, r := range pods {
			out[id] = maps.Clone(r)
		}
		return out
	}

	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"leader":%q}`, r.Method+" "+r.URL.Path)
	}))
	srv := testRelay(t, leader.URL, func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} })
	srv.AdmitAlone(RelayAlone{
		Tenant: testTenants(session.TenantLimits{MaxTTL: time.Hour}),
		Session: func(_ context.Context, id string) (map[string]string, bool, error) {
			mu.Lock()
			defer mu.Unlock()
			if r, ok := pods[id]; ok {
				return maps.Clone(r), true, nil
			}
			return nil, false, session.ErrSandboxGone
		},
		List:    func(context.Context, string) ([]AloneRecord, error) { return nil, nil },
		Enabled: func(string) error { return nil },
		Revoked: func(string, string) (bool, error) { return false, nil },
		Fresh:   func() time.Time { return time.Now() },
		Update: func(_ context.Context, id string, change func(map[string]string, bool) (map[string]string, error)) (map[string]string, bool, error) {
			if id == unreadable {
				return nil, false, errors.New("the API server does not answer")
			}
			mu.Lock()
			defer mu.Unlock()
			r, ok := pods[id]
			if !ok {
				return nil, false, fmt.Errorf("%w: no Pod", session.ErrSandboxGone)
			}
			set, err := change(maps.Clone(r), true)
			if err != nil {
				return nil, false, err
			}
			if len(set) > 0 {
				writes[id]++
				for k, v := range set {
					r[k] = v
				}
			}
			return maps.Clone(r), true, nil
		},
	})
	call := func(method, path, key, body string) (int, string, string) {
		t.Helper()
		return relayCall(t, srv, method, path, key, body)
	}
	extend := func(id, key, body string) (int, string, string) {
		t.Helper()
		return call("POST", "/v1/sessions/"+id+"/extend", key, body)
	}
	del := func(id, key string) (int, string, string) {
		t.Helper()
		return call("DELETE", "/v1/sessions/"+id, key, "")
	}

	// The control: a leader answers, and nothing is written here.
	before := snapshot()
	if st, body, _ := extend(name["running"], "good", `{"ttl_seconds":600}`); st != 200 || body != `{"leader":"POST /v1/sessions/`+name["running"]+`/extend"}` {
		t.Fatalf("an extension with a leader: %d %s, want the leader's answer", st, body)
	}
	if st, body, _ := del(name["doomed"], "good"); st != 200 || body != `{"leader":"DELETE /v1/sessions/`+name["doomed"]+`"}` {
		t.Fatalf("a delete with a leader: %d %s, want the leader's answer", st, body)
	}
	if got := snapshot(); !maps.EqualFunc(got, before, maps.Equal) {
		t.Fatal("a record was written while a leader answered")
	}
	leader.Close()
	// (A POST over a connection the dead leader kept is a 503 that does
	// not say to retry: it may have been carried out. Not under test.)
	l := srv.live.(*relayLive)
	l.client.CloseIdleConnections()

	// The relay's connections: two to the doomed session, one to another.
	doomedA, doomedB, kept := &closeCount{}, &closeCount{}, &closeCount{}
	l.mu.Lock()
	l.reached = time.Now() // as the first tracked connection sets it
	l.conns["a"] = &relayConn{session: name["doomed"], closer: doomedA}
	l.conns["b"] = &relayConn{session: name["doomed"], closer: doomedB}
	l.conns["c"] = &relayConn{session: name["running"], closer: kept}
	l.mu.Unlock()

	st, body, _ := extend(name["running"], "good", `{"ttl_seconds":1800}`)
	var info session.Info
	if err := json.Unmarshal([]byte(body), &info); st != 200 || err != nil || info.ID != name["running"] || info.State != session.StateRunning {
		t.Fatalf("an extension alone: %d %s", st, body)
	}
	exp, err := time.Parse(time.RFC3339Nano, snapshot()[name["running"]][session.RecordExpires])
	if err != nil || exp.Before(time.Now().Add(29*time.Minute)) || exp.After(time.Now().Add(31*time.Minute)) || !info.ExpiresAt.Equal(exp) {
		t.Errorf("the extended record's expiry: %v %v (answered %v), want 30 minutes from now", exp, err, info.ExpiresAt)
	}

	st, body, _ = del(name["doomed"], "good")
	if err := json.Unmarshal([]byte(body), &info); st != 200 || err != nil || info.ID != name["doomed"] || info.State != session.StateStopping {
		t.Fatalf("a delete alone: %d %s", st, body)
	}
	r := snapshot()[name["doomed"]]
	asked, err := time.Parse(time.RFC3339Nano, r[session.RecordStopAsked])
	if r[session.RecordState] != "stopping" || err != nil || time.Since(asked) > time.Minute || asked.After(time.Now()) {
		t.Errorf("the deleted record: state %q, asked %q", r[session.RecordState], r[session.RecordStopAsked])
	}
	// (Closed apart from the answer: waited for, within 5 s.)
	for deadline := time.Now().Add(5 * time.Second); (doomedA.closed() != 1 || doomedB.closed() != 1) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if doomedA.closed() != 1 || doomedB.closed() != 1 || kept.closed() != 0 {
		t.Errorf("connections closed: the deleted session's %d and %d, another's %d; want 1, 1, 0", doomedA.closed(), doomedB.closed(), kept.closed())
	}
	// Deleted again: answered stopping, nothing written; extended: 409.
	mu.Lock()
	w := writes[name["doomed"]]
	mu.Unlock()
	if st, body, _ := del(name["doomed"], "good"); st != 200 || !strings.Contains(body, `"state":"stopping"`) {
		t.Errorf("a second delete: %d %s", st, body)
	}
	mu.Lock()
	if writes[name["doomed"]] != w {
		t.Errorf("a second delete wrote the record again")
	}
	mu.Unlock()

	before = snapshot()
	for _, tc := range []struct {
		method, id, key, body string
		want                  int
	}{
		{"POST", name["doomed"], "good", `{"ttl_seconds":60}`, 409},
		{"POST", name["stopping"], "good", `{"ttl_seconds":60}`, 409},
		{"POST", name["starting"], "good", `{"ttl_seconds":60}`, 503},
		{"DELETE", name["starting"], "good", "", 503},
		{"POST", name["other"], "good", `{"ttl_seconds":60}`, 404}, {"DELETE", name["other"], "good", "", 404},
		{"POST", name["pooled"], "good", `{"ttl_seconds":60}`, 404}, {"DELETE", name["pooled"], "good", "", 404},
		{"POST", ids.NewSession(), "good", `{"ttl_seconds":60}`, 404}, {"DELETE", ids.NewSession(), "good", "", 404},
		{"POST", "junk", "good", `{"ttl_seconds":60}`, 404}, {"DELETE", "junk", "good", "", 404},
		{"POST", unreadable, "good", `{"ttl_seconds":60}`, 503}, {"DELETE", unreadable, "good", "", 503},
		// Past the tenant's maximum TTL (an hour from creation): the
		// leader's 400.
		{"POST", name["old"], "good", `{"ttl_seconds":900}`, 400},
		{"POST", name["running"], "good", `{}`, 400}, {"POST", name["running"], "good", `{"ttl_seconds":0}`, 400},
		{"POST", name["running"], "good", `{"ttl_seconds":"x"}`, 400}, {"POST", name["running"], "good", `{"ttl_seconds":60,"x":1}`, 400},
		{"POST", name["running"], "junk", `{"ttl_seconds":60}`, 401}, {"DELETE", name["running"], "junk", "", 401},
		{"POST", name["running"], "off", `{"ttl_seconds":60}`, 403}, {"DELETE", name["running"], "off", "", 403},
		{"POST", name["running"], "stale", `{"ttl_seconds":60}`, 503}, {"DELETE", name["running"], "stale", "", 503},
	} {
		path := "/v1/sessions/" + tc.id
		if tc.method == "POST" {
			path += "/extend"
		}
		st, body, ra := call(tc.method, path, tc.key, tc.body)
		if st != tc.want || (st == 503) != (ra != "") || !strings.Contains(body, `"error"`) {
			t.Errorf("%s %s with key %q, %s: %d %s (Retry-After %q), want %d", tc.method, path, tc.key, tc.body, st, body, ra, tc.want)
		}
	}
	if got := snapshot(); !maps.EqualFunc(got, before, maps.Equal) {
		t.Error("a refused extension or delete wrote a record")
	}
	// Within the maximum: the old session extended by a minute less
	// than its remaining ten.
	if st, body, _ := extend(name["old"], "good", `{"ttl_seconds":540}`); st != 200 {
		t.Errorf("an extension within the maximum TTL: %d %s", st, body)
	}
}

// TestRelayAloneCredentials: while no leader answers, a relay answers
// the credential routes with its own vault (RelayAlone.Vault), by the
// key's tenant as its copy has it. The control: with a leader, the
// leader answers. Alone: an unknown key is a 401 and a disabled
// tenant's a 403 before the vault is asked, as is an id that is none
// (404); the vault is asked within 5 s; no vault.key is the leader's
// 503 (no Retry-After), a vault that cannot be opened a 503 to retry,
// and a replica that opens none a 503 to retry. Once the vault opened,
// the answer has 5 s, and a read that fails says to retry where a
// store or a delete (which may have been done) does not, as the
// leader's. (The vault's own answers, against MinIO: TestKubeRelay.)
func TestRelayAloneCredentials(t *testing.T) {
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"leader":%q}`, r.Method+" "+r.URL.Path)
	}))
	srv := testRelay(t, leader.URL, func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} })
	var mu sync.Mutex
	var opened int
	open := func(context.Context) (*vault.Vault, error) { return nil, errors.New("MinIO does not answer") }
	alone := sessionlessAlone()
	withVault := alone
	withVault.Vault = func(ctx context.Context) (*vault.Vault, error) {
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > 5*time.Second {
			t.Errorf("the vault is asked for with %v left (a deadline: %v), want 5 s at most", time.Until(d), ok)
		}
		mu.Lock()
		defer mu.Unlock()
		opened++
		return open(ctx)
	}
	srv.AdmitAlone(withVault)
	cid := ids.NewCredential()
	routes := [][3]string{{"POST", "/v1/credentials", `{"name":"qa","kind":"password","username":"u","secret":"s"}`},
		{"GET", "/v1/credentials", ""}, {"GET", "/v1/credentials/" + cid, ""}, {"DELETE", "/v1/credentials/" + cid, ""}}
	for _, r := range routes {
		if st, body, _ := relayCall(t, srv, r[0], r[1], "good", r[2]); st != 200 || body != `{"leader":"`+r[0]+" "+r[1]+`"}` {
			t.Fatalf("%s %s with a leader: %d %s, want the leader's answer", r[0], r[1], st, body)
		}
	}
	leader.Close()
	srv.live.(*relayLive).client.CloseIdleConnections()
	// A replica that opens no vault: a relay of its own.
	bare := testRelay(t, leader.URL, func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} })
	bare.AdmitAlone(alone)

	check := func(srv *Server, what, key string, want int, wantMsg, wantRetry string, wantOpened bool) {
		t.Helper()
		for _, r := range routes {
			mu.Lock()
			opened = 0
			mu.Unlock()
			st, body, retry := relayCall(t, srv, r[0], r[1], key, r[2])
			mu.Lock()
			n := opened
			mu.Unlock()
			if st != want || !strings.Contains(body, wantMsg) || retry != wantRetry || (n > 0) != wantOpened {
				t.Errorf("%s: %s %s: %d %s (Retry-After %q, vault asked %d times), want %d with %q (Retry-After %q, asked %v)",
					what, r[0], r[1], st, body, retry, n, want, wantMsg, wantRetry, wantOpened)
			}
		}
	}
	// (Every request: the first after the leader's death, whose 503 is
	// dropped, and those that follow, made alone at once.)
	check(srv, "an unknown key", "nobody", 401, "the API key is not valid", "", false)
	check(srv, "a disabled tenant's key", "off", 403, "the tenant is disabled", "", false)
	check(srv, "a vault that cannot open", "good", 503, "the credential vault is not answering", "2", true)
	// No vault.key: the leader's 503, which does not say to retry.
	open = func(context.Context) (*vault.Vault, error) { return nil, nil }
	check(srv, "no vault.key", "good", 503, "vault.key is not configured", "", true)
	check(bare, "a replica that opens no vault", "good", 503, "the gateway cannot check the request now", "2", false)
	mu.Lock()
	opened = 0
	mu.Unlock()
	for _, m := range []string{"GET", "DELETE"} {
		st, body, _ := relayCall(t, srv, m, "/v1/credentials/junk", "good", "")
		mu.Lock()
		n := opened
		mu.Unlock()
		if st != 404 || n != 0 {
			t.Errorf("%s of a credential id that is none: %d %s, the vault asked %d times; want 404 unasked", m, st, body, n)
		}
	}

	// Once the vault opened: what the answer makes of a vault that
	// fails, through vaultAlone, as the relay serves it.
	open = func(context.Context) (*vault.Vault, error) { return &vault.Vault{}, nil }
	l := srv.live.(*relayLive)
	app := fiber.New(fiber.Config{ErrorHandler: errorHandler(slog.New(slog.DiscardHandler))})
	failing := l.vaultAlone(func(c *fiber.Ctx, v *vault.Vault, tenantName string) error {
		if d, ok := c.UserContext().Deadline(); !ok || time.Until(d) > 5*time.Second || v == nil || tenantName != "t" {
			t.Errorf("%s answered with %v left (a deadline: %v), vault %v, tenant %q; want 5 s at most, the vault and t", c.Method(), time.Until(d), ok, v, tenantName)
		}
		return vaultError(errors.New("MinIO stopped answering"))
	})
	app.Post("/v1/credentials", failing)
	app.Get("/v1/credentials", failing)
	app.Delete("/v1/credentials/:cid", failing)
	for _, r := range [][3]string{{"POST", "/v1/credentials", ""}, {"GET", "/v1/credentials", "2"}, {"DELETE", "/v1/credentials/" + cid, ""}} {
		req := httptest.NewRequest(r[0], "http://gw.test:8080"+r[1], nil)
		req.Header.Set("Authorization", "Bearer good")
		resp, err := app.Test(req, 10000)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != r[2] {
			t.Errorf("%s %s, the vault failing: %d, Retry-After %q; want 503 and %q", r[0], r[1], resp.StatusCode, resp.Header.Get("Retry-After"), r[2])
		}
	}
}

// TestRelayUnansweredWrites: a request a relay passes on to a leader
// that takes it and drops the connection may have been carried out,
// and is not answered alone: a store (a credential's) gets a 503 that
// does not say to retry, as does a fill (it may have typed); a delete
// (a credential's, a session's), which may be made again, and a read
// say to retry. The control: once the
// leader's address refuses, the same requests are answered alone.
func TestRelayUnansweredWrites(t *testing.T) {
	ln := droppingLeader(t)
	srv := testRelay(t, "http://"+ln.Addr().String(), func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} })
	var asked atomic.Int32
	srv.AdmitAlone(RelayAlone{
		Tenant: testTenants(session.TenantLimits{MaxTTL: time.Hour}),
		Session: func(context.Context, string) (map[string]string, bool, error) {
			asked.Add(1)
			return nil, false, session.ErrSandboxGone
		},
		List:    func(context.Context, string) ([]AloneRecord, error) { asked.Add(1); return nil, nil },
		Enabled: func(string) error { return nil },
		Revoked: func(string, string) (bool, error) { return false, nil },
		Fresh:   func() time.Time { return time.Now() },
		Vault:   func(context.Context) (*vault.Vault, error) { asked.Add(1); return nil, errors.New("not to be asked") },
		Update: func(context.Context, string, func(map[string]string, bool) (map[string]string, error)) (map[string]string, bool, error) {
			asked.Add(1)
			return nil, false, session.ErrSandboxGone
		},
	})
	fill := `{"action":"fill_credential","credential":"` + ids.NewCredential() + `","selector":"#p"}`
	requests := [][4]string{{"POST", "/v1/credentials", ""}, {"DELETE", "/v1/credentials/" + ids.NewCredential(), "2"},
		{"DELETE", "/v1/sessions/" + ids.NewSession(), "2"}, {"GET", "/v1/credentials", "2"},
		{"POST", "/v1/sessions/" + ids.NewSession() + "/actions", "", fill}}
	for _, r := range requests {
		st, body, retry := relayCall(t, srv, r[0], r[1], "good", r[3])
		if st != 503 || retry != r[2] || !strings.Contains(body, "may have been carried out") {
			t.Errorf("%s %s, the leader dropping it: %d %s (Retry-After %q), want 503 (Retry-After %q)", r[0], r[1], st, body, retry, r[2])
		}
	}
	if asked.Load() != 0 {
		t.Errorf("requests a leader took were answered alone too (%d asks)", asked.Load())
	}
	ln.Close()
	for _, r := range requests {
		before := asked.Load()
		if st, body, _ := relayCall(t, srv, r[0], r[1], "good", r[3]); strings.Contains(body, "may have been carried out") || asked.Load() == before {
			t.Errorf("%s %s, the leader's address refusing: %d %s, want it answered alone", r[0], r[1], st, body)
		}
	}
}

// TestRelayFillAlone: a fill_credential no leader takes is filled by
// the relay as the leader would, with the replica's own vault, its
// refusals the leader's: an unknown key 401 and a disabled tenant 403
// (the vault not asked), another tenant's session or none 404, a bad
// body 400, a desktop 409; a vault that cannot open a 503 to retry, no
// vault.key the leader's 503 (not to retry). The control: while a
// leader takes it, the leader answers it whole.
func TestRelayFillAlone(t *testing.T) {
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"leader":%q}`, r.Method+" "+r.URL.Path)
	}))
	srv := testRelay(t, leader.URL, func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} })
	now := time.Now().UTC()
	rec := func(id, tenantName, kind string) map[string]string {
		return map[string]string{"sandgate.session": id, session.RecordTenant: tenantName, "sandgate.created": now.Add(-time.Minute).Format(time.RFC3339Nano),
			session.RecordExpires: now.Add(time.Hour).Format(time.RFC3339Nano), session.RecordAddr: "10.1.2.3",
			"sandgate.info": `{"kind":"` + kind + `","runtime":"runc","screen":{"width":800,"height":600}}`, "sandgate.state": "running"}
	}
	browserS, desktopS, otherS := ids.NewSession(), ids.NewSession(), ids.NewSession()
	records := map[string]map[string]string{browserS: rec(browserS, "t", "browser"), desktopS: rec(desktopS, "t", "desktop"), otherS: rec(otherS, "u", "browser")}
	var opened atomic.Int32
	var mu sync.Mutex
	open := func(context.Context) (*vault.Vault, error) { return nil, errors.New("MinIO does not answer") }
	srv.AdmitAlone(RelayAlone{
		Tenant: testTenants(session.TenantLimits{MaxTTL: time.Hour}),
		Session: func(_ context.Context, id string) (map[string]string, bool, error) {
			if r, ok := records[id]; ok {
				return r, true, nil
			}
			return nil, false, session.ErrSandboxGone
		},
		List:    func(context.Context, string) ([]AloneRecord, error) { return nil, nil },
		Enabled: func(string) error { return nil },
		Revoked: func(string, string) (bool, error) { return false, nil },
		Fresh:   func() time.Time { return time.Now() },
		Vault: func(ctx context.Context) (*vault.Vault, error) {
			opened.Add(1)
			mu.Lock()
			defer mu.Unlock()
			return open(ctx)
		},
	})
	cid := ids.NewCredential()
	fill := `{"action":"fill_credential","credential":"` + cid + `","selector":"#password"}`
	path := func(id string) string { return "/v1/sessions/" + id + "/actions" }
	if st, body, _ := relayCall(t, srv, "POST", path(browserS), "good", fill); st != 200 || body != `{"leader":"POST `+path(browserS)+`"}` {
		t.Fatalf("a fill with a leader: %d %s, want the leader's answer", st, body)
	}
	leader.Close()
	srv.live.(*relayLive).client.CloseIdleConnections()
	for _, tc := range []struct {
		why, key, id, body string
		want               int
		msg, retry         string
		vaultAsked         bool
	}{
		{"an unknown key", "nobody", browserS, fill, 401, "the API key is not valid", "", false},
		{"a disabled tenant's key", "off", browserS, fill, 403, "the tenant is disabled", "", false},
		{"another tenant's session", "good", otherS, fill, 404, "no such session", "", false},
		{"no session", "good", ids.NewSession(), fill, 404, "no such session", "", false},
		{"no selector", "good", browserS, `{"action":"fill_credential","credential":"` + cid + `"}`, 400, "selector", "", false},
		{"a credential id that is none", "good", browserS, `{"action":"fill_credential","credential":"junk","selector":"#p"}`, 400, "credential id", "", false},
		{"a desktop", "good", desktopS, fill, 409, "needs a browser session", "", false},
		{"a vault that cannot open", "good", browserS, fill, 503, "the credential vault is not answering", "2", true},
	} {
		opened.Store(0)
		st, body, retry := relayCall(t, srv, "POST", path(tc.id), tc.key, tc.body)
		if st != tc.want || !strings.Contains(body, tc.msg) || retry != tc.retry || (opened.Load() > 0) != tc.vaultAsked {
			t.Errorf("%s: %d %s (Retry-After %q, vault asked %d times), want %d with %q (Retry-After %q, asked %v)",
				tc.why, st, body, retry, opened.Load(), tc.want, tc.msg, tc.retry, tc.vaultAsked)
		}
	}
	mu.Lock()
	open = func(context.Context) (*vault.Vault, error) { return nil, nil }
	mu.Unlock()
	if st, body, retry := relayCall(t, srv, "POST", path(browserS), "good", fill); st != 503 || !strings.Contains(body, "vault.key is not configured") || retry != "" {
		t.Errorf("a fill with no vault.key: %d %s (Retry-After %q), want the leader's 503, not to retry", st, body, retry)
	}
}

// TestRelayFillFields: a fill's events a replica reports are recorded
// with the leader's own fields (as its record keeps them: a fill's
// fields through relayLive.record and back); one whose credential, field,
// mode, selector or page cannot be a fill's, or a denial with no reason,
// is not recorded.
func TestRelayFillFields(t *testing.T) {
	srv := testRelay(t, "http://127.0.0.1:1", func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} })
	l := srv.live.(*relayLive)
	cid := ids.NewCredential()
	claims := shellClaims("t", ids.NewSession(), "tok")
	good := map[string]any{"credential": cid, "selector": "#password", "field": "secret", "mode": "placeholder", "page": "https://app.test/login"}
	denied := map[string]any{"credential": cid, "selector": "#password", "field": "secret", "page": "https://elsewhere.test/", "reason": "origin"}
	l.record(claims, "fill_credential", good)
	l.record(claims, "fill_credential_denied", denied)
	l.mu.Lock()
	evs := append([]relayEvent(nil), l.events...)
	l.mu.Unlock()
	if len(evs) != 2 {
		t.Fatalf("kept %d events, want 2", len(evs))
	}
	for i, want := range []map[string]any{good, denied} {
		got, ok := relayedFill(evs[i])
		if !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("%s through a report: %v %v, want %v", evs[i].Type, got, ok, want)
		}
	}
	base := evs[0]
	for why, change := range map[string]func(*relayEvent){
		"a credential id that is none": func(ev *relayEvent) { ev.Credential = "junk" },
		"another field":                func(ev *relayEvent) { ev.Field = "password" },
		"another mode":                 func(ev *relayEvent) { ev.Mode = "plain" },
		"no selector":                  func(ev *relayEvent) { ev.Selector = "" },
		"a selector past the bound":    func(ev *relayEvent) { ev.Selector = strings.Repeat("a", maxFillSelector+1) },
		"a page past the bound":        func(ev *relayEvent) { ev.Page = strings.Repeat("p", 513) },
		"a denial with no reason":      func(ev *relayEvent) { ev.Type, ev.Mode, ev.Reason = "fill_credential_denied", "", "" },
		"a denial for no such reason":  func(ev *relayEvent) { ev.Type, ev.Mode, ev.Reason = "fill_credential_denied", "", "made up" },
		"a denial with a mode":         func(ev *relayEvent) { ev.Type, ev.Reason = "fill_credential_denied", "origin" },
		"a fill with no mode":          func(ev *relayEvent) { ev.Mode = "" },
		"a race for no such reason":    func(ev *relayEvent) { ev.Type, ev.Reason = "fill_credential_raced", "made up" },
	} {
		ev := base
		change(&ev)
		if f, ok := relayedFill(ev); ok {
			t.Errorf("%s: recorded as %v", why, f)
		}
	}
}

// TestRelayProfilesAlone: a profile's create, list or read no leader
// takes is answered by the relay, with its own profile store, after
// the leader's checks: an unknown key 401 and a disabled tenant 403
// (the store not opened); a store that cannot open, Pods that cannot
// be listed (what holds a profile) for a read, or no store on the
// replica, a 503 to retry; no vault.key, the leader's 503, not to
// retry; a profile id that is none, 404 unasked. The control: while a
// leader takes them, the leader answers them whole.
func TestRelayProfilesAlone(t *testing.T) {
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"leader":%q}`, r.Method+" "+r.URL.Path)
	}))
	srv := testRelay(t, leader.URL, func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} })
	var opened atomic.Int32
	var mu sync.Mutex
	open := func(context.Context) (*profile.Store, error) { return nil, errors.New("MinIO does not answer") }
	list := func(context.Context, string) ([]AloneRecord, error) { return nil, nil }
	var unbounded atomic.Int32
	alone := sessionlessAlone()
	alone.List = func(ctx context.Context, tenant string) ([]AloneRecord, error) {
		mu.Lock()
		defer mu.Unlock()
		return list(ctx, tenant)
	}
	alone.Profiles = func(ctx context.Context) (*profile.Store, error) {
		opened.Add(1)
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > profileAlone {
			unbounded.Add(1)
		}
		mu.Lock()
		defer mu.Unlock()
		return open(ctx)
	}
	srv.AdmitAlone(alone)
	pid := "prof_0123456789abcdef"
	requests := [][3]string{{"GET", "/v1/profiles", ""}, {"GET", "/v1/profiles/" + pid, ""}, {"DELETE", "/v1/profiles/" + pid, ""},
		{"POST", "/v1/profiles/" + pid + "/rollback", `{"version":0}`}, {"POST", "/v1/profiles", `{"name":"n"}`}}
	for _, r := range requests {
		if st, body, _ := relayCall(t, srv, r[0], r[1], "good", r[2]); st != 200 || body != `{"leader":"`+r[0]+" "+r[1]+`"}` {
			t.Errorf("%s %s with a leader: %d %s, want the leader's answer", r[0], r[1], st, body)
		}
	}
	if opened.Load() != 0 {
		t.Errorf("the profile store was opened while a leader answered")
	}
	leader.Close()
	srv.live.(*relayLive).client.CloseIdleConnections()
	for _, r := range requests {
		for _, tc := range []struct {
			why, key    string
			want        int
			msg, retry  string
			storeOpened bool
		}{
			{"an unknown key", "nobody", 401, "the API key is not valid", "", false},
			{"a disabled tenant's key", "off", 403, "the tenant is disabled", "", false},
			{"a store that cannot open", "good", 503, "retry", "2", true},
		} {
			opened.Store(0)
			st, body, retry := relayCall(t, srv, r[0], r[1], tc.key, r[2])
			if st != tc.want || !strings.Contains(body, tc.msg) || retry != tc.retry || (opened.Load() > 0) != tc.storeOpened {
				t.Errorf("%s %s, %s: %d %s (Retry-After %q, store opened %d times), want %d with %q (Retry-After %q, opened %v)",
					r[0], r[1], tc.why, st, body, retry, opened.Load(), tc.want, tc.msg, tc.retry, tc.storeOpened)
			}
		}
	}
	mu.Lock()
	open = func(context.Context) (*profile.Store, error) { return nil, nil }
	mu.Unlock()
	for _, r := range requests {
		if st, body, retry := relayCall(t, srv, r[0], r[1], "good", r[2]); st != 503 || !strings.Contains(body, "vault.key is not configured") || retry != "" {
			t.Errorf("%s %s with no vault.key: %d %s (Retry-After %q), want the leader's 503, not to retry", r[0], r[1], st, body, retry)
		}
	}
	// A store that opens (MinIO is not in these tests: TestKubeRelay
	// has the answers; this one is never read), and the tenant's Pods,
	// which say what is in use, cannot be listed: the reads, deletes
	// and rollbacks get a 503 to retry. (A create lists none: its
	// profile is held by none.)
	var listed atomic.Int32
	mu.Lock()
	open = func(context.Context) (*profile.Store, error) { return &profile.Store{}, nil }
	list = func(context.Context, string) ([]AloneRecord, error) {
		listed.Add(1)
		return nil, errors.New("the API server does not answer")
	}
	mu.Unlock()
	for _, r := range requests[:4] {
		listed.Store(0)
		if st, body, retry := relayCall(t, srv, r[0], r[1], "good", r[2]); st != 503 || retry != "2" || !strings.Contains(body, "retry") || listed.Load() == 0 {
			t.Errorf("%s %s, the Pods not listed: %d %s (Retry-After %q, listed %d times), want 503 to retry", r[0], r[1], st, body, retry, listed.Load())
		}
	}
	// A rollback whose body is bad is the leader's 400 all the same,
	// the Pods unasked (the control: the good one above asked them).
	for _, bad := range []string{`{"version":-1}`, `{}`, `{"version":"x"}`} {
		listed.Store(0)
		if st, body, _ := relayCall(t, srv, "POST", "/v1/profiles/"+pid+"/rollback", "good", bad); st != 400 || listed.Load() != 0 {
			t.Errorf("a rollback with the body %s, the Pods not listed: %d %s (listed %d times), want 400 unasked", bad, st, body, listed.Load())
		}
	}
	// A Pod of the tenant's names the profile: its session holds it, so
	// it is neither deleted nor rolled back (409), the store unasked
	// (this one would fail). The control, a delete and a rollback of a
	// profile no Pod names, is TestKubeRelay's (the store is MinIO).
	holding := func(tenantName string) []AloneRecord {
		info, _ := json.Marshal(map[string]any{"kind": "browser", "runtime": "runc", "profile": map[string]any{"id": pid, "persist": true}})
		return []AloneRecord{{Running: true, Record: map[string]string{"sandgate.session": ids.NewSession(), session.RecordTenant: tenantName,
			"sandgate.created": time.Now().UTC().Format(time.RFC3339Nano), session.RecordExpires: time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano),
			session.RecordAddr: "10.1.2.3", "sandgate.info": string(info), "sandgate.state": "running"}}}
	}
	mu.Lock()
	list = func(context.Context, string) ([]AloneRecord, error) { return holding("t"), nil }
	mu.Unlock()
	for _, r := range requests[2:4] {
		if st, body, _ := relayCall(t, srv, r[0], r[1], "good", r[2]); st != 409 || !strings.Contains(body, "in use") {
			t.Errorf("%s %s, a Pod of the tenant's naming the profile: %d %s, want 409", r[0], r[1], st, body)
		}
	}
	// A profile id that is none is not found, the store not opened,
	// as the leader's store finds none.
	opened.Store(0)
	if st, body, _ := relayCall(t, srv, "GET", "/v1/profiles/junk", "good", ""); st != 404 || !strings.Contains(body, "no such profile") || opened.Load() != 0 {
		t.Errorf("a profile id that is none: %d %s (store opened %d times), want 404 unasked", st, body, opened.Load())
	}
	// A replica with no profile store to open: a 503 to retry (a
	// leader will answer).
	if unbounded.Load() != 0 {
		t.Errorf("the profile store was opened with no bound (%d times), want within %v", unbounded.Load(), profileAlone)
	}
	srv.AdmitAlone(sessionlessAlone())
	for _, r := range requests {
		if st, body, retry := relayCall(t, srv, r[0], r[1], "good", r[2]); st != 503 || retry != "2" {
			t.Errorf("%s %s, no profile store on this replica: %d %s (Retry-After %q), want 503 to retry", r[0], r[1], st, body, retry)
		}
	}
}

// sessionlessAlone is a RelayAlone whose copies know the test tenants
// (testTenants) and no session.
func sessionlessAlone() RelayAlone {
	return RelayAlone{
		Tenant: testTenants(session.TenantLimits{MaxTTL: time.Hour}),
		Session: func(context.Context, string) (map[string]string, bool, error) {
			return nil, false, session.ErrSandboxGone
		},
		List:    func(context.Context, string) ([]AloneRecord, error) { return nil, nil },
		Enabled: func(string) error { return nil },
		Revoked: func(string, string) (bool, error) { return false, nil },
		Fresh:   func() time.Time { return time.Now() },
	}
}

// TestRelayUsageAlone: GET /v1/usage no leader takes is answered by the
// relay from the tenant's Pods' records: its sessions (starting,
// running, stopping, and one whose Pod went, which reads stopping) with
// their resources and recordings, the creates of the last minute as
// the records date them, no queue, the limits of the copy of the
// tenants; another tenant's sessions and a pool's Pod are not counted.
// Pods that cannot be listed get a 503 to retry; a junk key 401. The
// control: while a leader takes it, the leader answers it.
func TestRelayUsageAlone(t *testing.T) {
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"leader":%q}`, r.Method+" "+r.URL.Path)
	}))
	srv := testRelay(t, leader.URL, func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} })
	now := time.Now().UTC()
	rec := func(tenantName, state string, created time.Time, cpus float64, mem int, record bool) map[string]string {
		id := ids.NewSession()
		info, _ := json.Marshal(map[string]any{"kind": "browser", "runtime": "runc", "record": record, "resources": map[string]any{"cpus": cpus, "memory_mb": mem}})
		return map[string]string{"sandgate.session": id, session.RecordTenant: tenantName, "sandgate.created": created.Format(time.RFC3339Nano),
			session.RecordExpires: now.Add(time.Hour).Format(time.RFC3339Nano), session.RecordAddr: "10.1.2.3",
			"sandgate.info": string(info), "sandgate.state": state}
	}
	pool := rec("t", "running", now, 8, 8192, true)
	pool["sandgate.pool"] = "browser-runc"
	var mu sync.Mutex
	var listErr error
	records := []AloneRecord{
		{Record: rec("t", "running", now.Add(-10*time.Minute), 1, 2048, true), Running: true},
		{Record: rec("t", "starting", now.Add(-10*time.Second), 0.5, 1024, false), Running: true},
		{Record: rec("t", "stopping", now.Add(-5*time.Minute), 2, 512, true), Running: true},
		{Record: rec("t", "running", now.Add(-20*time.Second), 0.25, 256, false), Running: false}, // its Pod went
		{Record: rec("u", "running", now, 4, 4096, true), Running: true},
		{Record: pool, Running: true},
	}
	alone := sessionlessAlone()
	alone.Tenant = testTenants(session.TenantLimits{MaxTTL: time.Hour, MaxSessions: 5, MaxCPUs: 6, MaxMemoryMB: 8192, MaxRecordings: 3, MaxCreatesPerMinute: 10, MaxArtifactBytes: 1 << 30})
	alone.List = func(context.Context, string) ([]AloneRecord, error) {
		mu.Lock()
		defer mu.Unlock()
		return records, listErr
	}
	srv.AdmitAlone(alone)
	if st, body, _ := relayCall(t, srv, "GET", "/v1/usage", "good", ""); st != 200 || body != `{"leader":"GET /v1/usage"}` {
		t.Fatalf("the usage with a leader: %d %s, want the leader's answer", st, body)
	}
	leader.Close()
	srv.live.(*relayLive).client.CloseIdleConnections()
	st, body, _ := relayCall(t, srv, "GET", "/v1/usage", "good", "")
	var got session.Usage
	if err := json.Unmarshal([]byte(body), &got); st != 200 || err != nil {
		t.Fatalf("the usage alone: %d %s", st, body)
	}
	want := session.Usage{Sessions: 4, CPUs: 3.75, MemoryMB: 3840, Recordings: 2, CreatesLastMinute: 2,
		MaxSessions: 5, MaxCPUs: 6, MaxMemoryMB: 8192, MaxRecordings: 3, MaxCreatesPerMinute: 10, MaxArtifactBytes: 1 << 30}
	if got != want {
		t.Errorf("the usage alone:\n got %+v\nwant %+v", got, want)
	}
	if st, body, _ := relayCall(t, srv, "GET", "/v1/usage", "nobody", ""); st != 401 {
		t.Errorf("the usage alone, a junk key: %d %s, want 401", st, body)
	}
	mu.Lock()
	listErr = errors.New("the API server does not answer")
	mu.Unlock()
	if st, body, retry := relayCall(t, srv, "GET", "/v1/usage", "good", ""); st != 503 || retry != "2" {
		t.Errorf("the usage alone, the Pods not listed: %d %s (Retry-After %q), want 503 to retry", st, body, retry)
	}
}

// TestRelayRuntimesPoolsAdminAlone: GET /v1/runtimes, GET /v1/pools and
// the admin API's reads (tenants, a tenant, its keys) that no leader
// takes are answered by the relay: the runtimes as the backend offers
// them now; the pools as their Pods say them; the tenants by the copy
// of the registry, each with its usage from its Pods (another tenant's
// not counted in, a pool's Pod in none) and its limits. The admin key
// is checked first, before the leader is asked (a tenant's key, a view
// link's token or none 401), a tenant that is none 404, as on the
// leader, without its Pods; the keys show neither a key nor its digest. A backend, a copy or
// Pods that cannot say get a 503 to retry (the keys, which show no
// usage, are answered without the Pods); a replica that keeps none of
// them too. The control: while a leader takes them, the leader answers.
func TestRelayRuntimesPoolsAdminAlone(t *testing.T) {
	var asked atomic.Int32
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		fmt.Fprintf(w, `{"leader":%q}`, r.Method+" "+r.URL.Path)
	}))
	u, _ := url.Parse("http://gw.test:8080")
	srv, err := NewRelay(Config{PublicURL: u, TokenKeys: map[string]string{"k1": strings.Repeat("a", 32)}, ActiveKey: "k1",
		AdminKeys: map[string]bool{tenant.Digest("admin-key"): true}}, "relay-1",
		func(context.Context) (string, error) { return strings.TrimPrefix(leader.URL, "http://"), nil },
		func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} }, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := tenant.Open("", []tenant.Seed{{Tenant: tenant.Tenant{Name: "t", Limits: tenant.Limits{MaxSessions: 5, MaxCPUs: 6}}, Digests: []string{tenant.Digest("good")}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if _, err := reg.Create(tenant.Tenant{Name: "u", Limits: tenant.Limits{MaxSessions: 2}}); err != nil {
		t.Fatal(err)
	}
	issuedKey, issued, err := reg.Issue("u", "agent")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rec := func(tenantName string, created time.Time, cpus float64) map[string]string {
		info, _ := json.Marshal(map[string]any{"kind": "browser", "runtime": "runc", "resources": map[string]any{"cpus": cpus, "memory_mb": 512}})
		return map[string]string{"sandgate.session": ids.NewSession(), session.RecordTenant: tenantName, "sandgate.created": created.Format(time.RFC3339Nano),
			session.RecordExpires: now.Add(time.Hour).Format(time.RFC3339Nano), session.RecordAddr: "10.1.2.3",
			"sandgate.info": string(info), "sandgate.state": "running"}
	}
	pool := rec("", now, 8)
	pool["sandgate.pool"] = "browser-runc"
	var mu sync.Mutex
	var probeErr, copyErr, everyErr error
	every := []AloneRecord{{Record: rec("t", now.Add(-time.Hour), 1), Running: true}, {Record: rec("t", now, 0.5), Running: true},
		{Record: rec("u", now, 2), Running: true}, {Record: pool, Running: true}}
	runtimes := []session.Runtime{{Name: "kata", Isolation: "vm", Reason: "no RuntimeClass"}, {Name: "gvisor", Isolation: "kernel", Usable: true},
		{Name: "runc", Isolation: "container", Usable: true}}
	alone := sessionlessAlone()
	alone.Runtimes = func(context.Context) ([]session.Runtime, string, error) {
		mu.Lock()
		defer mu.Unlock()
		return runtimes, "gvisor", probeErr
	}
	pools := []session.PoolStats{{Key: "browser/runc/1280x800", Kind: session.KindBrowser, Runtime: "runc", Size: 2, Available: 1}}
	var poolsErr error
	alone.Pools = func(context.Context) ([]session.PoolStats, error) {
		mu.Lock()
		defer mu.Unlock()
		return pools, poolsErr
	}
	alone.Tenants = func() (tenant.Reader, error) {
		mu.Lock()
		defer mu.Unlock()
		return reg, copyErr
	}
	alone.Limits = func(t tenant.Tenant) session.TenantLimits {
		return session.TenantLimits{MaxSessions: t.MaxSessions, MaxCPUs: t.MaxCPUs}
	}
	alone.Every = func(context.Context) ([]AloneRecord, error) {
		mu.Lock()
		defer mu.Unlock()
		return every, everyErr
	}
	alone.List = func(_ context.Context, name string) ([]AloneRecord, error) {
		mu.Lock()
		defer mu.Unlock()
		var out []AloneRecord
		for _, r := range every {
			if r.Record[session.RecordTenant] == name {
				out = append(out, r)
			}
		}
		return out, everyErr
	}
	srv.AdmitAlone(alone)
	reads := [][2]string{{"/v1/runtimes", "good"}, {"/v1/pools", "good"}, {"/admin/v1/tenants", "admin-key"}, {"/admin/v1/tenants/t", "admin-key"}, {"/admin/v1/tenants/u/keys", "admin-key"}}
	for _, r := range reads {
		if st, body, _ := relayCall(t, srv, "GET", r[0], r[1], ""); st != 200 || body != `{"leader":"GET `+r[0]+`"}` {
			t.Fatalf("GET %s with a leader: %d %s, want the leader's answer", r[0], st, body)
		}
	}
	// The admin key is checked before the leader is asked: a tenant's
	// key, a view link's token and none get 401 here, the leader
	// unasked (the control: the reads above reached it).
	if asked.Load() != int32(len(reads)) {
		t.Fatalf("the leader was asked %d times, want %d", asked.Load(), len(reads))
	}
	for _, r := range reads[2:] {
		for _, key := range []string{"good", "", "eyJhbGciOiJIUzI1NiJ9.a-view-link-token.sig"} {
			if st, body, _ := relayCall(t, srv, "GET", r[0], key, ""); st != 401 {
				t.Errorf("GET %s with %q as the admin key, a leader up: %d %s, want 401", r[0], key, st, body)
			}
		}
	}
	if asked.Load() != int32(len(reads)) {
		t.Errorf("the leader was asked %d times, want %d: an admin read without the admin key went on to it", asked.Load(), len(reads))
	}
	leader.Close()
	srv.live.(*relayLive).client.CloseIdleConnections()

	st, body, _ := relayCall(t, srv, "GET", "/v1/runtimes", "good", "")
	var rts struct {
		Default  string            `json:"default"`
		Runtimes []session.Runtime `json:"runtimes"`
	}
	if err := json.Unmarshal([]byte(body), &rts); st != 200 || err != nil || rts.Default != "gvisor" || !reflect.DeepEqual(rts.Runtimes, runtimes) {
		t.Errorf("the runtimes alone: %d %s", st, body)
	}
	if st, body, _ := relayCall(t, srv, "GET", "/v1/runtimes", "nobody", ""); st != 401 {
		t.Errorf("the runtimes alone, a junk key: %d %s, want 401", st, body)
	}
	st, body, _ = relayCall(t, srv, "GET", "/v1/pools", "good", "")
	var pl struct{ Pools []session.PoolStats }
	if err := json.Unmarshal([]byte(body), &pl); st != 200 || err != nil || !reflect.DeepEqual(pl.Pools, pools) {
		t.Errorf("the pools alone: %d %s", st, body)
	}
	if st, body, _ := relayCall(t, srv, "GET", "/v1/pools", "off", ""); st != 403 {
		t.Errorf("the pools alone, a disabled tenant's key: %d %s, want 403", st, body)
	}

	st, body, _ = relayCall(t, srv, "GET", "/admin/v1/tenants", "admin-key", "")
	var list struct {
		Tenants []tenantView `json:"tenants"`
	}
	if err := json.Unmarshal([]byte(body), &list); st != 200 || err != nil || len(list.Tenants) != 2 {
		t.Fatalf("the tenants alone: %d %s", st, body)
	}
	wantT := session.Usage{Sessions: 2, CPUs: 1.5, MemoryMB: 1024, CreatesLastMinute: 1, MaxSessions: 5, MaxCPUs: 6}
	wantU := session.Usage{Sessions: 1, CPUs: 2, MemoryMB: 512, CreatesLastMinute: 1, MaxSessions: 2}
	if got := list.Tenants[0]; got.Name != "t" || got.Source != tenant.SourceConfig || got.MaxSessions != 5 || got.Usage != wantT {
		t.Errorf("tenant t alone: %+v, want its usage %+v", got, wantT)
	}
	if got := list.Tenants[1]; got.Name != "u" || got.Source != tenant.SourceAPI || got.Usage != wantU {
		t.Errorf("tenant u alone: %+v, want its usage %+v", got, wantU)
	}
	var one tenantView
	if st, body, _ := relayCall(t, srv, "GET", "/admin/v1/tenants/t", "admin-key", ""); st != 200 || json.Unmarshal([]byte(body), &one) != nil || one.Usage != wantT {
		t.Errorf("tenant t read alone: %d %s", st, body)
	}
	st, body, _ = relayCall(t, srv, "GET", "/admin/v1/tenants/u/keys", "admin-key", "")
	var keys struct {
		Keys []tenant.Key `json:"keys"`
	}
	if err := json.Unmarshal([]byte(body), &keys); st != 200 || err != nil || len(keys.Keys) != 1 || keys.Keys[0].ID != issued.ID ||
		strings.Contains(body, "sha256") || strings.Contains(body, issuedKey) || strings.Contains(body, tenant.Digest(issuedKey)) {
		t.Errorf("u's keys alone: %d %s, want the one issued (%s), neither the key nor its digest", st, body, issued.ID)
	}
	viewToken := "eyJhbGciOiJIUzI1NiJ9.a-view-link-token.sig"
	for _, r := range []struct{ path, key, why string }{
		{"/admin/v1/tenants/nobody", "admin-key", "404"}, {"/admin/v1/tenants/nobody/keys", "admin-key", "404"},
		{"/admin/v1/tenants", "good", "401"}, {"/admin/v1/tenants", "", "401"}, {"/admin/v1/tenants/u/keys", "nobody", "401"},
		{"/admin/v1/tenants", viewToken, "401"}, {"/v1/runtimes", viewToken, "401"}, {"/v1/pools", viewToken, "401"},
		{"/v1/runtimes", "admin-key", "401"},
	} {
		if st, body, _ := relayCall(t, srv, "GET", r.path, r.key, ""); fmt.Sprint(st) != r.why {
			t.Errorf("GET %s (key %q) alone: %d %s, want %s", r.path, r.key, st, body, r.why)
		}
	}

	// What cannot say: a 503 to retry, but the keys, without the Pods.
	mu.Lock()
	probeErr, everyErr = errors.New("the API server does not answer"), errors.New("the API server does not answer")
	poolsErr = probeErr
	mu.Unlock()
	for _, r := range reads[:4] {
		if st, body, retry := relayCall(t, srv, "GET", r[0], r[1], ""); st != 503 || retry != "2" {
			t.Errorf("GET %s alone, the backend not answering: %d %s (Retry-After %q), want 503 to retry", r[0], st, body, retry)
		}
	}
	if st, body, _ := relayCall(t, srv, "GET", "/admin/v1/tenants/u/keys", "admin-key", ""); st != 200 {
		t.Errorf("u's keys alone, the Pods not listed: %d %s, want 200", st, body)
	}
	// A tenant that is none is the leader's 404, its Pods not asked for.
	if st, body, _ := relayCall(t, srv, "GET", "/admin/v1/tenants/nobody", "admin-key", ""); st != 404 {
		t.Errorf("a tenant that is none alone, the Pods not listed: %d %s, want 404", st, body)
	}
	mu.Lock()
	copyErr = tenant.ErrStale
	mu.Unlock()
	if st, body, retry := relayCall(t, srv, "GET", "/admin/v1/tenants/u/keys", "admin-key", ""); st != 503 || retry != "2" {
		t.Errorf("u's keys alone, the copy out of date: %d %s (Retry-After %q), want 503 to retry", st, body, retry)
	}
	srv.AdmitAlone(sessionlessAlone())
	for _, r := range reads {
		if st, body, retry := relayCall(t, srv, "GET", r[0], r[1], ""); st != 503 || retry != "2" {
			t.Errorf("GET %s, nothing kept to answer it alone: %d %s (Retry-After %q), want 503 to retry", r[0], st, body, retry)
		}
	}
}
