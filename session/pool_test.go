package session

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func testPools(t *testing.T, limits PoolLimits, sizes ...int) (*Manager, []*pool) {
	t.Helper()
	m := &Manager{log: slog.New(slog.NewTextHandler(io.Discard, nil)), sessions: map[string]*sess{},
		queues: map[string][]*waiter{}, reserved: map[*reservation]bool{}, creates: map[string][]time.Time{},
		cfg: Config{Tenants: map[string]TenantLimits{"a": {MaxSessions: 2}, "b": {}}}}
	var ps []*pool
	for i, n := range sizes {
		w := 1000 + i
		ps = append(ps, &pool{shape: shape{kind: KindBrowser, runtime: "runc", screen: Screen{w, 800},
			resources: Resources{CPUs: 1, MemoryMB: 2048, Pids: 1024}}, size: n})
	}
	m.pools, m.poolLimits, m.refillNow = ps, limits.withDefaults(ps), make(chan struct{}, 1)
	return m, ps
}

var pooledN int

func addPooled(m *Manager, p *pool, state State) *sess {
	pooledN++
	s := newSess(Info{ID: fmt.Sprintf("pooled-%d", pooledN), State: state, CreatedAt: time.Now()})
	s.pool = p
	m.sessions[s.info.ID] = s
	return s
}

func TestNextRefillKeepsLimits(t *testing.T) {
	now := time.Now()
	m, ps := testPools(t, PoolLimits{MinAvailableMemoryMB: 1024}, 2, 1)
	// Control: an empty pool with memory to spare is refilled, the one
	// furthest below its size first.
	if p := m.nextRefill(now, 8192); p != ps[0] {
		t.Fatalf("empty pools: refill %v, want the first", p)
	}
	addPooled(m, ps[0], StateRunning)
	addPooled(m, ps[0], StateStarting)
	if p := m.nextRefill(now, 8192); p != ps[1] {
		t.Fatalf("first pool full: refill %v, want the second", p)
	}
	// Too little memory: a session's limit (2048) plus the reserve.
	if p := m.nextRefill(now, 3071); p != nil {
		t.Fatalf("refill with 3071 MB available: %v", p.key())
	}
	if p := m.nextRefill(now, 3072); p != ps[1] {
		t.Fatalf("refill with 3072 MB available: %v", p)
	}
	// A pool in backoff waits.
	ps[1].nextTry = now.Add(time.Second)
	if p := m.nextRefill(now, 8192); p != nil {
		t.Fatalf("refill in backoff: %v", p.key())
	}
	ps[1].nextTry = time.Time{}
	// Full pools are left alone; a claimed session no longer counts.
	last := addPooled(m, ps[1], StateRunning)
	if p := m.nextRefill(now, 8192); p != nil {
		t.Fatalf("full pools refilled: %v", p.key())
	}
	// Claimed, but containerd still has its container labelled pooled
	// (storeClaim): it holds its place until then.
	last.pool, last.storing = nil, ps[1]
	if p := m.nextRefill(now, 8192); p != nil {
		t.Fatalf("refilled while a claim's labels are not stored: %v", p.key())
	}
	last.storing = nil
	if p := m.nextRefill(now, 8192); p != ps[1] {
		t.Fatalf("after a claim: refill %v, want the second", p)
	}
	// Ended pooled sessions do not count either.
	last.pool = ps[1]
	last.info.State = StateFailed
	if p := m.nextRefill(now, 8192); p != ps[1] {
		t.Fatalf("after a failure: refill %v, want the second", p)
	}
}

func TestNextRefillMaxSessions(t *testing.T) {
	m, ps := testPools(t, PoolLimits{MaxSessions: 2}, 2, 2)
	addPooled(m, ps[0], StateRunning)
	if p := m.nextRefill(time.Now(), -1); p == nil {
		t.Fatal("one pooled session of at most 2: no refill")
	}
	addPooled(m, ps[1], StateStarting)
	if p := m.nextRefill(time.Now(), -1); p != nil {
		t.Fatalf("two pooled sessions of at most 2: refill %v", p.key())
	}
}

