package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/vault"
)

// TestRelayCreateAlone: POST /v1/sessions that no leader takes is
// answered by the relay with RelayAlone.Create: the spec as the leader
// would make it (the tenant's, its allow list first, the request's
// labels and shape), 201 with the session and the preview asked for,
// signed with the gateway's keys (a review link too). What only a
// leader does (a recording, a profile or a snapshot, wait=false,
// credentials on a replica without a vault) gets a 503 to retry, before the request's own checks and without a
// create, as does any while the artifact store does not answer; a junk
// key 401; a bad TTL 400; Create's refusals are its (over quota: 429
// with its Retry-After). The preview's issue is handed to Create, to be
// stored with the session's first events. A tenant has at most 4
// creates under way alone (503 to retry past that), another tenant's
// go on. A relay without Create has every create wait for a leader.
// The control: while a leader takes the request, the leader answers.
func TestRelayCreateAlone(t *testing.T) {
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"leader":%q}`, r.Method+" "+r.URL.Path)
	}))
	srv := testRelay(t, leader.URL, func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} })
	var mu sync.Mutex
	var specs []session.Spec
	var refuse error
	hold := make(chan struct{})
	held := make(chan struct{}, 16)
	alone := sessionlessAlone()
	alone.Tenant = func(key string) (string, session.TenantLimits, error) {
		if key == "other" {
			return "u", session.TenantLimits{MaxTTL: time.Hour}, nil
		}
		return testTenants(session.TenantLimits{MaxTTL: time.Hour, EgressAllow: []string{"tenant.example:443"}})(key)
	}
	var stored []session.Event // what extra gave, to store with the first events
	alone.Create = func(ctx context.Context, spec session.Spec, lim session.TenantLimits, extra func(session.Info) ([]session.Event, error)) (session.Info, error) {
		mu.Lock()
		specs = append(specs, spec)
		err := refuse
		mu.Unlock()
		if spec.Labels["hold"] != "" {
			held <- struct{}{}
			<-hold
		}
		if err != nil {
			return session.Info{}, err
		}
		now := time.Now().UTC()
		info := session.Info{ID: ids.NewSession(), Tenant: spec.Tenant, Kind: session.KindBrowser, Runtime: "runc", State: session.StateRunning,
			CreatedAt: now, ExpiresAt: now.Add(spec.TTL), Labels: spec.Labels}
		if extra != nil {
			evs, err := extra(info)
			if err != nil {
				return session.Info{}, err
			}
			mu.Lock()
			stored = append(stored, evs...)
			mu.Unlock()
		}
		return info, nil
	}
	srv.AdmitAlone(alone)
	srv.live.(*relayLive).storeOK.Store(true)
	// A shared view link of one of the tenant's sessions: a token, not
	// a key.
	view, err := srv.tokens.issue(previewClaims{Session: ids.NewSession(), Tenant: "t", Scope: ScopeView, ViewOnly: true,
		RegisteredClaims: jwt.RegisteredClaims{ID: "p-1", ExpiresAt: jwtTime(time.Now().Add(time.Hour))}})
	if err != nil {
		t.Fatal(err)
	}
	creates := func() int { mu.Lock(); defer mu.Unlock(); return len(specs) }

	if st, body, _ := relayCall(t, srv, "POST", "/v1/sessions", "good", `{}`); st != 200 || body != `{"leader":"POST /v1/sessions"}` || creates() != 0 {
		t.Fatalf("a create with a leader: %d %s, %d made alone; want the leader's answer", st, body, creates())
	}
	leader.Close()
	srv.live.(*relayLive).client.CloseIdleConnections()

	st, body, _ := relayCall(t, srv, "POST", "/v1/sessions", "good", `{"ttl_seconds":600,"labels":{"a":"b"},"egress":{"allow":["req.example:443"]},
		"resources":{"cpus":0.5,"memory_mb":1024},"preview":{"scope":"cdp","ttl_seconds":300}}`)
	var out struct {
		ID      string
		State   string
		Preview struct{ ID, URL, Scope string }
	}
	if err := json.Unmarshal([]byte(body), &out); st != 201 || err != nil || out.State != "running" || out.Preview.Scope != "cdp" || out.Preview.URL == "" {
		t.Fatalf("a create alone: %d %s", st, body)
	}
	tok := out.Preview.URL[strings.LastIndex(out.Preview.URL, "/")+1:]
	if claims, err := srv.tokens.verify(tok, time.Now()); err != nil || claims.Session != out.ID || claims.Tenant != "t" || claims.Scope != ScopeCDP {
		t.Errorf("the preview of a create alone: %+v %v", claims, err)
	}
	if len(stored) != 1 || stored[0].Type != "preview_issued" || stored[0].Fields["preview"] != out.Preview.ID {
		t.Errorf("the events stored with the first ones of a create alone with a preview: %+v, want its preview_issued", stored)
	}
	got := specs[0]
	if got.Tenant != "t" || got.TTL != 10*time.Minute || got.Labels["a"] != "b" || got.Resources.CPUs != 0.5 || got.Resources.MemoryMB != 1024 ||
		strings.Join(got.Egress.Allow, ",") != "tenant.example:443,req.example:443" {
		t.Errorf("the spec of a create alone: %+v", got)
	}
	for _, c := range []struct{ name, key, body, path string }{
		{"one that records", "good", `{"record":true,"ttl_seconds":-1}`, "/v1/sessions"},
		{"credentials", "good", `{"credentials":[{"credential":"cred_1"}]}`, "/v1/sessions"},
		{"a profile", "good", `{"profile":{"id":"prof_0123456789abcdef"}}`, "/v1/sessions"},
		{"a snapshot", "good", `{"snapshot":"snap"}`, "/v1/sessions"},
		{"wait=false", "good", `{}`, "/v1/sessions?wait=false"},
	} {
		if st, body, retry := relayCall(t, srv, "POST", c.path, c.key, c.body); st != 503 || retry != "2" || !strings.Contains(body, "waits for a gateway replica to lead") {
			t.Errorf("a create alone, %s: %d %s (Retry-After %q), want 503 to retry", c.name, st, body, retry)
		}
	}
	// A review link, as any preview.
	st, body, _ = relayCall(t, srv, "POST", "/v1/sessions", "good", `{"preview":{"scope":"review","ttl_seconds":60}}`)
	if err := json.Unmarshal([]byte(body), &out); st != 201 || err != nil || out.Preview.Scope != "review" || !strings.Contains(out.Preview.URL, "/review/") ||
		stored[len(stored)-1].Fields["scope"] != "review" {
		t.Errorf("a create alone with a review link: %d %s", st, body)
	}
	for _, c := range []struct {
		name, key, body string
		status          int
	}{
		{"a junk key", "junk", `{}`, 401},
		{"a view link's token", view, `{}`, 401},
		{"a bad TTL", "good", `{"ttl_seconds":-1}`, 400},
		{"not JSON", "good", `{`, 400},
	} {
		if st, body, _ := relayCall(t, srv, "POST", "/v1/sessions", c.key, c.body); st != c.status {
			t.Errorf("a create alone, %s: %d %s, want %d", c.name, st, body, c.status)
		}
	}
	if creates() != 2 {
		t.Errorf("%d creates made alone, want the first and the review link's", creates())
	}
	mu.Lock()
	refuse = &session.PublicError{Class: session.ErrQuota, Msg: "over quota: the tenant has 2 active sessions, its maximum", RetryAfter: 7}
	mu.Unlock()
	if st, body, retry := relayCall(t, srv, "POST", "/v1/sessions", "good", `{}`); st != 429 || retry != "7" || !strings.Contains(body, "quota_exceeded") {
		t.Errorf("a create alone over quota: %d %s (Retry-After %q), want 429 and Create's hint", st, body, retry)
	}
	mu.Lock()
	refuse = nil
	mu.Unlock()

	// Turns: 4 of the tenant's under way, a fifth waits (503); another
	// tenant's goes on.
	var wg sync.WaitGroup
	for range maxCreatesAlonePerTenant {
		wg.Add(1)
		go func() {
			defer wg.Done()
			relayCall(t, srv, "POST", "/v1/sessions", "good", `{"labels":{"hold":"1"}}`)
		}()
	}
	for range maxCreatesAlonePerTenant {
		<-held
	}
	if st, body, retry := relayCall(t, srv, "POST", "/v1/sessions", "good", `{}`); st != 503 || retry != "2" {
		t.Errorf("a fifth create alone of a tenant: %d %s (Retry-After %q), want 503 to retry", st, body, retry)
	}
	if st, body, _ := relayCall(t, srv, "POST", "/v1/sessions", "other", `{}`); st != 201 {
		t.Errorf("another tenant's create alone while one has 4 under way: %d %s", st, body)
	}
	close(hold)
	wg.Wait()
	if st, body, _ := relayCall(t, srv, "POST", "/v1/sessions", "good", `{}`); st != 201 {
		t.Errorf("a create alone once the tenant's are done: %d %s", st, body)
	}

	// Credentials, checked against the replica's own vault: one that
	// cannot open, 503 to retry; none configured (no vault.key), the
	// leader's 503, not to retry; neither makes a create. (One that
	// opens is TestKubeRelay's: the vault needs MinIO.)
	made := creates()
	bind := `{"credentials":[{"credential":"cred_0123456789abcdef","scheme":"https","host":"a.example","port":443}]}`
	alone.Vault = func(context.Context) (*vault.Vault, error) { return nil, errors.New("MinIO does not answer") }
	srv.AdmitAlone(alone)
	if st, body, retry := relayCall(t, srv, "POST", "/v1/sessions", "good", bind); st != 503 || retry != "2" || !strings.Contains(body, "vault") || creates() != made {
		t.Errorf("a create alone that binds credentials, the vault not opening: %d %s (Retry-After %q), %d made", st, body, retry, creates()-made)
	}
	many := `{"credentials":[` + strings.TrimSuffix(strings.Repeat(`{"credential":"cred_0123456789abcdef","scheme":"https","host":"a.example","port":443},`, 17), ",") + `]}`
	if st, body, _ := relayCall(t, srv, "POST", "/v1/sessions", "good", many); st != 400 || !strings.Contains(body, "at most 16") {
		t.Errorf("a create alone with 17 bindings, the vault not opening: %d %s, want the leader's 400", st, body)
	}
	alone.Vault = func(context.Context) (*vault.Vault, error) { return nil, nil }
	srv.AdmitAlone(alone)
	if st, body, retry := relayCall(t, srv, "POST", "/v1/sessions", "good", bind); st != 503 || retry != "" || !strings.Contains(body, "no credential vault") || creates() != made {
		t.Errorf("a create alone that binds credentials, no vault configured: %d %s (Retry-After %q), %d made", st, body, retry, creates()-made)
	}
	if st, body, _ := relayCall(t, srv, "POST", "/v1/sessions", "good", `{}`); st != 201 {
		t.Errorf("a create alone without credentials, no vault configured: %d %s", st, body)
	}

	// While the artifact store does not answer (the trail could not be
	// stored): 503 to retry, before a start.
	srv.live.(*relayLive).storeOK.Store(false)
	made = creates()
	if st, body, retry := relayCall(t, srv, "POST", "/v1/sessions", "good", `{}`); st != 503 || retry != "2" || creates() != made {
		t.Errorf("a create alone while the store does not answer: %d %s (Retry-After %q), %d started", st, body, retry, creates()-made)
	}

	// A relay that cannot create alone: every create waits.
	plain := testRelay(t, leader.URL, func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} })
	plain.AdmitAlone(sessionlessAlone())
	if st, body, retry := relayCall(t, plain, "POST", "/v1/sessions", "good", `{}`); st != 503 || retry != "2" {
		t.Errorf("a create through a relay that cannot create alone: %d %s (Retry-After %q), want 503 to retry", st, body, retry)
	}
}
