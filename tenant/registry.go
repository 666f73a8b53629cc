// Package tenant owns the tenants and their API keys: who may use the
// gateway, with which limits, and whether they are enabled. The config
// file seeds it; the admin API changes it at runtime, and a file the
// gateway owns keeps the changes across restarts. Keys are stored as
// SHA-256 digests only: a new key is shown once, when it is issued.
package tenant

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Errors a caller maps to its contract.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("conflict")
	ErrInvalid  = errors.New("invalid")
	ErrDisabled = errors.New("tenant disabled")
)

// Source says who manages a tenant or key.
const (
	SourceConfig = "config" // the config file: its limits change only there
	SourceAPI    = "api"    // the admin API
)

// Limits bound what one tenant may ask for (0: the gateway's default or
// no limit, as each field says in the config's documentation).
type Limits struct {
	MaxSessions int     `json:"max_sessions"`
	MaxCPUs     float64 `json:"max_cpus"`
	MaxMemoryMB int     `json:"max_memory_mb"`
	// MaxRecordings: recording sessions at once; MaxCreatesPerMinute:
	// creates admitted in a minute; MaxArtifactBytes: what the tenant's
	// artifacts may take in the store.
	MaxRecordings       int           `json:"max_recordings"`
	MaxCreatesPerMinute int           `json:"max_creates_per_minute"`
	MaxArtifactBytes    int64         `json:"max_artifact_bytes"`
	DefaultTTL          time.Duration `json:"-"`
	MaxTTL              time.Duration `json:"-"`
	MaxIdle             time.Duration `json:"-"`
	AllowRoot           bool          `json:"allow_root"`
	MaxFileBytes        int64         `json:"max_file_bytes"`
	EgressAllow         []string      `json:"egress_allow"`
}

// Tenant is one tenant, safe to show to an administrator.
type Tenant struct {
	Name      string    `json:"name"`
	Source    string    `json:"source"`
	Disabled  bool      `json:"disabled"`
	CreatedAt time.Time `json:"created_at"`
	Limits
	dropped bool // disabled because the config no longer names it
}

