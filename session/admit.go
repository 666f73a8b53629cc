package session

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// Admission: a create first reserves what it will hold (one session, its
// CPUs and its memory) against the tenant's quotas and the gateway's
// capacity. A create that does not fit waits, in order behind the
// tenant's earlier ones, for at most what its caller chose, then is
// refused with ErrQuota and a hint of when to retry.

// maxQueued bounds the creates one tenant may have waiting.
const maxQueued = 64

// admitRecheck is how often a waiting create looks again on its own; a
// slot that frees wakes it at once.
const admitRecheck = 2 * time.Second

// Usage is what a tenant holds, against its limits (0: none).
type Usage struct {
	Sessions            int     `json:"sessions"`
	CPUs                float64 `json:"cpus"`
	MemoryMB            int     `json:"memory_mb"`
	Recordings          int     `json:"recordings"`
	CreatesLastMinute   int     `json:"creates_last_minute"`
	ArtifactBytes       int64   `json:"artifact_bytes"` // filled by the gateway, from the store
	Queued              int     `json:"queued"`
	MaxSessions         int     `json:"max_sessions"`
	MaxCPUs             float64 `json:"max_cpus"`
	MaxMemoryMB         int     `json:"max_memory_mb"`
	MaxRecordings       int     `json:"max_recordings"`
	MaxCreatesPerMinute int     `json:"max_creates_per_minute"`
	MaxArtifactBytes    int64   `json:"max_artifact_bytes"`
}

// reservation holds a create's share until its session is counted
// (started, starting or claimed) or the create gives up.
type reservation struct {
	tenant   string
	need     Resources
	record   bool
	claiming bool // a pooled session is being claimed for it, and counts instead
}

type waiter struct {
	tenant string
	ready  chan struct{} // buffered: a wake is never lost
}

// reserve admits a create for tenant that needs need (and a recording
// slot, with record), waiting up to wait for room. The caller must hand the reservation to release once its
// session counts by itself, or on failure.
func (m *Manager) reserve(ctx context.Context, tenant string, need Resources, record bool, wait time.Duration) (*reservation, error) {
	if m.disabled(tenant) {
		return nil, errTenantDisabled
	}
	m.mu.Lock()
	if m.draining {
		m.mu.Unlock()
		return nil, errDraining
	}
	if why := m.neverFits(tenant, need); why != "" {
		m.mu.Unlock()
		return nil, publicf(ErrInvalid, why, nil)
	}
	q := m.queues[tenant]
	if len(q) == 0 {
		why := m.fitsLocked(tenant, need, record)
		if why == "" {
			r := m.holdLocked(tenant, need, record)
			m.mu.Unlock()
			return r, nil
		}
		if wait <= 0 {
			err := m.quotaErrLocked(tenant, why)
			m.mu.Unlock()
			return nil, err
		}
	} else if wait <= 0 || len(q) >= maxQueued {
		err := m.quotaErrLocked(tenant, fmt.Sprintf("%d earlier creates of the tenant are waiting", len(q)))
		m.mu.Unlock()
		return nil, err
	}
	w := &waiter{tenant: tenant, ready: make(chan struct{}, 1)}
	m.queues[tenant] = append(q, w)
	m.mu.Unlock()

	start := time.Now()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(admitRecheck)
	defer tick.Stop()
	for {
		select {
		case <-w.ready:
		case <-tick.C:
		case <-deadline.C:
			m.mu.Lock()
			m.leaveLocked(w)
			err := m.quotaErrLocked(tenant, fmt.Sprintf("still over it after waiting %s", wait.Round(time.Second)))
			m.queueWaits.observe(time.Since(start), false)
			m.mu.Unlock()
			return nil, err
		case <-ctx.Done():
			m.mu.Lock()
			m.leaveLocked(w)
			m.queueWaits.observe(time.Since(start), false)
			m.mu.Unlock()
			return nil, fmt.Errorf("waiting for quota: %w", ctx.Err())
		}
		m.mu.Lock()
		if draining := m.draining; draining || m.disabled(tenant) {
			m.leaveLocked(w)
			m.queueWaits.observe(time.Since(start), false)
			m.mu.Unlock()
			if draining {
				return nil, errDraining
			}
			return nil, errTenantDisabled
		}
		if q := m.queues[tenant]; len(q) > 0 && q[0] == w && m.fitsLocked(tenant, need, record) == "" {
			m.leaveLocked(w)
			r := m.holdLocked(tenant, need, record)
			m.queueWaits.observe(time.Since(start), true)
			m.mu.Unlock()
			return r, nil
		}
		m.mu.Unlock()
	}
}

