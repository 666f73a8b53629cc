package tenant

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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

// TestChangesWithoutDisk: when the file cannot be written, a disable and
// a revoke still take effect at once (the caller hears ErrNotSaved), and
// the write goes through once the disk is back.
func TestChangesWithoutDisk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, "tenants.json")
	r, err := Open(path, seedA(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	key, rec, err := r.Issue("a", "x")
	if err != nil {
		t.Fatal(err)
	}
	// The state directory becomes a file: every write fails.
	os.RemoveAll(dir)
	os.WriteFile(dir, []byte("not a directory"), 0o600)
	if _, _, err := r.Issue("a", "y"); !errors.Is(err, ErrNotSaved) {
		t.Fatalf("a key that cannot be written: %v", err)
	}
	if err := r.Revoke("a", rec.ID); !errors.Is(err, ErrNotSaved) {
		t.Fatalf("revoke without disk: %v", err)
	}
	if _, err := r.Authenticate(key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a key revoked without disk still works: %v", err)
	}
	yes := true
	if _, err := r.Update("a", nil, &yes); !errors.Is(err, ErrNotSaved) {
		t.Fatalf("disable without disk: %v", err)
	}
	if _, err := r.Authenticate("config-key-a"); !errors.Is(err, ErrDisabled) {
		t.Fatalf("a tenant disabled without disk still works: %v", err)
	}
	os.Remove(dir)
	if err := r.Close(); err != nil {
		t.Fatalf("the write once the disk is back: %v", err)
	}
	r2, err := Open(path, seedA(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if _, err := r2.Authenticate(key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the revoke was not written: %v", err)
	}
	if a, _ := r2.Get("a"); !a.Disabled {
		t.Fatal("the disable was not written")
	}
}

// TestConcurrentUse: authentication beside updates, under -race; and
// the last notification carries the last state.
func TestConcurrentUse(t *testing.T) {
	var mu sync.Mutex
	last := map[string]int{}
	r, err := Open("", seedA(), func(t Tenant) { mu.Lock(); last[t.Name] = t.MaxSessions; mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Create(Tenant{Name: "b"}); err != nil {
		t.Fatal(err)
	}
	key, _, _ := r.Issue("b", "x")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range 200 {
				r.Authenticate(key)
			}
		}()
		go func() {
			defer wg.Done()
			for j := range 50 {
				d := j%2 == 0
				r.Update("b", &Limits{MaxSessions: i*100 + j}, &d)
			}
		}()
	}
	wg.Wait()
	final, _ := r.Get("b")
	mu.Lock()
	defer mu.Unlock()
	if last["b"] != final.MaxSessions {
		t.Fatalf("the last notification said %d, the registry holds %d", last["b"], final.MaxSessions)
	}
}

// TestConfigChanges: config key ids follow the key, not its place; a
// tenant the config drops and names again is enabled again, while one
// disabled through the API stays disabled.
func TestConfigChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.json")
	seed := func(keys ...string) []Seed {
		var ds []string
		for _, k := range keys {
			ds = append(ds, strings.ToUpper(Digest(k))) // digests as some write them
		}
		return []Seed{{Tenant: Tenant{Name: "a"}, Digests: ds}, {Tenant: Tenant{Name: "b"}, Digests: []string{Digest("kb")}}}
	}
	r, _ := Open(path, seed("k1", "k2"), nil)
	yes := true
	r.Update("b", nil, &yes)
	r.Close()
	r, _ = Open(path, seed("k2", "k3")[:1], nil) // b dropped
	keys, _ := r.Keys("a")
	if len(keys) != 2 || keys[0].ID == keys[1].ID {
		t.Fatalf("config keys after a change: %+v", keys)
	}
	for _, k := range []string{"k2", "k3"} {
		if got, err := r.Authenticate(k); got != "a" || err != nil {
			t.Fatalf("config key %s: %q %v", k, got, err)
		}
	}
	if _, err := r.Authenticate("k1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a key dropped from the config: %v", err)
	}
	r.Close()
	r, _ = Open(path, append(seed("k2"), Seed{Tenant: Tenant{Name: "c"}}), nil)
	r.Close()
	// c dropped, then named again: enabled. b was disabled through the
	// API before it was dropped: named again, it stays disabled.
	r, _ = Open(path, []Seed{{Tenant: Tenant{Name: "a"}}}, nil)
	r.Close()
	r, _ = Open(path, append(seed("k2"), Seed{Tenant: Tenant{Name: "c"}}), nil)
	defer r.Close()
	if c, _ := r.Get("c"); c.Disabled || c.Source != SourceConfig {
		t.Fatalf("a tenant named again by the config: %+v", c)
	}
	if b, _ := r.Get("b"); !b.Disabled {
		t.Fatalf("a tenant disabled through the API, dropped and named again: %+v", b)
	}
}

// TestShortWriteKeepsFile: a write the disk cuts short (here a file-size
// limit, as a full disk would) is an error, and the good file stays.
func TestShortWriteKeepsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.json")
	r, err := Open(path, seedA(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range 20 { // a file of some kilobytes
		if _, _, err := r.Issue("a", strings.Repeat("k", 100)+string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := os.ReadFile(path)
	signal.Ignore(syscall.SIGXFSZ)
	defer signal.Reset(syscall.SIGXFSZ)
	var old syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old)
	syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: 512, Max: old.Max})
	_, _, err = r.Issue("a", "cut short")
	syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old)
	if !errors.Is(err, ErrNotSaved) {
		t.Fatalf("a write cut short: %v", err)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) || !json.Valid(after) {
		t.Fatalf("the file changed after a write cut short: %d bytes, was %d", len(after), len(before))
	}
	// The control: with the limit gone, the same issue is written.
	if _, _, err := r.Issue("a", "whole"); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(path); !bytes.Contains(after, []byte("whole")) {
		t.Fatal("the control write is not in the file")
	}
}