// Key is an API key's record; the key itself is never kept.
type Key struct {
	ID         string     `json:"id"`
	Tenant     string     `json:"tenant"`
	Name       string     `json:"name"`
	Prefix     string     `json:"prefix"` // the key's first characters, to tell keys apart
	Source     string     `json:"source"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	digest     string
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ValidName reports whether name may name a tenant.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// Seed is a tenant of the config file with the digests of its keys.
type Seed struct {
	Tenant  Tenant
	Digests []string // hex SHA-256 of the tenant's keys
}

// Registry holds the tenants and keys. It is safe for concurrent use.
//
// A change takes effect in memory at once, before it is written: a
// revocation or a disable must work even when the disk does not (the
// write is retried in the background, and the caller hears of the
// failure). Writes happen outside the lock that authentication takes.
type Registry struct {
	path     string // "" keeps nothing on disk
	mirror   Mirror // nil: the host file alone
	onChange func(Tenant)

	mu      sync.RWMutex
	tenants map[string]*Tenant
	keys    map[string]*Key // by digest
	dirty   bool            // changes (or last-used times) not yet written

	writeMu  sync.Mutex // one write at a time
	notifyMu sync.Mutex // one onChange at a time, with the tenant's latest state

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// file is what the registry writes.
type file struct {
	Tenants []storedTenant `json:"tenants"`
	Keys    []storedKey    `json:"keys"`
}

type storedTenant struct {
	Tenant
	DefaultTTLSeconds int64 `json:"default_ttl_seconds"`
	MaxTTLSeconds     int64 `json:"max_ttl_seconds"`
	MaxIdleSeconds    int64 `json:"max_idle_seconds"`
	// DroppedFromConfig: disabled because the config no longer names it;
	// enabled again when it does.
	DroppedFromConfig bool `json:"dropped_from_config,omitempty"`
}

type storedKey struct {
	Key
	Digest string `json:"sha256"`
}

// flushEvery is how often pending changes and last-used times are
// written.
const flushEvery = 30 * time.Second

// Mirror keeps the registry off the host as well (in MinIO), for
// gateways that move between machines: the gateway replica that takes
// the lead on another node must know the tenants disabled and the keys
// revoked through the admin API, which a host file there would not.
type Mirror interface {
	// ReadTenants is the stored registry; nil when none is stored.
	ReadTenants(ctx context.Context) ([]byte, error)
	WriteTenants(ctx context.Context, raw []byte) error
}

// mirrorTimeout bounds one read or write of the mirror.
const mirrorTimeout = 30 * time.Second

// Open loads the registry from path (created when missing; "" for none)
// and applies the config's seeds: a config tenant takes the file's limits
// and keys every time, and keeps what the admin API set of it (disabled,
// keys it issued). onChange, if not nil, hears of every tenant added or
// changed, the seeds included.
func Open(path string, seeds []Seed, onChange func(Tenant)) (*Registry, error) {
	return OpenMirrored(path, nil, seeds, onChange)
}

// OpenMirrored is Open with a mirror, whose copy is the registry's word
// when it has one (the host file may be an older replica's); a mirror
// that cannot be read fails the open, rather than a gateway starting
// with tenants and keys that were disabled or revoked since. Every
// write goes to both.
func OpenMirrored(path string, mirror Mirror, seeds []Seed, onChange func(Tenant)) (*Registry, error) {
	r := &Registry{path: path, mirror: mirror, onChange: onChange, tenants: map[string]*Tenant{}, keys: map[string]*Key{},
		stop: make(chan struct{}), done: make(chan struct{})}
	var raw []byte
	var err error
	from := path
	if mirror != nil {
		ctx, cancel := context.WithTimeout(context.Background(), mirrorTimeout)
		raw, err = mirror.ReadTenants(ctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("tenants: reading the stored registry: %w", err)
		}
		from = "the stored registry"
	}
	if raw == nil && path != "" {
		from = path
		raw, err = os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			raw, err = nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("tenants: %w", err)
		}
	}
	if err := r.load(raw, from); err != nil {
		return nil, err
	}
	r.seed(seeds)
	if path != "" {
		// Temporary files of a write a crash cut short.
		if old, err := filepath.Glob(filepath.Join(filepath.Dir(path), ".tenants-*")); err == nil {
			for _, f := range old {
				os.Remove(f)
			}
		}
	}
	r.dirty = true
	if err := r.flush(); err != nil {
		return nil, err
	}
	if onChange != nil {
		for _, t := range r.List() {
			onChange(t)
		}
	}
	go r.flushLoop()
	return r, nil
}

// load takes the tenants and keys of a stored registry (raw; nil: none),
// read from from.
func (r *Registry) load(raw []byte, from string) error {
	if raw != nil {
		var f file
		if err := json.Unmarshal(raw, &f); err != nil {
			return fmt.Errorf("tenants: %s: %w", from, err)
		}
		for _, st := range f.Tenants {
			t := st.Tenant
			t.DefaultTTL = time.Duration(st.DefaultTTLSeconds) * time.Second
			t.MaxTTL = time.Duration(st.MaxTTLSeconds) * time.Second
			t.MaxIdle = time.Duration(st.MaxIdleSeconds) * time.Second
			t.dropped = st.DroppedFromConfig
			r.tenants[t.Name] = &t
		}
		for _, sk := range f.Keys {
			k := sk.Key
			k.digest = sk.Digest
			r.keys[k.digest] = &k
		}
	}
	return nil
}

// seed applies the config's tenants and keys (see Open).
func (r *Registry) seed(seeds []Seed) {
	// Config tenants and keys: the file's word on limits and its keys;
	// a config key no longer in the config is gone.
	seeded := map[string]bool{}
	named := map[string]bool{}
	for _, s := range seeds {
		t := s.Tenant
		named[t.Name] = true
		t.Source = SourceConfig
		if old, ok := r.tenants[t.Name]; ok {
			t.CreatedAt = old.CreatedAt
			// Disabled through the API: still so. Disabled because the
			// config had dropped it: enabled, now that it names it again.
			t.Disabled = old.Disabled && !old.dropped
		} else {
			t.CreatedAt = time.Now().UTC()
		}
		r.tenants[t.Name] = &t
		for _, d := range s.Digests {
			d = strings.ToLower(d)
			seeded[d] = true
			if k, ok := r.keys[d]; ok && k.Tenant == t.Name && k.Source == SourceConfig {
				continue
			}
			// The id comes from the digest, so it is the key's own
			// whatever its place in the config's list.
			r.keys[d] = &Key{ID: "config-" + d[:min(12, len(d))], Tenant: t.Name, Name: "from the config file",
				Source: SourceConfig, CreatedAt: t.CreatedAt, digest: d}
		}
	}
	for d, k := range r.keys {
		if k.Source == SourceConfig && !seeded[d] {
			delete(r.keys, d)
		}
		if _, ok := r.tenants[k.Tenant]; !ok {
			delete(r.keys, d)
		}
	}
	for _, t := range r.tenants {
		if t.Source == SourceConfig && !named[t.Name] {
			// Dropped from the config: kept, disabled, managed by the API
			// (and enabled again if the config names it again, unless it
			// was disabled before).
			t.Source, t.dropped, t.Disabled = SourceAPI, !t.Disabled, true
		}
	}
}

// Close writes what is pending and stops the background writer.
func (r *Registry) Close() error {
	r.closeOnce.Do(func() {
		close(r.stop)
		<-r.done
	})
	return r.flush()
}

func (r *Registry) flushLoop() {
	defer close(r.done)
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.flush()
		}
	}
}

// Digest is the hex SHA-256 of a key, as stored.
func Digest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Authenticate returns the tenant of key. A revoked or unknown key is
// ErrNotFound; a key of a disabled tenant is ErrDisabled.
func (r *Registry) Authenticate(key string) (string, error) {
	d := Digest(key)
	r.mu.RLock()
	k, ok := r.keys[d]
	var name string
	var disabled, seen bool
	if ok {
		if t := r.tenants[k.Tenant]; t != nil {
			name, disabled = t.Name, t.Disabled
		}
		seen = k.LastUsedAt != nil && time.Since(*k.LastUsedAt) < time.Minute
	}
	r.mu.RUnlock()
	if !ok || name == "" {
		return "", ErrNotFound
	}
	if disabled {
		return "", ErrDisabled
	}
	if !seen { // minute resolution: one write lock a minute per key
		now := time.Now().UTC()
		r.mu.Lock()
		if k := r.keys[d]; k != nil {
			k.LastUsedAt = &now
			r.dirty = true
		}
		r.mu.Unlock()
	}
	return name, nil
}

// Enabled reports whether tenant exists and is enabled.
func (r *Registry) Enabled(tenant string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	t, ok := r.tenants[tenant]
	return ok && !t.Disabled
}

// List returns the tenants by name.
func (r *Registry) List() []Tenant {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Tenant, 0, len(r.tenants))
	for _, t := range r.tenants {
		out = append(out, copyTenant(t))
	}
	slices.SortFunc(out, func(a, b Tenant) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Get returns one tenant.
func (r *Registry) Get(name string) (Tenant, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	t, ok := r.tenants[name]
	if !ok {
		return Tenant{}, ErrNotFound
	}
	return copyTenant(t), nil
}

// ErrNotSaved wraps a change that took effect but could not be written
// yet; the registry retries the write in the background.
var ErrNotSaved = errors.New("the change took effect but is not written yet")

// Create adds a tenant managed by the API.
func (r *Registry) Create(t Tenant) (Tenant, error) {
	if !ValidName(t.Name) {
		return Tenant{}, fmt.Errorf("%w: name must be 1 to 63 of a-z, 0-9 and -, starting with a letter or digit", ErrInvalid)
	}
	t.Source, t.CreatedAt, t.dropped = SourceAPI, time.Now().UTC(), false
	t.EgressAllow = slices.Clone(t.EgressAllow)
	r.mu.Lock()
	if _, ok := r.tenants[t.Name]; ok {
		r.mu.Unlock()
		return Tenant{}, fmt.Errorf("%w: a tenant named %q exists", ErrConflict, t.Name)
	}
	stored := t
	r.tenants[t.Name] = &stored
	r.changedLocked()
	r.mu.Unlock()
	r.notify(t.Name)
	return t, r.flush()
}

// Update changes a tenant: limits (only of a tenant the API manages) and
// whether it is disabled.
func (r *Registry) Update(name string, limits *Limits, disabled *bool) (Tenant, error) {
	r.mu.Lock()
	t, ok := r.tenants[name]
	if !ok {
		r.mu.Unlock()
		return Tenant{}, ErrNotFound
	}
	if limits != nil && t.Source == SourceConfig {
		r.mu.Unlock()
		return Tenant{}, fmt.Errorf("%w: tenant %q is managed by the config file; change its limits there", ErrConflict, name)
	}
	if limits != nil {
		t.Limits = *limits
		t.EgressAllow = slices.Clone(limits.EgressAllow)
	}
	if disabled != nil {
		t.Disabled, t.dropped = *disabled, false
	}
	out := copyTenant(t)
	r.changedLocked()
	r.mu.Unlock()
	r.notify(name)
	return out, r.flush()
}

// Issue makes a new key for tenant and returns it, the only time it is
// shown, with its record.
func (r *Registry) Issue(tenant, name string) (string, Key, error) {
	if len(name) > 128 {
		return "", Key{}, fmt.Errorf("%w: name is longer than 128 characters", ErrInvalid)
	}
	raw := make([]byte, 24)
	rand.Read(raw)
	key := "sg_" + hex.EncodeToString(raw)
	id := make([]byte, 8)
	rand.Read(id)
	k := &Key{ID: "k-" + hex.EncodeToString(id), Tenant: tenant, Name: name, Prefix: key[:9], Source: SourceAPI,
		CreatedAt: time.Now().UTC(), digest: Digest(key)}
	r.mu.Lock()
	if _, ok := r.tenants[tenant]; !ok {
		r.mu.Unlock()
		return "", Key{}, ErrNotFound
	}
	r.keys[k.digest] = k
	out := copyKey(k)
	r.changedLocked()
	r.mu.Unlock()
	// A key that is not written would be lost at a restart: say so
	// rather than hand out a key that may stop working.
	if err := r.flush(); err != nil {
		r.mu.Lock()
		delete(r.keys, k.digest)
		r.changedLocked()
		r.mu.Unlock()
		return "", Key{}, err
	}
	return key, out, nil
}

// Keys lists a tenant's keys, oldest first.
func (r *Registry) Keys(tenant string) ([]Key, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if _, ok := r.tenants[tenant]; !ok {
		return nil, ErrNotFound
	}
	out := []Key{}
	for _, k := range r.keys {
		if k.Tenant == tenant {
			out = append(out, copyKey(k))
		}
	}
	slices.SortFunc(out, func(a, b Key) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Revoke removes a key of tenant; it stops working at once. A key of the
// config file is removed from the config instead.
func (r *Registry) Revoke(tenant, id string) error {
	r.mu.Lock()
	for d, k := range r.keys {
		if k.Tenant == tenant && k.ID == id {
			if k.Source == SourceConfig {
				r.mu.Unlock()
				return fmt.Errorf("%w: the key is from the config file; remove it there", ErrConflict)
			}
			delete(r.keys, d)
			r.changedLocked()
			r.mu.Unlock()
			return r.flush()
		}
	}
	r.mu.Unlock()
	return ErrNotFound
}

func (r *Registry) changedLocked() { r.dirty = true }

// notify tells onChange the tenant's latest state. Notifications run one
// at a time and each reads the state when it runs, so the last one a
// listener hears is the registry's word, whatever order changes raced in.
func (r *Registry) notify(name string) {
	if r.onChange == nil {
		return
	}
	r.notifyMu.Lock()
	defer r.notifyMu.Unlock()
	if t, err := r.Get(name); err == nil {
		r.onChange(t)
	}
}

// flush writes the registry when it has changes: a snapshot taken under
// the lock, written outside it (a temporary file, synced, renamed over
// the old one, the directory synced), so that a crash leaves one or the
// other and a slow disk holds up no authentication. A failure is wrapped
// in ErrNotSaved; the next flush tries again.
func (r *Registry) flush() error {
	if r.path == "" && r.mirror == nil {
		return nil
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	r.mu.Lock()
	if !r.dirty {
		r.mu.Unlock()
		return nil
	}
	var f file
	for _, t := range r.tenants {
		f.Tenants = append(f.Tenants, storedTenant{Tenant: copyTenant(t), DefaultTTLSeconds: int64(t.DefaultTTL / time.Second),
			MaxTTLSeconds: int64(t.MaxTTL / time.Second), MaxIdleSeconds: int64(t.MaxIdle / time.Second), DroppedFromConfig: t.dropped})
	}
	for _, k := range r.keys {
		f.Keys = append(f.Keys, storedKey{Key: copyKey(k), Digest: k.digest})
	}
	r.dirty = false
	r.mu.Unlock()
	err := r.write(f)
	if err != nil {
		r.mu.Lock()
		r.dirty = true
		r.mu.Unlock()
		return fmt.Errorf("%w: %v", ErrNotSaved, err)
	}
	return nil
}

func (r *Registry) write(f file) error {
	slices.SortFunc(f.Tenants, func(a, b storedTenant) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(f.Keys, func(a, b storedKey) int { return cmp.Compare(a.ID, b.ID) })
	raw, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	// Both, whatever the other does: the host file keeps a change the
	// mirror refused for this host's next start; the error is the
	// mirror's first (the next flush tries both again).
	var mirrorErr error
	if r.mirror != nil {
		ctx, cancel := context.WithTimeout(context.Background(), mirrorTimeout)
		if err := r.mirror.WriteTenants(ctx, raw); err != nil {
			mirrorErr = fmt.Errorf("tenants: storing the registry: %w", err)
		}
		cancel()
	}
	if r.path == "" {
		return mirrorErr
	}
	if err := r.writeFile(raw); err != nil {
		return err
	}
	return mirrorErr
}

func (r *Registry) writeFile(raw []byte) error {
	dir := filepath.Dir(r.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("tenants: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".tenants-*")
	if err != nil {
		return fmt.Errorf("tenants: %w", err)
	}
	defer os.Remove(tmp.Name())
	// (err, not a new one: a failed write must not be renamed over the
	// good file.)
	if _, err = tmp.Write(raw); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), r.path)
	}
	if err == nil {
		if d, derr := os.Open(dir); derr == nil {
			err = d.Sync()
			d.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("tenants: writing %s: %w", r.path, err)
	}
	return nil
}

func copyTenant(t *Tenant) Tenant {
	c := *t
	c.EgressAllow = slices.Clone(t.EgressAllow)
	return c
}

func copyKey(k *Key) Key {
	c := *k
	if k.LastUsedAt != nil {
		at := *k.LastUsedAt
		c.LastUsedAt = &at
	}
	return c
}