// release drops a reservation, once; the caller holds m.mu.
func (m *Manager) releaseLocked(r *reservation) {
	if r == nil || !m.reserved[r] {
		return
	}
	delete(m.reserved, r)
	m.wakeLocked()
}

func (m *Manager) release(r *reservation) {
	m.mu.Lock()
	m.releaseLocked(r)
	m.mu.Unlock()
}

func (m *Manager) holdLocked(tenant string, need Resources, record bool) *reservation {
	r := &reservation{tenant: tenant, need: need, record: record}
	m.reserved[r] = true
	m.inflight++
	m.createsLastMinuteLocked(tenant) // forget what is older than a minute
	m.creates[tenant] = append(m.creates[tenant], time.Now())
	return r
}

// createsLastMinuteLocked counts the tenant's creates admitted in the
// last minute, forgetting older ones.
func (m *Manager) createsLastMinuteLocked(tenant string) (int, time.Duration) {
	cut := time.Now().Add(-time.Minute)
	ts := m.creates[tenant]
	i := 0
	for i < len(ts) && ts[i].Before(cut) {
		i++
	}
	ts = ts[i:]
	if len(ts) == 0 {
		delete(m.creates, tenant)
		return 0, 0
	}
	m.creates[tenant] = ts
	return len(ts), time.Until(ts[0].Add(time.Minute))
}

// createDone ends what holdLocked began: one create less under way.
func (m *Manager) createDone() {
	m.mu.Lock()
	m.inflight--
	m.mu.Unlock()
}

// errDraining refuses a create while the gateway stops: nothing of the
// session was made, and another gateway takes it.
var errDraining = &PublicError{Class: ErrUnavailable, Msg: "the gateway is shutting down and takes no new sessions; retry (another gateway takes them)", RetryAfter: 2}

// Drain refuses new creates from now on (waiting ones too) and returns
// once the creates under way have finished, or when ctx ends. Running
// sessions are left alone, for the next gateway to adopt.
func (m *Manager) Drain(ctx context.Context) error {
	m.mu.Lock()
	m.draining = true
	m.wakeAllLocked()
	m.mu.Unlock()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		m.mu.Lock()
		n := m.inflight
		m.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d creates still under way: %w", n, ctx.Err())
		case <-tick.C:
		}
	}
}

// Draining reports whether Drain was called.
func (m *Manager) Draining() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.draining
}

// wakeAllLocked wakes every waiter, not only the first of each tenant.
func (m *Manager) wakeAllLocked() {
	for _, q := range m.queues {
		for _, w := range q {
			select {
			case w.ready <- struct{}{}:
			default:
			}
		}
	}
}

// leaveLocked takes w out of its queue and, if it was first, lets the
// next one look.
func (m *Manager) leaveLocked(w *waiter) {
	q := m.queues[w.tenant]
	i := slices.Index(q, w)
	if i < 0 {
		return
	}
	q = slices.Delete(q, i, i+1)
	if len(q) == 0 {
		delete(m.queues, w.tenant)
	} else {
		m.queues[w.tenant] = q
	}
	if i == 0 {
		m.wakeLocked()
	}
}

// wakeLocked tells the first waiter of every tenant to look again: a
// slot has freed (a tenant's or the gateway's) or the queue moved.
func (m *Manager) wakeLocked() {
	for _, q := range m.queues {
		select {
		case q[0].ready <- struct{}{}:
		default:
		}
	}
}

