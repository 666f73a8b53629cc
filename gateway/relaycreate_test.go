package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/profile"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/vault"
)

// TestRelayCreateAlone: POST /v1/sessions that no leader takes is
// answered by the relay with RelayAlone.Create: the spec as the leader
// would make it (the tenant's, its allow list first, the request's
// labels and shape), 201 with the session and the preview asked for,
// signed with the gateway's keys (a review link too). What only a
// leader does (wait=false; a profile on a replica that opens no profile
// store, a snapshot on one without a store, a recording on one that
// places none, credentials on one without a vault) gets a
// 503 to retry, before the request's own checks and without a create,
// as does any while the artifact store does not answer; a junk
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
	alone.Create = func(ctx context.Context, spec session.Spec, lim session.TenantLimits, extra func(context.Context, session.Info, session.Endpoint) ([]session.Event, error)) (session.Info, error) {
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
			evs, err := extra(ctx, info, session.Endpoint{})
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
		{"a profile, on a replica that opens no profile store", "good", `{"profile":{"id":"prof_0123456789abcdef"}}`, "/v1/sessions"},
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

// shareCalls is a RecordingShare that notes what it is asked
// (TestRelayCreateRecordedAlone): placements, leaves and stops.
type shareCalls struct {
	mu     sync.Mutex
	placed []map[string]string
	ready  chan struct{}
	fail   error // Place's
	left   []<-chan struct{}
	stops  []string
}

func (f *shareCalls) Place(_ context.Context, id string, params map[string]string, _ func(string, time.Time, bool, map[string]any)) (<-chan struct{}, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.placed = append(f.placed, params)
	return f.ready, false, f.fail
}

func (f *shareCalls) Leave(id string, ready <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.left = append(f.left, ready)
}

func (f *shareCalls) Stop(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stops = append(f.stops, id)
	return nil
}

func (f *shareCalls) Collect(context.Context, string) (string, error)   { return "", nil }
func (f *shareCalls) Placed(context.Context) ([]PlacedRecording, error) { return nil, nil }

// TestRelayCreateRecordedAlone: a create that records, answered alone,
// places the session's recording with the replicas once it answers, as
// the leader does (its display's address, its screen, its tenant), and
// waits until it records; recording_started is stored with its first
// events, before the preview's issue (the leader's order), and the
// relay leaves the recording to the leader that adopts the session.
// One whose recording cannot be placed is refused (503 to retry), and
// the recording stopped (its lease may have been written all the same);
// one that fails after the recording was placed has it stopped too.
// A recording that has not begun by the deadline extra is given is
// handed out all the same, the create answered. A relay that cannot
// record (RecordAlone not called) has a create that records wait for a
// leader. The control: without a recording, nothing is placed.
func TestRelayCreateRecordedAlone(t *testing.T) {
	srv := testRelay(t, "http://127.0.0.1:1", func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} })
	share := &shareCalls{ready: make(chan struct{})}
	close(share.ready)
	vnc := netip.MustParseAddrPort("10.9.8.7:5900")
	var mu sync.Mutex
	var stored []session.Event
	var failAfter error   // the create's, once extra has run
	extraFor := time.Hour // the deadline extra is given
	alone := sessionlessAlone()
	alone.Create = func(ctx context.Context, spec session.Spec, lim session.TenantLimits, extra func(context.Context, session.Info, session.Endpoint) ([]session.Event, error)) (session.Info, error) {
		now := time.Now().UTC()
		info := session.Info{ID: ids.NewSession(), Tenant: spec.Tenant, Kind: session.KindBrowser, Runtime: "runc", State: session.StateRunning,
			CreatedAt: now, ExpiresAt: now.Add(spec.TTL), Record: spec.Record, Screen: session.Screen{Width: 1280, Height: 800}}
		xctx, cancel := context.WithTimeout(ctx, extraFor)
		evs, err := extra(xctx, info, session.Endpoint{VNC: vnc})
		cancel()
		if err != nil {
			return session.Info{}, err
		}
		mu.Lock()
		defer mu.Unlock()
		if failAfter != nil {
			return session.Info{}, failAfter
		}
		stored = append(stored, evs...)
		return info, nil
	}
	srv.AdmitAlone(alone)
	srv.live.(*relayLive).storeOK.Store(true)

	if st, body, retry := relayCall(t, srv, "POST", "/v1/sessions", "good", `{"record":true}`); st != 503 || retry != "2" || !strings.Contains(body, "cannot record") || len(stored) != 0 {
		t.Errorf("a create alone that records, on a relay that cannot record: %d %s (Retry-After %q); want 503 to retry", st, body, retry)
	}
	srv.RecordAlone(share)
	if st, body, _ := relayCall(t, srv, "POST", "/v1/sessions", "good", `{}`); st != 201 || len(share.placed) != 0 || len(stored) != 0 {
		t.Fatalf("a create alone without a recording: %d %s, %d placed, stored %+v", st, body, len(share.placed), stored)
	}
	st, body, _ := relayCall(t, srv, "POST", "/v1/sessions", "good", `{"record":true,"preview":{"scope":"view","ttl_seconds":60}}`)
	var out struct {
		ID     string
		Record bool
	}
	if err := json.Unmarshal([]byte(body), &out); st != 201 || err != nil || !out.Record {
		t.Fatalf("a create alone that records: %d %s", st, body)
	}
	want := map[string]string{"tenant": "t", "session": out.ID, "vnc": vnc.String(), "width": "1280", "height": "800"}
	if len(share.placed) != 1 || !maps.Equal(share.placed[0], want) {
		t.Errorf("the recording placed by a create alone: %v, want %v", share.placed, want)
	}
	if len(stored) != 2 || stored[0].Type != "recording_started" || stored[1].Type != "preview_issued" {
		t.Errorf("the events stored with the first ones of a create alone that records: %+v, want recording_started then preview_issued", stored)
	}
	if len(share.left) != 1 || share.left[0] != share.ready || len(share.stops) != 0 {
		t.Errorf("a create alone that records: left %d placements (want its own), stopped %v (want none)", len(share.left), share.stops)
	}

	share.fail = errors.New("the API server does not answer")
	if st, body, retry := relayCall(t, srv, "POST", "/v1/sessions", "good", `{"record":true}`); st != 503 || retry != "2" || len(share.stops) != 1 || len(stored) != 2 {
		t.Errorf("a create alone whose recording cannot be placed: %d %s (Retry-After %q), stopped %v; want 503 to retry, its recording stopped", st, body, retry, share.stops)
	}
	share.fail = nil
	mu.Lock()
	failAfter = &session.PublicError{Class: session.ErrUnavailable, Msg: "the session's sandbox stopped as it started", RetryAfter: 2}
	mu.Unlock()
	if st, body, _ := relayCall(t, srv, "POST", "/v1/sessions", "good", `{"record":true}`); st != 503 || len(share.stops) != 2 || share.stops[1] == share.stops[0] {
		t.Errorf("a create alone that fails once its recording was placed: %d %s, stopped %v; want 503, its recording stopped", st, body, share.stops)
	}
	mu.Lock()
	failAfter = nil
	mu.Unlock()

	// A recording that does not begin: the wait ends at extra's
	// deadline, and the session is handed out.
	share.ready = make(chan struct{})
	extraFor = 300 * time.Millisecond
	at := time.Now()
	if st, body, _ := relayCall(t, srv, "POST", "/v1/sessions", "good", `{"record":true}`); st != 201 || time.Since(at) > 10*time.Second ||
		stored[len(stored)-1].Type != "recording_started" || len(share.stops) != 2 {
		t.Errorf("a create alone whose recording does not begin by extra's deadline: %d %s after %v, stopped %v; want 201 at the deadline", st, body, time.Since(at), share.stops)
	}
}

