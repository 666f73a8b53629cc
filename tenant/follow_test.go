package tenant

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"
)

// TestFollow: a follower checks keys by the registry another gateway
// stores: a key issued there works once the copy is read again, and
// stops once it is revoked there or its tenant disabled; the config's
// keys work as on the owner; a copy the mirror stopped answering for is
// used until its maxAge, not after; nothing is written.
func TestFollow(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := &memMirror{}
	owner, err := OpenMirrored(filepath.Join(t.TempDir(), "tenants.json"), m, seedA(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if _, err := owner.Create(Tenant{Name: "b"}); err != nil {
		t.Fatal(err)
	}
	key, rec, err := owner.Issue("b", "agent")
	if err != nil {
		t.Fatal(err)
	}
	writes := m.writes

	f := Follow(ctx, m, seedA(), time.Hour, 500*time.Millisecond, slog.New(slog.DiscardHandler))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, err := f.Authenticate(key); err == nil {
			if got.Name != "b" {
				t.Fatalf("the issued key is %q's", got.Name)
			}
			break
		} else if !errors.Is(err, ErrStale) || time.Now().After(deadline) {
			t.Fatalf("the first read: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got, err := f.Authenticate("config-key-a"); err != nil || got.Name != "a" || got.MaxTTL != time.Hour {
		t.Fatalf("the config's key: %+v %v", got, err)
	}
	if _, err := f.Authenticate("no such key"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an unknown key: %v", err)
	}

	// Revoked on the owner: refused once read again, not before.
	if err := owner.Revoke("b", rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Authenticate(key); err != nil {
		t.Fatalf("the copy changed before it was read again: %v", err)
	}
	f.Refresh(ctx)
	if _, err := f.Authenticate(key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a revoked key: %v", err)
	}

	// Disabled on the owner.
	key2, _, err := owner.Issue("b", "second")
	if err != nil {
		t.Fatal(err)
	}
	f.Refresh(ctx)
	if _, err := f.Authenticate(key2); err != nil {
		t.Fatalf("the control, before the disable: %v", err)
	}
	off := true
	if _, err := owner.Update("b", nil, &off); err != nil {
		t.Fatal(err)
	}
	f.Refresh(ctx)
	if _, err := f.Authenticate(key2); !errors.Is(err, ErrDisabled) {
		t.Fatalf("a disabled tenant's key: %v", err)
	}
	if err := f.Enabled("b"); !errors.Is(err, ErrDisabled) {
		t.Fatalf("the disabled tenant: %v", err)
	}
	if err := f.Enabled("a"); err != nil {
		t.Fatalf("the config's tenant, enabled: %v", err)
	}
	if err := f.Enabled("nobody"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("no such tenant: %v", err)
	}
	// The copy, to read, is the owner's registry as stored.
	reg, err := f.Copy()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := reg.Get("b"); err != nil || !got.Disabled {
		t.Fatalf("the copy's tenant b: %+v %v", got, err)
	}
	if got, want := len(reg.List()), len(owner.List()); got != want || want != 2 {
		t.Fatalf("the copy lists %d tenants, the owner %d (want 2)", got, want)
	}
	if keys, err := reg.Keys("b"); err != nil || len(keys) != 1 || keys[0].Name != "second" {
		t.Fatalf("the copy's keys of b (the revoked one gone): %+v %v", keys, err)
	}

	// The stored registry is the word, not this gateway's config: a
	// follower whose config still has a key and a tenant the owner's
	// config dropped does not take them; one whose config has a key
	// the owner's lacks does not either.
	older := Follow(ctx, m, append(seedA(), Seed{Tenant: Tenant{Name: "dropped"}, Digests: []string{Digest("dropped-key")}},
		Seed{Tenant: Tenant{Name: "a", Limits: Limits{AllowRoot: true}}, Digests: []string{Digest("config-key-a"), Digest("removed-key")}}),
		time.Hour, time.Hour, slog.New(slog.DiscardHandler))
	older.Refresh(ctx)
	for _, k := range []string{"dropped-key", "removed-key"} {
		if got, err := older.Authenticate(k); !errors.Is(err, ErrNotFound) {
			t.Errorf("a key of the follower's config alone, %s: %+v %v", k, got, err)
		}
	}
	if got, err := older.Authenticate("config-key-a"); err != nil || got.AllowRoot {
		t.Errorf("the owner's config key, with the owner's limits: %+v %v", got, err)
	}
	if err := older.Enabled("dropped"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a tenant of the follower's config alone: %v", err)
	}
	// Nothing stored yet: the config's seeds.
	fresh := Follow(ctx, &memMirror{}, seedA(), time.Hour, time.Hour, slog.New(slog.DiscardHandler))
	fresh.Refresh(ctx)
	if got, err := fresh.Authenticate("config-key-a"); err != nil || got.Name != "a" {
		t.Errorf("nothing stored, the config's key: %+v %v", got, err)
	}

	// The mirror stops answering: the copy serves until maxAge.
	m.mu.Lock()
	m.readErr = errors.New("away")
	m.mu.Unlock()
	f.Refresh(ctx)
	if _, err := f.Authenticate("config-key-a"); err != nil {
		t.Fatalf("within maxAge of the last read: %v", err)
	}
	time.Sleep(600 * time.Millisecond) // past maxAge: what is under test
	if _, err := f.Authenticate("config-key-a"); !errors.Is(err, ErrStale) {
		t.Fatalf("past maxAge: %v", err)
	}
	if err := f.Enabled("a"); !errors.Is(err, ErrStale) {
		t.Fatalf("past maxAge, a tenant: %v", err)
	}
	if _, err := f.Copy(); !errors.Is(err, ErrStale) {
		t.Fatalf("past maxAge, the copy: %v", err)
	}
	m.mu.Lock()
	m.readErr = nil
	written := m.writes - writes
	m.mu.Unlock()
	f.Refresh(ctx)
	if _, err := f.Authenticate("config-key-a"); err != nil {
		t.Fatalf("read again: %v", err)
	}
	// The owner's own changes since the follower began (revoke, issue,
	// disable) are all the writes.
	if written != 3 {
		t.Errorf("%d writes to the mirror, want the owner's 3", written)
	}
}

// versioned is a mirror in memory that tells its version, and counts
// the reads of its bytes.
type versioned struct {
	memMirror
	reads int
}

func (v *versioned) ReadTenants(ctx context.Context) ([]byte, error) {
	v.mu.Lock()
	v.reads++
	v.mu.Unlock()
	return v.memMirror.ReadTenants(ctx)
}

func (v *versioned) TenantsVersion(context.Context) (string, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return fmt.Sprint(v.writes), v.readErr
}

// TestFollowVersion: with a mirror that tells its version, the stored
// registry's bytes are read only when it changed; a read that found it
// unchanged keeps the copy fresh; a change is read at the next refresh.
func TestFollowVersion(t *testing.T) {
	ctx := context.Background()
	m := &versioned{}
	owner, err := OpenMirrored("", m, seedA(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	f := Follow(ctx, m, nil, time.Hour, time.Hour, slog.New(slog.DiscardHandler))
	for deadline := time.Now().Add(10 * time.Second); f.ReadAt().IsZero(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first read did not come")
		}
	}
	readsOf := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.reads
	}
	first := readsOf()
	before := f.ReadAt()
	f.Refresh(ctx)
	f.Refresh(ctx)
	if reads := readsOf(); reads != first || !f.ReadAt().After(before) {
		t.Fatalf("an unchanged registry: %d reads after the first's %d, fresh %v", reads, first, f.ReadAt().After(before))
	}
	if _, err := owner.Create(Tenant{Name: "b"}); err != nil {
		t.Fatal(err)
	}
	key, _, err := owner.Issue("b", "new")
	if err != nil {
		t.Fatal(err)
	}
	f.Refresh(ctx)
	if got, err := f.Authenticate(key); err != nil || got.Name != "b" {
		t.Fatalf("a key issued since, after a refresh: %+v %v", got, err)
	}
	if reads := readsOf(); reads != first+1 {
		t.Errorf("%d reads after a change, want %d", reads, first+1)
	}
}