func TestTakePooledOnceAndQuota(t *testing.T) {
	m, ps := testPools(t, PoolLimits{}, 2)
	old := addPooled(m, ps[0], StateRunning)
	old.info.CreatedAt = time.Now().Add(-time.Minute)
	young := addPooled(m, ps[0], StateRunning)
	addPooled(m, ps[0], StateStarting)
	if s := m.takePooled(ps[0], "a"); s != old {
		t.Fatal("the oldest started session is not taken first")
	}
	if s := m.takePooled(ps[0], "b"); s != young {
		t.Fatal("the second claim does not get the other session")
	}
	if s := m.takePooled(ps[0], "b"); s != nil {
		t.Fatal("a session reserved for a claim (or still starting) is taken again")
	}
	// The reserved claim counts against tenant a's quota of 2; pooled
	// sessions count against nobody.
	if why := m.fitsLocked("a", Resources{}, false); why != "" {
		t.Fatalf("one claim of 2: %v", why)
	}
	s := newSess(Info{ID: "x", Tenant: "a", State: StateRunning})
	m.sessions["x"] = s
	if why := m.fitsLocked("a", Resources{}, false); why == "" {
		t.Fatal("a running session and a claim of 2 leave room for a third")
	}
	// Pooled sessions are nobody's: hidden from lookups and lists.
	if _, err := m.lookup("", young.info.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("lookup of a pooled session: %v", err)
	}
	if got := m.List(""); len(got) != 0 {
		t.Fatalf("pooled sessions listed: %v", got)
	}
	st := m.Pools()
	if len(st) != 1 || st[0].Available != 0 || st[0].Starting != 1 || st[0].Size != 2 {
		t.Fatalf("stats: %+v", st)
	}
}

func TestFitting(t *testing.T) {
	m, ps := testPools(t, PoolLimits{}, 1)
	spec := Spec{Kind: KindBrowser, Runtime: "runc", Screen: Screen{1000, 800}, Resources: Resources{CPUs: 1, MemoryMB: 2048, Pids: 1024}}
	if m.fitting(spec) != ps[0] {
		t.Fatal("a request of the pool's shape does not fit it")
	}
	for name, change := range map[string]func(*Spec){
		"kind":    func(s *Spec) { s.Kind = KindDesktop },
		"runtime": func(s *Spec) { s.Runtime = "gvisor" },
		"screen":  func(s *Spec) { s.Screen.Height = 801 },
		"cpus":    func(s *Spec) { s.Resources.CPUs = 2 },
		"memory":  func(s *Spec) { s.Resources.MemoryMB = 4096 },
	} {
		s := spec
		change(&s)
		if m.fitting(s) != nil {
			t.Errorf("another %s fits the pool", name)
		}
	}
}

func TestNormalizeRefusesWhatLabelsCannotHold(t *testing.T) {
	m, _ := testPools(t, PoolLimits{}, 1)
	m.runtimes = map[string]*Runtime{"runc": {Name: "runc", Usable: true}}
	m.cfg.Tenants["a"] = TenantLimits{MaxTTL: time.Hour, DefaultTTL: time.Minute}
	spec := func(labels int) Spec {
		l := map[string]string{}
		for i := 0; i < labels; i++ {
			l[fmt.Sprintf("label-%02d-%s", i, strings.Repeat("k", 50))] = strings.Repeat("<", 250)
		}
		return Spec{Tenant: "a", Runtime: "runc", Labels: l}
	}
	// Control: a few large labels fit.
	s := spec(2)
	if _, err := m.normalize(&s); err != nil {
		t.Fatalf("two labels: %v", err)
	}
	// 32 labels within the per-label bounds do not fit containerd's
	// 4096-byte label: a 400 now, not a 503 when the container is made.
	s = spec(32)
	if _, err := m.normalize(&s); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("32 large labels: %v", err)
	}
}

// TestTakePooledPrefersSettled: a claim takes a settled pooled session
// before one whose start is still busy, the oldest among equals, and a
// busy one rather than none.
func TestTakePooledPrefersSettled(t *testing.T) {
	m, ps := testPools(t, PoolLimits{}, 3)
	old := addPooled(m, ps[0], StateRunning)
	old.info.CreatedAt = time.Now().Add(-time.Minute)
	settled := addPooled(m, ps[0], StateRunning)
	settled.settled = true
	younger := addPooled(m, ps[0], StateRunning)
	younger.settled = true
	if got := m.Pools()[0]; got.Available != 3 || got.Settling != 1 {
		t.Fatalf("pool stats: %+v, want 3 available and 1 settling", got)
	}
	// The busy one is the oldest: by age alone it would go first.
	if s := m.takePooled(ps[0], "a"); s != settled {
		t.Fatalf("first claim took %s, want the oldest settled (%s)", s.info.ID, settled.info.ID)
	}
	if s := m.takePooled(ps[0], "a"); s != younger {
		t.Fatalf("second claim took %s, want the other settled (%s)", s.info.ID, younger.info.ID)
	}
	if s := m.takePooled(ps[0], "a"); s != old {
		t.Fatalf("third claim took %v, want the busy one rather than none", s)
	}
	if s := m.takePooled(ps[0], "a"); s != nil {
		t.Fatalf("fourth claim took %s from an empty pool", s.info.ID)
	}
}