// memMirror is a mirror in memory.
type memMirror struct {
	mu       sync.Mutex
	raw      []byte
	readErr  error
	writeErr error
	writes   int
}

func (m *memMirror) ReadTenants(context.Context) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.raw, m.readErr
}

func (m *memMirror) WriteTenants(_ context.Context, raw []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.writeErr != nil {
		return m.writeErr
	}
	m.raw = append([]byte(nil), raw...)
	m.writes++
	return nil
}

// TestMirror: with a mirror, what the admin API changed reaches a
// gateway on another machine (no host file), and the mirror's word beats
// an older host file; a mirror that cannot be read fails the open, one
// that cannot be written fails the change (the caller hears of it).
func TestMirror(t *testing.T) {
	dir := t.TempDir()
	m := &memMirror{}
	r, err := OpenMirrored(filepath.Join(dir, "one.json"), m, seedA(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Create(Tenant{Name: "b", Limits: Limits{MaxSessions: 1}}); err != nil {
		t.Fatal(err)
	}
	keep, _, err := r.Issue("b", "kept")
	if err != nil {
		t.Fatal(err)
	}
	gone, rec, err := r.Issue("b", "revoked")
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	stale, _ := os.ReadFile(filepath.Join(dir, "one.json")) // before the revoke
	r, _ = OpenMirrored(filepath.Join(dir, "one.json"), m, seedA(), nil)
	if err := r.Revoke("b", rec.ID); err != nil {
		t.Fatal(err)
	}
	r.Close()

	// Another machine: no host file, the mirror only.
	other, err := OpenMirrored(filepath.Join(dir, "two.json"), m, seedA(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := other.Authenticate(keep); got != "b" || err != nil {
		t.Errorf("the kept key on another machine: %q %v", got, err)
	}
	if _, err := other.Authenticate(gone); err == nil {
		t.Error("the revoked key works on another machine")
	}
	other.Close()
	// The control: without the mirror, that machine knows neither.
	bare, _ := Open(filepath.Join(dir, "three.json"), seedA(), nil)
	if _, err := bare.Authenticate(keep); err == nil {
		t.Error("a registry without the mirror knows the API's key: the check above proves nothing")
	}
	bare.Close()
	// An older host file loses to the mirror.
	os.WriteFile(filepath.Join(dir, "old.json"), stale, 0o600)
	old, _ := OpenMirrored(filepath.Join(dir, "old.json"), m, seedA(), nil)
	if _, err := old.Authenticate(gone); err == nil {
		t.Error("an older host file brought a revoked key back")
	}
	old.Close()

	m.readErr = errors.New("away")
	if _, err := OpenMirrored(filepath.Join(dir, "four.json"), m, seedA(), nil); err == nil {
		t.Error("opened with a mirror that cannot be read")
	}
	m.readErr = nil
	m.writeErr = errors.New("away")
	if _, err := OpenMirrored(filepath.Join(dir, "five.json"), m, seedA(), nil); err == nil || !strings.Contains(err.Error(), "storing the registry") {
		t.Errorf("open with a mirror that cannot be written: %v", err)
	}
	m.writeErr = nil
	r, err = OpenMirrored(filepath.Join(dir, "six.json"), m, seedA(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m.writeErr = errors.New("away")
	yes := true
	if _, err := r.Update("b", nil, &yes); !errors.Is(err, ErrNotSaved) {
		t.Errorf("a change the mirror refused: %v, want ErrNotSaved", err)
	}
	// It holds here at once, and the host file has it.
	if r.Enabled("b") {
		t.Error("the disable the mirror refused does not hold in memory")
	}
	if raw, _ := os.ReadFile(filepath.Join(dir, "six.json")); !bytes.Contains(raw, []byte(`"disabled": true`)) {
		t.Errorf("the host file lacks the disable the mirror refused:\n%s", raw)
	}
	m.writeErr = nil
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := OpenMirrored(filepath.Join(dir, "seven.json"), m, seedA(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Enabled("b") {
		t.Error("the disable is not in the mirror once it is back")
	}
	again.Close()
}