// TestRelayCreateProfileAlone: a create from a profile that no leader
// takes is checked as the leader checks it: a profile id that is none,
// or a desktop's profile, 400 before the replica's profile store is
// opened; a store that cannot open, 503 to retry; none on the replica
// (no vault.key), the leader's 503, not to retry; none of these makes a
// session. (A profile that opens, written into a session made alone and
// held by the Pods' records, is TestKubeRelayProfile's: the store is
// MinIO, the session a Pod.)
func TestRelayCreateProfileAlone(t *testing.T) {
	srv := testRelay(t, "http://127.0.0.1:1", func(id string) session.Sandbox { return failingSandbox{id: id, started: make(chan string, 1)} })
	var made, opened atomic.Int32
	var mu sync.Mutex
	open := func(context.Context) (*profile.Store, error) { return nil, errors.New("MinIO does not answer") }
	alone := sessionlessAlone()
	alone.Profiles = func(ctx context.Context) (*profile.Store, error) {
		opened.Add(1)
		mu.Lock()
		defer mu.Unlock()
		return open(ctx)
	}
	alone.Create = func(context.Context, session.Spec, session.TenantLimits, func(context.Context, session.Info, session.Endpoint) ([]session.Event, error)) (session.Info, error) {
		made.Add(1)
		return session.Info{}, errors.New("not made in this test")
	}
	srv.AdmitAlone(alone)
	srv.live.(*relayLive).storeOK.Store(true)
	for _, c := range []struct {
		why, body  string
		want       int
		msg, retry string
		opened     bool
	}{
		{"a profile id that is none", `{"profile":{"id":"junk"}}`, 400, "profile.id must be a profile id", "", false},
		{"a desktop's profile", `{"kind":"desktop","profile":{"id":"prof_0123456789abcdef"}}`, 400, "a desktop session cannot take one", "", false},
		{"a store that cannot open", `{"profile":{"id":"prof_0123456789abcdef"}}`, 503, "retry", "2", true},
	} {
		opened.Store(0)
		st, body, retry := relayCall(t, srv, "POST", "/v1/sessions", "good", c.body)
		if st != c.want || !strings.Contains(body, c.msg) || retry != c.retry || (opened.Load() > 0) != c.opened {
			t.Errorf("a create alone, %s: %d %s (Retry-After %q, the store opened %d times), want %d with %q (Retry-After %q, opened %v)",
				c.why, st, body, retry, opened.Load(), c.want, c.msg, c.retry, c.opened)
		}
	}
	mu.Lock()
	open = func(context.Context) (*profile.Store, error) { return nil, nil }
	mu.Unlock()
	if st, body, retry := relayCall(t, srv, "POST", "/v1/sessions", "good", `{"profile":{"id":"prof_0123456789abcdef"}}`); st != 503 || !strings.Contains(body, "vault.key is not configured") || retry != "" {
		t.Errorf("a create alone from a profile, no vault.key: %d %s (Retry-After %q), want the leader's 503, not to retry", st, body, retry)
	}
	if made.Load() != 0 {
		t.Errorf("%d sessions made by the creates from a profile that were refused", made.Load())
	}
}

// TestProfileReadError: a profile's stored version that fails as it goes
// into a session is a conflict if it was altered, not found if it went
// meanwhile (neither to retry), and a 503 to retry if the store did not
// answer; the message names the profile and never the store's error.
func TestProfileReadError(t *testing.T) {
	for _, c := range []struct {
		name  string
		err   error
		class error
		retry int
	}{
		{"altered", fmt.Errorf("%w: version 2 of profile prof_00000000000000aa is missing from the store", profile.ErrTampered), session.ErrConflict, 0},
		{"gone", fmt.Errorf("%w: prof_00000000000000aa", profile.ErrNotFound), session.ErrNotFound, 0},
		{"a store that does not answer", errors.New("dial tcp 10.0.0.7:9000: connection refused"), session.ErrUnavailable, 2},
	} {
		var pe *session.PublicError
		if err := profileReadError("prof_00000000000000aa", c.err); !errors.As(err, &pe) || !errors.Is(pe.Class, c.class) || pe.RetryAfter != c.retry ||
			!strings.Contains(pe.Msg, "prof_00000000000000aa") || strings.Contains(pe.Msg, "10.0.0.7") {
			t.Errorf("%s: %v, want %v with Retry-After %d", c.name, err, c.class, c.retry)
		}
	}
}
