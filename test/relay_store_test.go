package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/tenant"
)

// TestRelayStoreComesBack: a relay (a replica standing by) whose
// artifact store does not answer when it starts leaves actions,
// screenshots and snapshots to the leader (RelayUsable says no for them; yes for
// preview connections, the control), and carries them itself once the
// store answers again, within a few of its checks: a MinIO that was
// down when a replica started no longer costs it them for its life.
func TestRelayStoreComesBack(t *testing.T) {
	e := needE2E(t)
	back := e.minioAway(t)
	store := artifactStore(t, e)
	var logs syncBuffer
	u, _ := url.Parse("http://gw.test:8080")
	relay, err := gateway.NewRelay(gateway.Config{PublicURL: u, TokenKeys: map[string]string{"k1": strings.Repeat("a", 32)}, ActiveKey: "k1"}, "relay-test",
		func(context.Context) (string, error) { return "", nil }, nil, store, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer relay.App().Shutdown()
	actions, snapshots := gateway.Relays{Actions: true}, gateway.Relays{Snapshots: true}
	waitFor(t, 30*time.Second, "the relay to find the store not answering", func() bool {
		return strings.Contains(logs.String(), "the artifact store does not answer")
	})
	if relay.RelayUsable(actions) || relay.RelayUsable(snapshots) || !relay.RelayUsable(gateway.Relays{Previews: true}) {
		t.Fatalf("MinIO down: usable for actions %v (want false), for previews %v (want true)", relay.RelayUsable(actions), relay.RelayUsable(gateway.Relays{Previews: true}))
	}
	back()
	t0 := time.Now()
	waitFor(t, time.Minute, "the relay to take actions, screenshots and snapshots once the store answers", func() bool {
		return relay.RelayUsable(actions) && relay.RelayUsable(snapshots)
	})
	t.Logf("usable for actions %.1f s after MinIO came back", time.Since(t0).Seconds())
	if !strings.Contains(logs.String(), "the artifact store answers again") {
		t.Error("the relay's log does not say the store answers again")
	}
}

// TestStoredCopies: the copies a replica standing by admits by while no
// leader answers, against the real MinIO. A revocation stored by the
// leader reaches the copy within a few of its listings (another
// preview of the session stays admitted: the control); a key issued
// and one revoked in the stored registry reach the tenants' copy the
// same way. With MinIO gone, both copies are used until their maxAge
// and then refused (ErrStale), and both answer again once it is back.
func TestStoredCopies(t *testing.T) {
	e := needE2E(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := artifactStore(t, e)
	log := slog.New(slog.DiscardHandler)
	const every, maxAge = 200 * time.Millisecond, 2 * time.Second
	sid, revoked, kept := ids.NewSession(), ids.NewPreview(), ids.NewPreview()
	copied := store.FollowRevocations(ctx, every, maxAge, log)
	if err := store.PutRevocation(ctx, sid, revoked, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the stored revocation in the copy", func() bool {
		r, err := copied.Revoked(sid, revoked)
		return err == nil && r
	})
	if r, err := copied.Revoked(sid, kept); err != nil || r {
		t.Fatalf("another preview of the session: revoked %v, %v", r, err)
	}

	mirror := recordings.TenantsMirror{Store: store, Name: "copies-" + randHex(4)}
	owner, err := tenant.OpenMirrored("", mirror, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if _, err := owner.Create(tenant.Tenant{Name: "team"}); err != nil {
		t.Fatal(err)
	}
	gone, rec, err := owner.Issue("team", "gone")
	if err != nil {
		t.Fatal(err)
	}
	tenants := tenant.Follow(ctx, mirror, nil, every, maxAge, log)
	// Revoked, then a key issued: a copy that has the new key was read
	// after the revocation was stored (the copy lags by up to a read).
	if err := owner.Revoke("team", rec.ID); err != nil {
		t.Fatal(err)
	}
	key, _, err := owner.Issue("team", "kept")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the key issued after the copy began, in it", func() bool {
		got, err := tenants.Authenticate(key)
		return err == nil && got.Name == "team"
	})
	if _, err := tenants.Authenticate(gone); !errors.Is(err, tenant.ErrNotFound) {
		t.Fatalf("the revoked key: %v", err)
	}

	back := e.minioAway(t)
	gonePast := time.Now()
	waitFor(t, 30*time.Second, "both copies to be out of date", func() bool {
		_, rerr := copied.Revoked(sid, revoked)
		_, terr := tenants.Authenticate(key)
		return errors.Is(rerr, recordings.ErrStale) && errors.Is(terr, tenant.ErrStale)
	})
	if d := time.Since(gonePast); d < maxAge-every {
		t.Errorf("the copies went out of date %v after MinIO did, before their maxAge %v", d, maxAge)
	}
	back()
	waitFor(t, time.Minute, "both copies to answer again", func() bool {
		r, rerr := copied.Revoked(sid, revoked)
		_, terr := tenants.Authenticate(key)
		return rerr == nil && r && terr == nil
	})
}

