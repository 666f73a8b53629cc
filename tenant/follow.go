package tenant

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// Follower keeps a copy of the registry that another gateway owns and
// writes to its mirror (MinIO), read again every interval: what a
// gateway replica that stands by checks API keys by while no replica
// that leads answers. It never writes, and it records no key's use.
//
// A copy that has not been read again for its maxAge is not used
// (ErrStale): a key revoked or a tenant disabled since would be taken.
// Within maxAge, a revocation the owner stored reaches the copy within
// an interval.
type Follower struct {
	mirror Mirror
	seeds  []Seed
	maxAge time.Duration
	log    *slog.Logger

	mu      sync.Mutex
	reg     *Registry // nil until the mirror first answered
	raw     []byte    // what reg was made of
	version string    // its version (VersionedMirror), asked before it was read
	readAt  time.Time // when the read reg came from (the last that answered) began
	failed  bool      // the last read failed (logged once a turn)
}

// VersionedMirror is a Mirror that tells the stored registry's version
// (an ETag) at less cost than its bytes: a follower reads the registry
// only when its version changed.
type VersionedMirror interface {
	Mirror
	TenantsVersion(ctx context.Context) (string, error)
}

// ErrStale: the follower's copy is too old to check a key by.
var ErrStale = errors.New("tenants: the copy of the stored registry is out of date")

// Follow reads the registry stored in mirror now and every interval
// until ctx ends. The stored registry is taken as it is: the gateway
// that stored it applied its config's tenants and keys, and this one's
// config may be older (a key removed from the config, a tenant dropped
// from it, are gone there). The config's seeds are applied only while
// nothing is stored (no gateway has opened the registry yet).
func Follow(ctx context.Context, mirror Mirror, seeds []Seed, every, maxAge time.Duration, log *slog.Logger) *Follower {
	f := &Follower{mirror: mirror, seeds: seeds, maxAge: maxAge, log: log}
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			rctx, cancel := context.WithTimeout(ctx, min(mirrorTimeout, maxAge))
			f.Refresh(rctx)
			cancel()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return f
}

// Refresh reads the stored registry now; a copy is made again only
// when it changed (and a read that began earlier and ends later does
// not replace it).
func (f *Follower) Refresh(ctx context.Context) {
	began := time.Now()
	version, unchanged, err := f.unchanged(ctx)
	var raw []byte
	switch {
	case err == nil && unchanged:
		f.mu.Lock()
		if began.After(f.readAt) {
			f.readAt = began
		}
		f.mu.Unlock()
	case err == nil:
		raw, err = f.mirror.ReadTenants(ctx)
	}
	if err == nil && !unchanged {
		f.mu.Lock()
		same := f.reg != nil && bytes.Equal(raw, f.raw)
		f.mu.Unlock()
		var r *Registry
		if !same {
			r = &Registry{tenants: map[string]*Tenant{}, keys: map[string]*Key{}}
			if err = r.load(raw, "the stored registry"); err == nil && raw == nil {
				r.seed(f.seeds)
			}
		}
		if err == nil {
			f.mu.Lock()
			if began.After(f.readAt) {
				if r != nil {
					f.reg, f.raw = r, raw
				}
				f.readAt, f.version = began, version
			}
			f.mu.Unlock()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case err == nil:
		if f.failed {
			f.log.Info("the stored tenant registry is read again")
		}
		f.failed = false
	case !f.failed:
		f.failed = true
		f.log.Warn("cannot read the stored tenant registry; its copy is used until it is out of date", "err", err, "max_age", f.maxAge)
	}
}

// unchanged asks a VersionedMirror whether the stored registry is the
// version the copy was made of (the version is asked before the bytes
// are read, so a change between the two is read again next time).
func (f *Follower) unchanged(ctx context.Context) (string, bool, error) {
	vm, ok := f.mirror.(VersionedMirror)
	if !ok {
		return "", false, nil
	}
	version, err := vm.TenantsVersion(ctx)
	if err != nil {
		return "", false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return version, f.reg != nil && version == f.version, nil
}

// Authenticate returns the tenant of key, as the copy has it: ErrNotFound
// for an unknown key, ErrDisabled for a disabled tenant's, ErrStale when
// the copy is out of date (or none was read yet).
func (f *Follower) Authenticate(key string) (Tenant, error) {
	f.mu.Lock()
	r, at := f.reg, f.readAt
	f.mu.Unlock()
	if r == nil || time.Since(at) > f.maxAge {
		return Tenant{}, ErrStale
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	k, ok := r.keys[Digest(key)]
	if !ok {
		return Tenant{}, ErrNotFound
	}
	t, ok := r.tenants[k.Tenant]
	switch {
	case !ok:
		return Tenant{}, ErrNotFound
	case t.Disabled:
		return Tenant{}, ErrDisabled
	}
	return copyTenant(t), nil
}

// Enabled says whether tenant is known and enabled, as the copy has it:
// nil, ErrNotFound, ErrDisabled, or ErrStale.
func (f *Follower) Enabled(name string) error {
	f.mu.Lock()
	r, at := f.reg, f.readAt
	f.mu.Unlock()
	if r == nil || time.Since(at) > f.maxAge {
		return ErrStale
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	t, ok := r.tenants[name]
	switch {
	case !ok:
		return ErrNotFound
	case t.Disabled:
		return ErrDisabled
	}
	return nil
}

// Reader is what a registry shows, to read.
type Reader interface {
	List() []Tenant
	Get(name string) (Tenant, error)
	Keys(tenant string) ([]Key, error)
}

// Copy is the copy of the registry, to read: what a replica that stands
// by shows the admin API while no replica that leads answers. ErrStale
// as Authenticate. Its keys' last use is as the owner last wrote it
// (every 30 s).
func (f *Follower) Copy() (Reader, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reg == nil || time.Since(f.readAt) > f.maxAge {
		return nil, ErrStale
	}
	return f.reg, nil
}

// ReadAt is when the read the copy comes from began (zero: none yet).
func (f *Follower) ReadAt() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.readAt
}
