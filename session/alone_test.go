package session

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// aloneBackend makes sandboxes that exit at once (a start that fails),
// and says whether the admission lock was held as it made them.
type aloneBackend struct {
	Backend
	mu      sync.Mutex
	created []Info
	record  map[string]string
	locked  func() bool
	heldAt  []bool // the lock, as each Create began
	box     *recordBox
	// unlockedBy: the lock was given back by the time Create returned.
	unlockedBy bool
}

func (b *aloneBackend) Name() string { return "test" }

func (b *aloneBackend) Create(_ context.Context, info Info, _ *Runtime, record map[string]string, host Host) (Sandbox, <-chan Exit, error) {
	b.mu.Lock()
	b.created = append(b.created, info)
	b.record = record
	b.heldAt = append(b.heldAt, b.locked())
	b.mu.Unlock()
	host.Done("pod") // the sandbox exists
	b.unlockedBy = !b.locked()
	exited := make(chan Exit, 1)
	exited <- Exit{Code: 1}
	b.box = &recordBox{record: record}
	return addrBox{b.box}, exited, nil
}

// addrBox is a recordBox with an address (where nothing answers).
type addrBox struct{ *recordBox }

func (addrBox) Addr() netip.Addr { return netip.MustParseAddr("127.0.0.1") }

// TestAloneAdmission: a create made alone counts the sessions' records
// under the replicas' lock and refuses one over the tenant's quota (a
// stopping session still holds its share) or the gateway's capacity
// with a hint to retry, making no sandbox; one that fits makes its
// sandbox, its record naming the replica, the lock held as it is made
// and given back once it exists; a start that fails removes it. The
// lock is given back whatever comes of the create.
func TestAloneAdmission(t *testing.T) {
	var mu sync.Mutex
	held, takes := false, 0
	rec := func(id, tenant string, st State) RecordSeen {
		r, err := containerLabels(Info{ID: id, Tenant: tenant, Kind: KindBrowser, Runtime: "runc", CreatedAt: time.Now().Add(-time.Hour), ExpiresAt: time.Now().Add(20 * time.Second)}, "")
		if err != nil {
			t.Fatal(err)
		}
		r[labelState] = string(st)
		return RecordSeen{Record: r, Running: true}
	}
	records := []RecordSeen{rec("s-1", "team", StateRunning), rec("s-2", "team", StateStopping), rec("s-3", "other", StateRunning),
		{Record: map[string]string{labelPool: "p", labelSession: "s-4"}}} // a pooled sandbox counts for nobody
	b := &aloneBackend{}
	b.locked = func() bool { mu.Lock(); defer mu.Unlock(); return held }
	a := &Alone{Backend: b, Identity: "replica-b", ReadyTimeout: 2 * time.Second, Log: slog.New(slog.DiscardHandler),
		Lock: func(context.Context) (func(), error) {
			mu.Lock()
			defer mu.Unlock()
			if held {
				t.Fatal("the lock taken twice")
			}
			held = true
			takes++
			return func() { mu.Lock(); held = false; mu.Unlock() }, nil
		},
		Records: func(context.Context) ([]RecordSeen, error) { return records, nil },
	}
	runtimes := map[string]*Runtime{"runc": {Name: "runc", Usable: true}}
	spec := Spec{Tenant: "team", Runtime: "runc", TTL: time.Minute}
	lim := TenantLimits{MaxSessions: 2, MaxTTL: time.Hour, DefaultTTL: time.Minute}

	_, err := a.Create(context.Background(), spec, lim, runtimes, "runc")
	var pe *PublicError
	if !errors.As(err, &pe) || !errors.Is(pe.Class, ErrQuota) || pe.RetryAfter < 1 || pe.RetryAfter > 21 || len(b.created) != 0 {
		t.Fatalf("a create over the tenant's quota (2 held, one stopping): %v, %d sandboxes made", err, len(b.created))
	}
	a.Capacity = 3
	lim.MaxSessions = 3
	if _, err := a.Create(context.Background(), spec, lim, runtimes, "runc"); !errors.As(err, &pe) || !errors.Is(pe.Class, ErrQuota) || len(b.created) != 0 {
		t.Fatalf("a create over the gateway's capacity (3 sessions): %v, %d sandboxes made", err, len(b.created))
	}
	a.Capacity = 4
	_, err = a.Create(context.Background(), spec, lim, runtimes, "runc")
	if !errors.As(err, &pe) || !errors.Is(pe.Class, ErrUnavailable) || len(b.created) != 1 {
		t.Fatalf("a create that fits, whose start fails: %v, %d sandboxes made", err, len(b.created))
	}
	if !b.heldAt[0] || !b.unlockedBy {
		t.Errorf("the lock as the sandbox was made: held %v, given back once it existed %v", b.heldAt[0], b.unlockedBy)
	}
	if b.record[RecordCreatedAlone] != "replica-b" || b.record[labelState] != string(StateStarting) || b.record[labelTenant] != "team" {
		t.Errorf("the record of the session made alone: %v", b.record)
	}
	if b.box.removed != 1 {
		t.Errorf("the sandbox of the start that failed was removed %d times, want once", b.box.removed)
	}
	if held || takes != 3 {
		t.Errorf("the lock: held %v after the creates, taken %d times, want 3", held, takes)
	}
}

