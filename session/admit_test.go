package session

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
)

func admitManager(tenants map[string]TenantLimits, capacity int) *Manager {
	return &Manager{log: slog.New(slog.NewTextHandler(io.Discard, nil)), sessions: map[string]*sess{},
		queues: map[string][]*waiter{}, reserved: map[*reservation]bool{}, creates: map[string][]time.Time{},
		cfg: Config{Tenants: tenants, MaxSessions: capacity}}
}

var oneCPU = Resources{CPUs: 1, MemoryMB: 1024}

// running adds a running session of tenant, as Create does with a
// reservation it then releases.
func (m *Manager) addRunning(t *testing.T, tenant, id string, r Resources) *sess {
	t.Helper()
	s := newSess(Info{ID: id, Tenant: tenant, State: StateRunning, Resources: r, ExpiresAt: time.Now().Add(time.Hour)})
	m.mu.Lock()
	m.sessions[id] = s
	m.mu.Unlock()
	return s
}

// endSession ends session id as settle does.
func (m *Manager) endSession(id string) {
	m.mu.Lock()
	s := m.sessions[id]
	s.info.State = StateStopped
	m.wakeLocked()
	m.mu.Unlock()
}

func quotaRetry(t *testing.T, err error) int {
	t.Helper()
	var qe *PublicError
	if !errors.As(err, &qe) || !errors.Is(err, ErrQuota) {
		t.Fatalf("want a quota error, got %v", err)
	}
	return qe.RetryAfter
}

// TestAdmitSessions: at the tenant's maximum a create with no wait is
// refused with a retry hint; one that waits gets in when a session ends;
// another tenant is not held up.
func TestAdmitSessions(t *testing.T) {
	m := admitManager(map[string]TenantLimits{"a": {MaxSessions: 2}, "b": {MaxSessions: 2}}, 0)
	ctx := context.Background()
	for i, id := range []string{"a1", "a2"} {
		r, err := m.reserve(ctx, "a", oneCPU, false, 0)
		if err != nil {
			t.Fatalf("create %d of 2: %v", i+1, err)
		}
		m.addRunning(t, "a", id, oneCPU)
		m.release(r)
	}
	if got := m.Usage("a"); got.Sessions != 2 || got.CPUs != 2 || got.MaxSessions != 2 {
		t.Fatalf("usage %+v", got)
	}
	_, err := m.reserve(ctx, "a", oneCPU, false, 0)
	if retry := quotaRetry(t, err); retry < 1 || retry > 30 {
		t.Fatalf("Retry-After %d", retry)
	}
	// Tenant b is unaffected.
	rb, err := m.reserve(ctx, "b", oneCPU, false, 0)
	if err != nil {
		t.Fatalf("tenant b: %v", err)
	}
	m.release(rb)

	got := make(chan error, 1)
	go func() {
		r, err := m.reserve(ctx, "a", oneCPU, false, time.Minute)
		if err == nil {
			m.release(r)
		}
		got <- err
	}()
	waitFor(t, func() bool { return m.Usage("a").Queued == 1 })
	select {
	case err := <-got:
		t.Fatalf("admitted while full: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	m.endSession("a1")
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the waiting create: %v", err)
		}
	case <-time.After(time.Second): // far below admitRecheck's 2 s
		t.Fatal("a session ended and the waiting create did not get in")
	}
	if a := m.Admission(); a.Admitted != 1 || a.Queued != 0 {
		t.Fatalf("admission %+v", a)
	}
	// While one waits, a create that does not wait is refused even if
	// there is room: it does not jump the queue.
	m.mu.Lock()
	m.queues["b"] = []*waiter{{tenant: "b", ready: make(chan struct{}, 1)}}
	m.mu.Unlock()
	if _, err := m.reserve(ctx, "b", oneCPU, false, 0); err == nil {
		t.Fatal("a create jumped the queue")
	}
	m.mu.Lock()
	delete(m.queues, "b")
	m.mu.Unlock()
	rb, err = m.reserve(ctx, "b", oneCPU, false, 0)
	if err != nil {
		t.Fatalf("tenant b with no queue: %v", err)
	}
	m.release(rb)
}

