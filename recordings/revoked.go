package recordings

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// Revoked is a copy of the revoked previews the leading gateway stores
// (PutRevocation), listed again every interval: what a gateway replica
// that stands by checks a preview by while no leader answers. It never
// writes, nor removes the expired ones (the leader does). A copy not
// listed again for its maxAge is not used (ErrStale).
type Revoked struct {
	store  *Store
	maxAge time.Duration
	log    *slog.Logger

	mu       sync.Mutex
	m        map[[2]string]time.Time // session, preview: until
	listedAt time.Time               // when the listing m came from began
	failed   bool
}

// ErrStale: the copy of the revocations is too old to check by.
var ErrStale = errors.New("recordings: the copy of the stored revocations is out of date")

// FollowRevocations lists the stored revocations now and every
// interval until ctx ends.
func (s *Store) FollowRevocations(ctx context.Context, every, maxAge time.Duration, log *slog.Logger) *Revoked {
	r := &Revoked{store: s, maxAge: maxAge, log: log}
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			lctx, cancel := context.WithTimeout(ctx, maxAge)
			r.Refresh(lctx)
			cancel()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return r
}

// Refresh lists the stored revocations now (a listing that began
// earlier and ends later does not replace it).
func (r *Revoked) Refresh(ctx context.Context) {
	now := time.Now()
	m := map[[2]string]time.Time{}
	err := r.store.revocations(ctx, now, false, func(session, preview string, until time.Time) {
		m[[2]string{session, preview}] = until
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil:
		if now.After(r.listedAt) {
			r.m, r.listedAt = m, now
		}
		if r.failed {
			r.log.Info("the stored revocations are listed again")
		}
		r.failed = false
	case !r.failed:
		r.failed = true
		r.log.Warn("cannot list the stored revocations; their copy is used until it is out of date", "err", err, "max_age", r.maxAge)
	}
}

// Revoked says whether the copy has the preview of session revoked;
// ErrStale when the copy is out of date (or none was listed yet).
func (r *Revoked) Revoked(session, preview string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil || time.Since(r.listedAt) > r.maxAge {
		return false, ErrStale
	}
	until, ok := r.m[[2]string{session, preview}]
	return ok && time.Now().Before(until), nil
}

// ListedAt is when the listing the copy comes from began (zero: none
// yet).
func (r *Revoked) ListedAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.listedAt
}