// usageLocked sums what tenant holds (every tenant's, for ""): sessions
// starting or running, claims under way and reservations. Pooled
// sessions count against nobody.
// Hold counts a session that holds r (and a recording if record).
func (u *Usage) Hold(r Resources, record bool) {
	u.Sessions++
	u.CPUs += r.CPUs
	u.MemoryMB += r.MemoryMB
	if record {
		u.Recordings++
	}
}

// SetLimits sets u's limits, lim's.
func (u *Usage) SetLimits(lim TenantLimits) {
	u.MaxSessions, u.MaxCPUs, u.MaxMemoryMB = lim.MaxSessions, lim.MaxCPUs, lim.MaxMemoryMB
	u.MaxRecordings, u.MaxCreatesPerMinute, u.MaxArtifactBytes = lim.MaxRecordings, lim.MaxCreatesPerMinute, lim.MaxArtifactBytes
}

func (m *Manager) usageLocked(tenant string) Usage {
	var u Usage
	add := u.Hold
	for _, s := range m.sessions {
		// A stopping session still holds its sandbox until its teardown
		// ends (settle wakes the line then).
		live := s.pool == nil && (s.info.State == StateStarting || s.info.State == StateRunning || s.info.State == StateStopping)
		switch {
		case live && (tenant == "" || s.info.Tenant == tenant):
			add(s.info.Resources, s.info.Record)
		case s.claimFor != "" && s.claimFor != claimFailed && (tenant == "" || s.claimFor == tenant):
			add(s.info.Resources, false) // a claim's recording starts after it
		}
	}
	for r := range m.reserved {
		switch {
		case tenant != "" && r.tenant != tenant:
		case !r.claiming:
			add(r.need, r.record)
		case r.record:
			// The claim counts the session; its recording starts after
			// the claim, so the reservation holds that slot meanwhile.
			u.Recordings++
		}
	}
	if tenant == "" {
		for _, q := range m.queues {
			u.Queued += len(q)
		}
	} else {
		u.Queued = len(m.queues[tenant])
	}
	return u
}

// neverFits says why a create of need could not fit even on an empty
// gateway ("" if it could): it is refused at once rather than waiting at
// the head of the line, where it would hold up the creates behind it.
func (m *Manager) neverFits(tenant string, need Resources) string {
	lim, _ := m.Limits(tenant)
	return neverFits(lim, need)
}

// neverFits says why need is over what lim allows any one session.
func neverFits(lim TenantLimits, need Resources) string {
	switch {
	case lim.MaxCPUs > 0 && need.CPUs > lim.MaxCPUs+1e-9:
		return fmt.Sprintf("resources.cpus %g is over the tenant's max_cpus %g", need.CPUs, lim.MaxCPUs)
	case lim.MaxMemoryMB > 0 && need.MemoryMB > lim.MaxMemoryMB:
		return fmt.Sprintf("resources.memory_mb %d is over the tenant's max_memory_mb %d", need.MemoryMB, lim.MaxMemoryMB)
	}
	return ""
}

// fitsLocked says why a create of need does not fit now ("" if it does).
func (m *Manager) fitsLocked(tenant string, need Resources, record bool) string {
	lim, _ := m.Limits(tenant)
	creates, _ := m.createsLastMinuteLocked(tenant)
	total := 0
	if m.cfg.MaxSessions > 0 {
		total = m.usageLocked("").Sessions
	}
	return fits(m.usageLocked(tenant), creates, lim, need, record, total, m.cfg.MaxSessions)
}