// TestAdmitTimesOut: a create that waits longer than it may is refused,
// leaves the queue, and lets the next one be first.
func TestAdmitTimesOut(t *testing.T) {
	m := admitManager(map[string]TenantLimits{"a": {MaxSessions: 1}}, 0)
	ctx := context.Background()
	m.addRunning(t, "a", "a1", oneCPU)
	t0 := time.Now()
	_, err := m.reserve(ctx, "a", oneCPU, false, 300*time.Millisecond)
	quotaRetry(t, err)
	if d := time.Since(t0); d < 300*time.Millisecond {
		t.Fatalf("gave up after %s", d)
	}
	if a := m.Admission(); a.TimedOut != 1 || a.Queued != 0 {
		t.Fatalf("admission %+v", a)
	}
	// The control: with room, the same create gets in at once.
	m.endSession("a1")
	r, err := m.reserve(ctx, "a", oneCPU, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	m.release(r)
}

// TestAdmitInOrder: waiting creates get in in the order they came.
func TestAdmitInOrder(t *testing.T) {
	m := admitManager(map[string]TenantLimits{"a": {MaxSessions: 1}}, 0)
	ctx := context.Background()
	m.addRunning(t, "a", "a0", oneCPU)
	order := make(chan int, 3)
	for i := range 3 {
		go func() {
			r, err := m.reserve(ctx, "a", oneCPU, false, time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			m.addRunning(t, "a", "x"+string(rune('0'+i)), oneCPU)
			m.release(r)
			order <- i
		}()
		waitFor(t, func() bool { return m.Usage("a").Queued == i+1 })
	}
	m.endSession("a0")
	for want := range 3 {
		select {
		case got := <-order:
			if got != want {
				t.Fatalf("create %d got in %dth", got, want)
			}
			m.endSession("x" + string(rune('0'+got)))
		case <-time.After(5 * time.Second):
			t.Fatalf("create %d never got in", want)
		}
	}
}

// TestAdmitResources: CPUs, memory and the gateway's capacity bound
// creates too; each refusal beside a create that fits.
func TestAdmitResources(t *testing.T) {
	m := admitManager(map[string]TenantLimits{"a": {MaxCPUs: 3, MaxMemoryMB: 4096}, "b": {}}, 4)
	ctx := context.Background()
	m.addRunning(t, "a", "a1", Resources{CPUs: 2, MemoryMB: 1024})
	if _, err := m.reserve(ctx, "a", Resources{CPUs: 2, MemoryMB: 512}, false, 0); err == nil {
		t.Fatal("2 + 2 CPUs of 3 admitted")
	}
	if _, err := m.reserve(ctx, "a", Resources{CPUs: 1, MemoryMB: 3584}, false, 0); err == nil {
		t.Fatal("1024 + 3584 MB of 4096 admitted")
	}
	r, err := m.reserve(ctx, "a", Resources{CPUs: 1, MemoryMB: 3072}, false, 0)
	if err != nil {
		t.Fatalf("exactly the tenant's limits: %v", err)
	}
	// The reservation counts until released: a second is refused.
	if _, err := m.reserve(ctx, "a", Resources{CPUs: 0.25, MemoryMB: 512}, false, 0); err == nil {
		t.Fatal("a reservation did not count")
	}
	m.release(r)
	// Capacity: 4 sessions on the gateway, whoever's.
	m.addRunning(t, "b", "b1", oneCPU)
	m.addRunning(t, "b", "b2", oneCPU)
	rb, err := m.reserve(ctx, "b", oneCPU, false, 0)
	if err != nil {
		t.Fatalf("the gateway's 4th session: %v", err)
	}
	if a := m.Admission(); !a.Full() {
		t.Fatalf("4 of 4 is not full: %+v", a)
	}
	if _, err := m.reserve(ctx, "b", oneCPU, false, 0); err == nil {
		t.Fatal("a 5th session on a gateway of 4 admitted")
	}
	m.release(rb)
	if a := m.Admission(); a.Full() {
		t.Fatalf("3 of 4 is full: %+v", a)
	}
}

// TestAdmitClaimCounts: a claim under way counts against the tenant in
// its reservation's stead, never twice.
func TestAdmitClaimCounts(t *testing.T) {
	m := admitManager(map[string]TenantLimits{"a": {MaxSessions: 2}}, 0)
	r, err := m.reserve(context.Background(), "a", oneCPU, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := newSess(Info{ID: "p", State: StateRunning, Resources: oneCPU})
	s.pool = &pool{}
	m.mu.Lock()
	m.sessions["p"] = s
	s.claimFor, r.claiming = "a", true
	m.mu.Unlock()
	if u := m.Usage("a"); u.Sessions != 1 {
		t.Fatalf("a claim with its reservation counts %d", u.Sessions)
	}
	m.mu.Lock()
	s.claimFor, r.claiming = claimFailed, false
	m.mu.Unlock()
	if u := m.Usage("a"); u.Sessions != 1 {
		t.Fatalf("a failed claim's reservation counts %d", u.Sessions)
	}
	m.release(r)
	if u := m.Usage("a"); u.Sessions != 0 {
		t.Fatalf("after release %d", u.Sessions)
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 10 s")
}

// TestDrain: once draining, a new create and a waiting one are refused
// as unavailable; Drain returns when the create under way is done, and
// not before.
func TestDrain(t *testing.T) {
	m := admitManager(map[string]TenantLimits{"a": {MaxSessions: 1}}, 0)
	ctx := context.Background()
	r, err := m.reserve(ctx, "a", oneCPU, false, 0) // under way
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { _, err := m.reserve(ctx, "a", oneCPU, false, time.Minute); waited <- err }()
	waitFor(t, func() bool { return m.Usage("a").Queued == 1 })
	drained := make(chan error, 1)
	go func() { drained <- m.Drain(ctx) }()
	if err := <-waited; !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a waiting create at drain: %v", err)
	}
	if _, err := m.reserve(ctx, "b", oneCPU, false, 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a new create while draining: %v", err)
	}
	select {
	case err := <-drained:
		t.Fatalf("drained with a create under way: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	m.release(r)
	m.createDone()
	select {
	case err := <-drained:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return once the create was done")
	}
}

// TestAdmitDisabled: a tenant disabled while its create waits is
// refused, and so is its next create; another tenant is not.
func TestAdmitDisabled(t *testing.T) {
	m := admitManager(map[string]TenantLimits{"a": {MaxSessions: 1}, "b": {}}, 0)
	ctx := context.Background()
	m.addRunning(t, "a", "a1", oneCPU)
	waited := make(chan error, 1)
	go func() { _, err := m.reserve(ctx, "a", oneCPU, false, time.Minute); waited <- err }()
	waitFor(t, func() bool { return m.Usage("a").Queued == 1 })
	m.SetTenant("a", TenantLimits{MaxSessions: 1, Disabled: true})
	select {
	case err := <-waited:
		if !errors.Is(err, ErrDenied) {
			t.Fatalf("the waiting create of a disabled tenant: %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("the waiting create of a disabled tenant still waits")
	}
	if _, err := m.reserve(ctx, "a", oneCPU, false, 0); !errors.Is(err, ErrDenied) {
		t.Fatalf("a create of a disabled tenant: %v", err)
	}
	r, err := m.reserve(ctx, "b", oneCPU, false, 0)
	if err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	m.release(r)
}

// TestAdmitNeverFits: a create bigger than the tenant's whole quota is
// refused at once as invalid, not queued; one that fits the quota waits.
func TestAdmitNeverFits(t *testing.T) {
	m := admitManager(map[string]TenantLimits{"a": {MaxCPUs: 4}}, 0)
	t0 := time.Now()
	if _, err := m.reserve(context.Background(), "a", Resources{CPUs: 8, MemoryMB: 1024}, false, time.Minute); !errors.Is(err, ErrInvalid) || time.Since(t0) > time.Second {
		t.Fatalf("8 CPUs of a quota of 4: %v after %s", err, time.Since(t0))
	}
	r, err := m.reserve(context.Background(), "a", Resources{CPUs: 4, MemoryMB: 1024}, false, 0)
	if err != nil {
		t.Fatalf("4 CPUs of 4: %v", err)
	}
	m.release(r)
}

// TestStoppingCounts: a session on its way out holds its slot until its
// teardown ends.
func TestStoppingCounts(t *testing.T) {
	m := admitManager(map[string]TenantLimits{"a": {MaxSessions: 1}}, 0)
	s := m.addRunning(t, "a", "a1", oneCPU)
	m.mu.Lock()
	s.info.State = StateStopping
	m.mu.Unlock()
	if _, err := m.reserve(context.Background(), "a", oneCPU, false, 0); !errors.Is(err, ErrQuota) {
		t.Fatalf("a create while the only session stops: %v", err)
	}
	m.endSession("a1")
	r, err := m.reserve(context.Background(), "a", oneCPU, false, 0)
	if err != nil {
		t.Fatalf("once it stopped: %v", err)
	}
	m.release(r)
}

// TestAdmitRecordingsAndRate: recording sessions and creates a minute
// have their own quotas; a create that does not record, or another
// tenant's, is not held by them.
func TestAdmitRecordingsAndRate(t *testing.T) {
	m := admitManager(map[string]TenantLimits{"a": {MaxRecordings: 1, MaxCreatesPerMinute: 3}, "b": {}}, 0)
	ctx := context.Background()
	r1, err := m.reserve(ctx, "a", oneCPU, true, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.reserve(ctx, "a", oneCPU, true, 0); !errors.Is(err, ErrQuota) {
		t.Fatalf("a second recording of one: %v", err)
	}
	r2, err := m.reserve(ctx, "a", oneCPU, false, 0)
	if err != nil {
		t.Fatalf("a session that does not record: %v", err)
	}
	if u := m.Usage("a"); u.Recordings != 1 || u.CreatesLastMinute != 2 || u.MaxCreatesPerMinute != 3 {
		t.Fatalf("usage %+v", u)
	}
	m.release(r1)
	m.release(r2)
	r3, err := m.reserve(ctx, "a", oneCPU, true, 0) // the third of three a minute
	if err != nil {
		t.Fatal(err)
	}
	m.release(r3)
	_, err = m.reserve(ctx, "a", oneCPU, false, 0)
	if retry := quotaRetry(t, err); retry < 55 || retry > 60 {
		t.Fatalf("Retry-After %d", retry)
	}
	if r, err := m.reserve(ctx, "b", oneCPU, false, 0); err != nil {
		t.Fatalf("another tenant: %v", err)
	} else {
		m.release(r)
	}
	// A minute later the window has room again.
	m.mu.Lock()
	for i := range m.creates["a"] {
		m.creates["a"][i] = m.creates["a"][i].Add(-time.Minute)
	}
	m.mu.Unlock()
	if r, err := m.reserve(ctx, "a", oneCPU, false, 0); err != nil {
		t.Fatalf("after the minute: %v", err)
	} else {
		m.release(r)
	}
}

// TestAdmitRateHoldsWaiters: a create let in from the line counts
// against the creates a minute too (the line is no way around it).
func TestAdmitRateHoldsWaiters(t *testing.T) {
	m := admitManager(map[string]TenantLimits{"a": {MaxSessions: 1, MaxCreatesPerMinute: 2}}, 0)
	ctx := context.Background()
	m.addRunning(t, "a", "a0", oneCPU)
	got := make(chan error, 4)
	for range 4 {
		go func() {
			r, err := m.reserve(ctx, "a", oneCPU, false, 3*time.Second)
			if err == nil {
				m.release(r) // its session ends at once: the slot frees again
			}
			got <- err
		}()
	}
	waitFor(t, func() bool { return m.Usage("a").Queued == 4 })
	m.endSession("a0")
	admitted := 0
	for range 4 {
		if err := <-got; err == nil {
			admitted++
		} else if !errors.Is(err, ErrQuota) {
			t.Fatal(err)
		}
	}
	if admitted != 2 || m.Usage("a").CreatesLastMinute != 2 {
		t.Fatalf("%d of 4 waiting creates admitted under a rate of 2 a minute (%d counted)", admitted, m.Usage("a").CreatesLastMinute)
	}
}

// TestAdmitRecordingDuringClaim: a recording create whose warm claim is
// under way holds its recording slot.
func TestAdmitRecordingDuringClaim(t *testing.T) {
	m := admitManager(map[string]TenantLimits{"a": {MaxRecordings: 1}}, 0)
	ctx := context.Background()
	r, err := m.reserve(ctx, "a", oneCPU, true, 0)
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	r.claiming = true
	m.mu.Unlock()
	if _, err := m.reserve(ctx, "a", oneCPU, true, 0); !errors.Is(err, ErrQuota) {
		t.Fatalf("a second recording while the first one's claim is under way: %v", err)
	}
	m.release(r)
}