// TestStartingAlone: a leader that takes over leaves a session a
// replica is starting alone to that replica (not removed), and removes
// one whose start is overdue (its creator died) or that another
// replica's record does not say it made (the control: a starting
// session of a leader that died, which does not answer). A record of a
// session made alone that runs now is adopted as its change is seen;
// one still starting, or not made alone, is not.
func TestStartingAlone(t *testing.T) {
	m := &Manager{base: context.Background(), log: slog.New(slog.DiscardHandler), sessions: map[string]*sess{},
		cfg: Config{ReadyTimeout: time.Minute}}
	m.backend = boxesBackend{}
	box := func(created time.Time, alone bool) *recordBox {
		r, err := containerLabels(Info{ID: "s-1", Tenant: "gone", Kind: KindBrowser, Runtime: "runc", CreatedAt: created, ExpiresAt: created.Add(time.Hour)}, "")
		if err != nil {
			t.Fatal(err)
		}
		if alone {
			r[RecordCreatedAlone] = "replica-b"
		}
		return &recordBox{record: r}
	}
	for _, c := range []struct {
		name    string
		box     *recordBox
		removed int
	}{
		{"starting alone", box(time.Now(), true), 0},
		{"overdue", box(time.Now().Add(-2*time.Minute), true), 1},
		{"a dead leader's", box(time.Now(), false), 1},
	} {
		kept := m.takeOver(context.Background(), idRecordBox{c.box})
		if c.box.removed != c.removed || kept != (c.removed == 0) {
			t.Errorf("%s: kept %v, removed %d times, want %d", c.name, kept, c.box.removed, c.removed)
		}
	}

	// Adopted as its record's change is seen: the tenant is unknown
	// here, so the adoption removes it (what shows it was tried).
	f := &finder{boxes: map[string]*recordBox{}}
	m.backend = f
	for _, c := range []struct {
		name    string
		state   State
		alone   bool
		removed int
	}{
		{"running, made alone", StateRunning, true, 1},
		{"stopping, made alone", StateStopping, true, 1},
		{"starting, made alone", StateStarting, true, 0},
		{"running, made by a leader", StateRunning, false, 0},
	} {
		b := box(time.Now(), c.alone)
		b.record[labelState] = string(c.state)
		f.boxes["s-1"] = b
		m.recordChanged(b.record)
		m.wg.Wait()
		if b.removed != c.removed {
			t.Errorf("%s: the record's change seen, removed %d times, want %d", c.name, b.removed, c.removed)
		}
	}
}

// idRecordBox is a recordBox with the id of its record.
type idRecordBox struct{ *recordBox }

func (b idRecordBox) ID() string { return b.record[labelSession] }

// finder finds sandboxes by their session's id (SandboxFinder).
type finder struct {
	Backend
	boxes map[string]*recordBox
}

func (f *finder) Name() string              { return "test" }
func (f *finder) Sandbox(id string) Sandbox { return idRecordBox{f.boxes[id]} }