// fits says why a create of need (and a recording, with record) does
// not fit ("" if it does): the tenant holds u and made creates in the
// last minute, against lim; the gateway runs total sessions, against
// its capacity (0: none).
func fits(u Usage, creates int, lim TenantLimits, need Resources, record bool, total, capacity int) string {
	if lim.MaxCreatesPerMinute > 0 && creates >= lim.MaxCreatesPerMinute {
		return fmt.Sprintf("the tenant made %d creates in the last minute, its maximum", creates)
	}
	switch {
	case record && lim.MaxRecordings > 0 && u.Recordings+1 > lim.MaxRecordings:
		return fmt.Sprintf("the tenant records %d sessions, its maximum", u.Recordings)
	case lim.MaxSessions > 0 && u.Sessions+1 > lim.MaxSessions:
		return fmt.Sprintf("the tenant has %d active sessions, its maximum", u.Sessions)
	case lim.MaxCPUs > 0 && u.CPUs+need.CPUs > lim.MaxCPUs+1e-9:
		return fmt.Sprintf("the tenant's sessions hold %g of its %g CPUs and this one asks %g", u.CPUs, lim.MaxCPUs, need.CPUs)
	case lim.MaxMemoryMB > 0 && u.MemoryMB+need.MemoryMB > lim.MaxMemoryMB:
		return fmt.Sprintf("the tenant's sessions hold %d of its %d MB and this one asks %d", u.MemoryMB, lim.MaxMemoryMB, need.MemoryMB)
	case capacity > 0 && total+1 > capacity:
		return fmt.Sprintf("the gateway runs %d sessions, its capacity", total)
	}
	return ""
}

// quotaErrLocked is the refusal of a create that does not fit, with the
// seconds until the tenant's first session expires (at most 30, at least
// 1) as the hint to retry: a session deleted sooner frees a slot sooner.
func (m *Manager) quotaErrLocked(tenant, why string) error {
	retry := 30.0
	now := time.Now()
	for _, s := range m.sessions {
		if s.pool == nil && s.info.State == StateRunning && s.info.Tenant == tenant {
			retry = min(retry, s.info.ExpiresAt.Sub(now).Seconds())
		}
	}
	if lim, _ := m.Limits(tenant); lim.MaxCreatesPerMinute > 0 {
		if n, wait := m.createsLastMinuteLocked(tenant); n >= lim.MaxCreatesPerMinute {
			retry = max(retry, wait.Seconds()) // no create gets in before the window has room
		}
	}
	return &PublicError{Class: ErrQuota, Msg: "over quota: " + why, RetryAfter: int(math.Max(1, math.Ceil(retry)))}
}

// Usage is what tenant holds now, with its limits.
func (m *Manager) Usage(tenant string) Usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.usageLocked(tenant)
	u.CreatesLastMinute, _ = m.createsLastMinuteLocked(tenant)
	lim, _ := m.Limits(tenant)
	u.SetLimits(lim)
	return u
}

// Admission is the state of the create queue, for metrics and readiness.
type Admission struct {
	Queued       int     // creates waiting now
	Sessions     int     // tenant sessions held (with claims and reservations)
	Capacity     int     // the gateway's maximum; 0: none
	Admitted     uint64  // creates that waited and got in
	TimedOut     uint64  // creates that waited and gave up
	WaitSeconds  float64 // total time waited, both kinds
	MaxWaitSoFar float64
}

// Full says the gateway has no room for another session.
func (a Admission) Full() bool { return a.Capacity > 0 && a.Sessions >= a.Capacity }

func (m *Manager) Admission() Admission {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.usageLocked("")
	w := m.queueWaits
	return Admission{Queued: u.Queued, Sessions: u.Sessions, Capacity: m.cfg.MaxSessions,
		Admitted: w.admitted, TimedOut: w.timedOut, WaitSeconds: w.total, MaxWaitSoFar: w.max}
}

// queueStats counts the waits of creates that queued; under m.mu.
type queueStats struct {
	admitted, timedOut uint64
	total, max         float64
}

func (q *queueStats) observe(d time.Duration, admitted bool) {
	if admitted {
		q.admitted++
	} else {
		q.timedOut++
	}
	q.total += d.Seconds()
	q.max = max(q.max, d.Seconds())
}
