package tenant

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func seedA() []Seed {
	return []Seed{{Tenant: Tenant{Name: "a", Limits: Limits{MaxSessions: 2, MaxTTL: time.Hour}}, Digests: []string{Digest("config-key-a")}}}
}

// TestKeysAndTenants: an issued key works until revoked, a disabled
// tenant's keys do not, and everything but the key itself survives a
// reopen; each refusal beside its control.
func TestKeysAndTenants(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.json")
	var heard []string
	r, err := Open(path, seedA(), func(t Tenant) { heard = append(heard, t.Name) })
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r.Authenticate("config-key-a"); got != "a" || err != nil {
		t.Fatalf("the config key: %q %v", got, err)
	}
	if _, err := r.Authenticate("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an unknown key: %v", err)
	}
	if _, err := r.Create(Tenant{Name: "b", Limits: Limits{MaxSessions: 1, DefaultTTL: 5 * time.Minute}}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "B", "-b", "b/c", strings.Repeat("x", 64)} {
		if _, err := r.Create(Tenant{Name: bad}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("tenant name %q: %v", bad, err)
		}
	}
	if _, err := r.Create(Tenant{Name: "b"}); !errors.Is(err, ErrConflict) {
		t.Fatalf("a second b: %v", err)
	}
	key, rec, err := r.Issue("b", "ci")
	if err != nil || !strings.HasPrefix(key, rec.Prefix) || rec.Tenant != "b" || rec.Source != SourceAPI {
		t.Fatalf("issue: %q %+v %v", key, rec, err)
	}
	if _, _, err := r.Issue("zz", "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a key for no tenant: %v", err)
	}
	if got, err := r.Authenticate(key); got != "b" || err != nil {
		t.Fatalf("the issued key: %q %v", got, err)
	}
	keys, _ := r.Keys("b")
	if len(keys) != 1 || keys[0].LastUsedAt == nil {
		t.Fatalf("b's keys after use: %+v", keys)
	}
	raw, _ := os.ReadFile(path)
	if strings.Contains(string(raw), key) {
		t.Fatal("the key itself is in the file")
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("the file is %v", fi.Mode())
	}

	// Disabled: the key stops; enabled again: it works.
	yes, no := true, false
	if _, err := r.Update("b", nil, &yes); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Authenticate(key); !errors.Is(err, ErrDisabled) || r.Enabled("b") {
		t.Fatalf("a disabled tenant's key: %v", err)
	}
	r.Update("b", nil, &no)
	if _, err := r.Authenticate(key); err != nil {
		t.Fatalf("enabled again: %v", err)
	}
	// A config tenant's limits are the file's; disabling it is not.
	if _, err := r.Update("a", &Limits{MaxSessions: 9}, nil); !errors.Is(err, ErrConflict) {
		t.Fatalf("limits of a config tenant: %v", err)
	}
	if _, err := r.Update("a", nil, &yes); err != nil {
		t.Fatalf("disable a config tenant: %v", err)
	}
	if _, err := r.Update("b", &Limits{MaxSessions: 3}, nil); err != nil {
		t.Fatal(err)
	}
	ak, _ := r.Keys("a")
	if err := r.Revoke("a", ak[0].ID); !errors.Is(err, ErrConflict) {
		t.Fatalf("revoke a config key: %v", err)
	}
	// A second key, revoked; the first still works.
	key2, rec2, _ := r.Issue("b", "other")
	if err := r.Revoke("a", rec2.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoke b's key as a's: %v", err)
	}
	if err := r.Revoke("b", rec2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Authenticate(key2); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a revoked key: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopened, with a config that raised a's limit and dropped nothing.
	seeds := seedA()
	seeds[0].Tenant.MaxSessions = 5
	r2, err := Open(path, seeds, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if got, err := r2.Authenticate(key); got != "b" || err != nil {
		t.Fatalf("the issued key after a reopen: %q %v", got, err)
	}
	if _, err := r2.Authenticate(key2); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a revoked key after a reopen: %v", err)
	}
	a, _ := r2.Get("a")
	b, _ := r2.Get("b")
	if a.MaxSessions != 5 || !a.Disabled || a.MaxTTL != time.Hour || b.MaxSessions != 3 || b.Disabled {
		t.Fatalf("after a reopen: a %+v b %+v", a, b)
	}
	if len(heard) < 2 {
		t.Fatalf("onChange heard %v", heard)
	}
}

// TestConfigKeyRemoved: a key dropped from the config stops working; a
// tenant dropped from it stays, disabled, with its API keys.
func TestConfigKeyRemoved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.json")
	r, err := Open(path, seedA(), nil)
	if err != nil {
		t.Fatal(err)
	}
	key, _, _ := r.Issue("a", "api")
	r.Close()
	r2, err := Open(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if _, err := r2.Authenticate("config-key-a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a key no longer in the config: %v", err)
	}
	if _, err := r2.Authenticate(key); !errors.Is(err, ErrDisabled) {
		t.Fatalf("an API key of a tenant dropped from the config: %v", err)
	}
	if a, err := r2.Get("a"); err != nil || a.Source != SourceAPI || !a.Disabled {
		t.Fatalf("a tenant dropped from the config: %+v %v", a, err)
	}
}