// TestStoredLogKeepsTrail: a session that ended with no log stored (its
// gateway died after its Pod went, before the log was written) has only
// the trail its journal stored while it ran. An event added to its
// stored log afterwards (here a review link's issue, as a replica that
// stands by adds a review's use or a revocation) makes a log that begins
// with that trail, which the session's events then show; the control is
// the trail's events read before, as pieces.
func TestStoredLogKeepsTrail(t *testing.T) {
	e := needE2E(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store := artifactStore(t, e)
	id := ids.NewSession()
	t.Cleanup(func() {
		store.DropTrail(context.Background(), "tenant-a", id)
		as, _ := store.List(context.Background(), "tenant-a", id)
		for _, a := range as {
			store.Delete(context.Background(), "tenant-a", a.ID)
		}
	})
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	var piece bytes.Buffer
	for i, typ := range []string{"created", "exec", "deleted"} {
		json.NewEncoder(&piece).Encode(session.Event{Time: at.Add(time.Duration(i) * time.Second), Type: typ, Fields: map[string]any{"n": i}})
	}
	if err := store.PutTrail(ctx, "tenant-a", id, 0, piece.Bytes()); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(ctx, "tenant-a", id, recordings.KindScreenshot, "shot.png", "image/png", []byte("\x89PNG not really")); err != nil {
		t.Fatal(err)
	}
	trail, _, err := session.StoredTrail(ctx, store, "tenant-a", id)
	if err != nil || len(trail) != 3 {
		t.Fatalf("the stored trail, as pieces: %d events, %v", len(trail), err)
	}
	st, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+id+"/previews", map[string]any{"scope": "review", "ttl_seconds": 300})
	if st != 201 {
		t.Fatalf("a review link of the session: %d %s", st, body)
	}
	var types []string
	for _, ev := range e.events(t, e.keyA, id) {
		types = append(types, ev.Type)
	}
	if !slices.Equal(types, []string{"created", "exec", "deleted", "preview_issued"}) {
		t.Errorf("the session's events once its log was made: %v, want the stored trail's, then preview_issued", types)
	}
}

// TestTrailScopeMarks: a trail whose pieces are stored marked with a
// gateway's scope tag is listed with it by MinIO (the listing's
// metadata), so that a gateway passes over other gateways' trails
// without reading them. The controls, listed with no mark (to be read): an
// unmarked trail, one whose first piece is unmarked and whose next is
// marked (adopted across the upgrade), one whose pieces two scopes
// marked (adopted by a host that lost its scope); and a malformed mark is
// refused.
func TestTrailScopeMarks(t *testing.T) {
	e := needE2E(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store := artifactStore(t, e)
	const tag = "0123456789abcdef"
	marked, unmarked, adopted, moved := ids.NewSession(), ids.NewSession(), ids.NewSession(), ids.NewSession()
	t.Cleanup(func() {
		for _, id := range []string{marked, unmarked, adopted, moved} {
			store.DropTrail(context.Background(), "tenant-a", id)
		}
	})
	line := []byte(`{"type":"exec"}` + "\n")
	for _, p := range []struct {
		id, scope string
		start     int
	}{{marked, tag, 0}, {marked, tag, 1}, {unmarked, "", 0}, {adopted, "", 0}, {adopted, tag, 1}, {moved, "fedcba9876543210", 0}, {moved, tag, 1}} {
		if err := store.PutScopedTrail(ctx, "tenant-a", p.id, p.scope, p.start, line); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.PutScopedTrail(ctx, "tenant-a", marked, "not-a-tag", 2, line); err == nil {
		t.Error("a malformed scope mark was stored")
	}
	got := map[string]string{}
	err := store.Trails(ctx, func(tenant, id, scope string, newest time.Time) bool {
		if tenant == "tenant-a" && (id == marked || id == unmarked || id == adopted || id == moved) {
			got[id] = scope
			if time.Since(newest) > time.Minute {
				t.Errorf("%s's newest piece listed as written at %v", id, newest)
			}
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{marked: tag, unmarked: "", adopted: "", moved: ""}
	for id, w := range want {
		if s, ok := got[id]; !ok || s != w {
			t.Errorf("trail %s listed with scope %q (listed: %v), want %q", id, s, ok, w)
		}
	}
}

// artifactStore is the test gateway's artifact store, opened as the
// gateway opens it.
func artifactStore(t testing.TB, e *testEnv) *recordings.Store {
	t.Helper()
	store, err := recordings.Open(recordings.Config{Endpoint: e.minioAddr, AccessKey: "sandgate", SecretKey: "sandgate-test-secret", Bucket: artifactsBucket})
	if err != nil {
		t.Fatal(err)
	}
	return store
}
