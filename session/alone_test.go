package session

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// aloneBackend makes sandboxes that exit at once (a start that fails),
// or, with addr, that serve there (a desktop's VNC port listens), and
// says whether the admission lock was held as it made them.
type aloneBackend struct {
	Backend
	mu      sync.Mutex
	created []Info
	record  map[string]string
	locked  func() bool
	heldAt  []bool // the lock, as each Create began
	box     *recordBox
	addr    netip.Addr
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
	addr := b.addr
	if !addr.IsValid() {
		exited <- Exit{Code: 1}
		addr = netip.MustParseAddr("127.0.0.1")
	}
	b.box = &recordBox{record: record}
	return addrBox{b.box, addr}, exited, nil
}

// addrBox is a recordBox with an address.
type addrBox struct {
	*recordBox
	addr netip.Addr
}

func (b addrBox) Addr() netip.Addr { return b.addr }

// TestAloneAdmission: a create made alone counts the sessions' records
// under the replicas' lock and refuses one over the tenant's quota (a
// stopping session still holds its share) or the gateway's capacity
// with a hint to retry, making no sandbox; one that fits makes its
// sandbox, its record naming the replica, the lock held as it is made
// and given back once it exists; a start that fails removes it. The
// lock is given back whatever comes of the create.
func TestAloneAdmission(t *testing.T) {
	var mu sync.Mutex
	held, takes, lostLock := false, 0, false
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
		Lock: func(context.Context) (func(), func() bool, error) {
			mu.Lock()
			defer mu.Unlock()
			if held {
				t.Fatal("the lock taken twice")
			}
			held = true
			takes++
			return func() { mu.Lock(); held = false; mu.Unlock() }, func() bool { return lostLock }, nil
		},
		Records: func(context.Context) ([]RecordSeen, error) { return records, nil },
		Adopts:  func(context.Context) (bool, error) { return true, nil },
	}
	runtimes := map[string]*Runtime{"runc": {Name: "runc", Usable: true}}
	spec := Spec{Tenant: "team", Runtime: "runc", TTL: time.Minute}
	lim := TenantLimits{MaxSessions: 2, MaxTTL: time.Hour, DefaultTTL: time.Minute}

	_, err := a.Create(context.Background(), spec, lim, runtimes, "runc", nil)
	var pe *PublicError
	if !errors.As(err, &pe) || !errors.Is(pe.Class, ErrQuota) || pe.RetryAfter < 1 || pe.RetryAfter > 21 || len(b.created) != 0 {
		t.Fatalf("a create over the tenant's quota (2 held, one stopping): %v, %d sandboxes made", err, len(b.created))
	}
	a.Capacity = 3
	lim.MaxSessions = 3
	if _, err := a.Create(context.Background(), spec, lim, runtimes, "runc", nil); !errors.As(err, &pe) || !errors.Is(pe.Class, ErrQuota) || len(b.created) != 0 {
		t.Fatalf("a create over the gateway's capacity (3 sessions): %v, %d sandboxes made", err, len(b.created))
	}
	a.Capacity = 4
	_, err = a.Create(context.Background(), spec, lim, runtimes, "runc", nil)
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
	if b.record[RecordAloneDue] == "" {
		t.Errorf("the record of the session made alone has no due time: %v", b.record)
	}
	if held || takes != 3 {
		t.Errorf("the lock: held %v after the creates, taken %d times, want 3", held, takes)
	}

	// Over the creates of a minute (2, both in the last 20 s): the hint
	// is when the window has room again, not a session's expiry.
	records = []RecordSeen{rec("s-5", "team", StateRunning), rec("s-6", "team", StateRunning)}
	for i, r := range records {
		r.Record[labelCreated] = time.Now().Add(-time.Duration(20+i) * time.Second).UTC().Format(time.RFC3339Nano)
		r.Record[labelExpires] = time.Now().Add(3 * time.Second).UTC().Format(time.RFC3339Nano)
	}
	lim = TenantLimits{MaxCreatesPerMinute: 2, MaxTTL: time.Hour, DefaultTTL: time.Minute}
	if _, err := a.Create(context.Background(), spec, lim, runtimes, "runc", nil); !errors.As(err, &pe) || !errors.Is(pe.Class, ErrQuota) || pe.RetryAfter < 35 || pe.RetryAfter > 40 {
		t.Errorf("a create over the creates of a minute: %v (Retry-After %d), want about 39 s", err, pe.RetryAfter)
	}
	// A last leader of an earlier version: no create alone, no lock.
	a.Adopts = func(context.Context) (bool, error) { return false, nil }
	if _, err := a.Create(context.Background(), spec, TenantLimits{MaxTTL: time.Hour}, runtimes, "runc", nil); !errors.As(err, &pe) || !errors.Is(pe.Class, ErrUnavailable) || pe.RetryAfter == 0 || takes != 4 {
		t.Errorf("a create alone after a leader of an earlier version: %v, the lock taken %d times (want 4)", err, takes)
	}
}

// TestAloneStart: a create made alone whose session answers (a
// desktop: its VNC port, on a loopback address of the test's) stores
// its first events with extra's (given the session's endpoint, for its
// recording), gets its state written running, and is
// answered running; one whose admission lease was taken over as it was
// made, or after whose start the last leader is of an earlier version,
// or whose extra fails, is removed and refused (503 to retry); its
// record never reads running then.
func TestAloneStart(t *testing.T) {
	addr := netip.AddrFrom4([4]byte{127, 77, byte(time.Now().UnixNano() % 250), 1})
	ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, VNCPort).String())
	if err != nil {
		t.Skipf("no VNC port to listen on at %s: %v", addr, err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	store := &pieceStore{}
	b := &aloneBackend{addr: addr, locked: func() bool { return false }}
	lost, adopts, adoptsAsked := false, true, 0
	a := &Alone{Backend: b, Identity: "replica-b", ReadyTimeout: 5 * time.Second, Log: slog.New(slog.DiscardHandler), Trails: store,
		Lock:    func(context.Context) (func(), func() bool, error) { return func() {}, func() bool { return lost }, nil },
		Records: func(context.Context) ([]RecordSeen, error) { return nil, nil },
		Adopts: func(context.Context) (bool, error) {
			adoptsAsked++
			return adoptsAsked == 1 || adopts, nil
		},
		Update: func(_ context.Context, id string, change func(map[string]string, bool) (map[string]string, error)) (map[string]string, bool, error) {
			b.box.mu.Lock()
			rec := maps.Clone(b.box.record)
			b.box.mu.Unlock()
			set, err := change(rec, true)
			if err != nil {
				return nil, false, err
			}
			out, err := b.box.SetRecord(context.Background(), set)
			return out, true, err
		},
	}
	runtimes := map[string]*Runtime{"runc": {Name: "runc", Usable: true}}
	spec := Spec{Tenant: "team", Kind: KindDesktop, Runtime: "runc", TTL: time.Minute}
	lim := TenantLimits{MaxTTL: time.Hour}
	issued := Event{Type: "preview_issued", Fields: map[string]any{"preview": "p-1"}}
	var given Endpoint     // what extra was given: where the session answers
	var givenDue time.Time // and by when it is done
	extra := func(ctx context.Context, info Info, ep Endpoint) ([]Event, error) {
		given = ep
		givenDue, _ = ctx.Deadline()
		return []Event{issued}, nil
	}

	info, err := a.Create(context.Background(), spec, lim, runtimes, "runc", extra)
	if err != nil || info.State != StateRunning || b.box.state2() != StateRunning || b.box.removed != 0 {
		t.Fatalf("a create alone whose session answers: %+v %v, its record %s, removed %d times", info, err, b.box.state2(), b.box.removed)
	}
	if given.VNC != netip.AddrPortFrom(addr, VNCPort) || given.CDP != netip.AddrPortFrom(addr, CDPPort) {
		t.Errorf("the endpoint extra was given: %+v, want the sandbox's (%s)", given, addr)
	}
	// Extra's deadline: here (a 5 s ready timeout) extraFloor after it
	// is called, the start's less aloneFinish being earlier.
	if until := time.Until(givenDue); givenDue.IsZero() || until < extraFloor-5*time.Second || until > extraFloor {
		t.Errorf("extra's deadline: in %v, want extraFloor (%v) from its call", until, extraFloor)
	}
	evs, _, err := StoredTrail(context.Background(), store, "team", info.ID)
	if err != nil || len(evs) != 3 || evs[0].Type != "created" || evs[1].Type != "started" || evs[2].Type != "preview_issued" {
		t.Errorf("the trail of a create alone: %+v %v", evs, err)
	}
	// A browser started for a profile: it is held until extra writes
	// the profile in (and waits for it), so only its VNC port is waited
	// for before extra (here no CDP ever answers).
	pspec := Spec{Tenant: "team", Kind: KindBrowser, Runtime: "runc", TTL: time.Minute, Profile: &ProfileUse{ID: "prof_00000000000000aa"}}
	if info, err := a.Create(context.Background(), pspec, lim, runtimes, "runc", extra); err != nil || info.State != StateRunning {
		t.Errorf("a create alone of a browser started for a profile: %+v %v, want it running once extra is done", info, err)
	}
	for _, c := range []struct {
		name  string
		setup func()
		msg   string
	}{
		{"the lease taken over", func() { lost = true }, "admission was lost"},
		{"an earlier version leads", func() { adoptsAsked, adopts = 0, false }, "earlier version took the lead"},
		{"extra fails", func() {
			extra = func(context.Context, Info, Endpoint) ([]Event, error) {
				return nil, &PublicError{Class: ErrUnavailable, Msg: "cannot sign", RetryAfter: 2}
			}
		}, "cannot sign"},
	} {
		lost, adopts, adoptsAsked = false, true, 0
		extra = func(_ context.Context, info Info, _ Endpoint) ([]Event, error) { return []Event{issued}, nil }
		c.setup()
		_, err := a.Create(context.Background(), spec, lim, runtimes, "runc", extra)
		var pe *PublicError
		if !errors.As(err, &pe) || !errors.Is(pe.Class, ErrUnavailable) || pe.RetryAfter == 0 || !strings.Contains(pe.Msg, c.msg) ||
			b.box.removed != 1 || b.box.state2() == StateRunning {
			t.Errorf("%s: %v, the sandbox removed %d times, its record %s; want 503 to retry, removed, never running", c.name, err, b.box.removed, b.box.state2())
		}
	}
}

// TestAloneFinish: a create made alone stores its first events, with
// those extra gives (a preview's issue), as the first piece of its
// trail, marked with the gateway's scope; then writes its state
// running, unless its record says a stop was asked, or its sandbox no
// longer runs (a leader removed it, overdue).
func TestAloneFinish(t *testing.T) {
	store := &pieceStore{}
	a := &Alone{Trails: store, Scope: "kubernetes/ns"}
	info := Info{ID: "s-1", Tenant: "team", Kind: KindBrowser, Runtime: "runc", CreatedAt: time.Now().UTC()}
	issued := Event{Type: "preview_issued", Fields: map[string]any{"preview": "p-1"}}
	if err := a.storeTrail(context.Background(), info, time.Second, map[string]any{"pod": 1}, []Event{issued}); err != nil {
		t.Fatal(err)
	}
	evs, gap, err := StoredTrail(context.Background(), store, "team", "s-1")
	if err != nil || gap || len(evs) != 3 || evs[0].Type != "created" || evs[1].Type != "started" || evs[2].Type != "preview_issued" ||
		evs[0].Fields["scope"] != scopeTagOf("kubernetes/ns") || evs[2].Fields["preview"] != "p-1" || evs[2].Time.IsZero() {
		t.Errorf("the trail stored by a create made alone: %+v, gap %v, %v", evs, gap, err)
	}
	if store.scopes["team/s-1"][0] != scopeTagOf("kubernetes/ns") {
		t.Errorf("the trail's piece is marked %q, want the scope's tag", store.scopes["team/s-1"][0])
	}
	for _, c := range []struct {
		name    string
		state   State
		running bool
		want    error
	}{
		{"starting", StateStarting, true, nil},
		{"stop asked", StateStopping, true, ErrConflict},
		{"sandbox gone", StateStarting, false, ErrUnavailable},
	} {
		rec := map[string]string{labelState: string(c.state)}
		a.Update = func(_ context.Context, id string, change func(map[string]string, bool) (map[string]string, error)) (map[string]string, bool, error) {
			set, err := change(rec, c.running)
			if err != nil {
				return nil, false, err
			}
			for k, v := range set {
				rec[k] = v
			}
			return rec, c.running, nil
		}
		err := a.markRunning(context.Background(), "s-1")
		var pe *PublicError
		if c.want == nil && (err != nil || rec[labelState] != string(StateRunning)) ||
			c.want != nil && (!errors.As(err, &pe) || !errors.Is(pe.Class, c.want) || rec[labelState] == string(StateRunning)) {
			t.Errorf("%s: marked %v, the record %v; want %v", c.name, err, rec, c.want)
		}
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
	var logged strings.Builder
	var logMu sync.Mutex
	m := &Manager{base: context.Background(), log: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logged}, nil)), sessions: map[string]*sess{},
		cfg: Config{ReadyTimeout: time.Minute}}
	m.backend = boxesBackend{}
	box := func(created time.Time, alone bool) *recordBox {
		r, err := containerLabels(Info{ID: "s-1", Tenant: "gone", Kind: KindBrowser, Runtime: "runc", CreatedAt: created, ExpiresAt: created.Add(time.Hour)}, "")
		if err != nil {
			t.Fatal(err)
		}
		if alone {
			r[RecordCreatedAlone] = "replica-b"
			r[RecordAloneDue] = created.Add(100 * time.Second).UTC().Format(time.RFC3339Nano)
		}
		return &recordBox{record: r}
	}
	reason := func() string {
		logMu.Lock()
		defer logMu.Unlock()
		out := logged.String()
		logged.Reset()
		return out
	}
	farDue := box(time.Now(), true)
	farDue.record[RecordAloneDue] = time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	for _, c := range []struct {
		name, reason string
		box          *recordBox
		removed      int
	}{
		{"starting alone", "is starting this session", box(time.Now(), true), 0},
		{"overdue", "did not finish in time", box(time.Now().Add(-2*time.Minute), true), 1},
		{"a due time past what a create takes", "did not finish in time", farDue, 1},
		{"a dead leader's", "tenant no longer configured", box(time.Now(), false), 1},
	} {
		kept := m.takeOver(context.Background(), idRecordBox{c.box})
		if got := reason(); c.box.removed != c.removed || kept != (c.removed == 0) || !strings.Contains(got, c.reason) {
			t.Errorf("%s: kept %v, removed %d times, want %d, for %q: %s", c.name, kept, c.box.removed, c.removed, c.reason, got)
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
		f.put("s-1", b)
		m.recordChanged(maps.Clone(b.record))
		m.wg.Wait()
		// (Removed for its tenant, not as overdue: adopted.)
		if got := reason(); b.removed != c.removed || c.removed > 0 && !strings.Contains(got, "tenant no longer configured") {
			t.Errorf("%s: the record's change seen, removed %d times, want %d: %s", c.name, b.removed, c.removed, got)
		}
	}
	// One starting whose due time passes while it still starts (its
	// creator died): removed then, once.
	soon := box(time.Now(), true)
	soon.record[RecordAloneDue] = time.Now().Add(500 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	f.put("s-1", soon)
	m.recordChanged(soon.record)
	m.recordChanged(soon.record)
	waitUntil(t, 10*time.Second, func() bool { soon.mu.Lock(); defer soon.mu.Unlock(); return soon.removed > 0 })
	time.Sleep(200 * time.Millisecond)
	m.wg.Wait()
	if got := reason(); soon.removed != 1 || !strings.Contains(got, "did not finish in time") {
		t.Errorf("a session whose start is overdue as it is awaited: removed %d times, want once: %s", soon.removed, got)
	}
	// Awaited, a record that cannot be read is taken over at once (and
	// removed); one the API server does not answer for is asked again,
	// not removed.
	mute := box(time.Now(), true)
	mute.readErr = errors.New("the API server does not answer")
	f.put("s-2", mute)
	m.overdueAlone("s-2")
	junk := box(time.Now(), true)
	junk.readErr = ErrRecordUnreadable
	junk.record[labelSession] = "s-3"
	f.put("s-3", junk)
	m.overdueAlone("s-3")
	waitUntil(t, 10*time.Second, func() bool { junk.mu.Lock(); defer junk.mu.Unlock(); return junk.removed > 0 })
	time.Sleep(300 * time.Millisecond)
	if mute.removed != 0 || junk.removed != 1 {
		t.Errorf("awaited: one the API server does not answer for removed %d times (want none), one whose record cannot be read %d times (want once)", mute.removed, junk.removed)
	}
}

// lockedWriter is a writer under a lock.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// waitUntil waits for cond, at most d.
func waitUntil(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("not in time")
		}
	}
}

// idRecordBox is a recordBox with the id of its record.
type idRecordBox struct{ *recordBox }

func (b idRecordBox) ID() string { return b.record[labelSession] }

// finder finds sandboxes by their session's id (SandboxFinder); put
// adds one while the manager's looks may be finding others.
type finder struct {
	Backend
	mu    sync.Mutex
	boxes map[string]*recordBox
}

func (f *finder) Name() string { return "test" }

func (f *finder) Sandbox(id string) Sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	return idRecordBox{f.boxes[id]}
}

func (f *finder) put(id string, b *recordBox) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boxes[id] = b
}

// TestExtraDue: extra is done aloneFinish before its creator gives up;
// extraFloor from its call at least, but never past the creator's own
// deadline.
func TestExtraDue(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		name string
		due  time.Duration // from now
		want time.Duration // from now
	}{
		{"early in the start", 90 * time.Second, 90*time.Second - aloneMargin - aloneFinish},
		{"late in the start: the floor", 40 * time.Second, extraFloor},
		{"past the floor's room: the creator's deadline", 20 * time.Second, 20*time.Second - aloneMargin},
	} {
		if got := extraDue(now.Add(c.due), now).Sub(now); got != c.want {
			t.Errorf("%s: extra due in %v, want %v", c.name, got, c.want)
		}
	}
}

// TestAloneProfileHold: a create made alone takes its profile as the
// leader holds it, by the records: a session that writes the profile
// back holds it alone (another reader or writer is refused, 409, or
// 503 to retry when it would wait for it; a stopping one still holds
// it); readers share it; another tenant's profile of the same id, or
// another profile, is no hold. A refused create makes no sandbox.
func TestAloneProfileHold(t *testing.T) {
	rec := func(id, tenant string, st State, p *ProfileUse) RecordSeen {
		r, err := containerLabels(Info{ID: id, Tenant: tenant, Kind: KindBrowser, Runtime: "runc", Profile: p,
			CreatedAt: time.Now().Add(-time.Hour), ExpiresAt: time.Now().Add(time.Hour)}, "")
		if err != nil {
			t.Fatal(err)
		}
		r[labelState] = string(st)
		return RecordSeen{Record: r, Running: true}
	}
	const pid = "prof_00000000000000aa"
	var records []RecordSeen
	b := &aloneBackend{locked: func() bool { return false }}
	a := &Alone{Backend: b, Identity: "replica-b", ReadyTimeout: 2 * time.Second, Log: slog.New(slog.DiscardHandler),
		Lock: func(context.Context) (func(), func() bool, error) {
			return func() {}, func() bool { return false }, nil
		},
		Records: func(context.Context) ([]RecordSeen, error) { return records, nil },
		Adopts:  func(context.Context) (bool, error) { return true, nil },
	}
	runtimes := map[string]*Runtime{"runc": {Name: "runc", Usable: true}}
	lim := TenantLimits{MaxTTL: time.Hour, DefaultTTL: time.Minute}
	extra := func(context.Context, Info, Endpoint) ([]Event, error) { return nil, nil }
	writer, reader := &ProfileUse{ID: pid, Persist: true}, &ProfileUse{ID: pid}
	for _, c := range []struct {
		name    string
		held    []RecordSeen
		use     *ProfileUse
		wait    time.Duration
		refused error // nil: admitted (its sandbox made)
	}{
		{"a reader, a writer holding it", []RecordSeen{rec("s-1", "team", StateRunning, writer)}, reader, 0, ErrConflict},
		{"a writer, a writer holding it", []RecordSeen{rec("s-1", "team", StateRunning, writer)}, writer, 0, ErrConflict},
		{"a writer that would wait, a writer holding it", []RecordSeen{rec("s-1", "team", StateRunning, writer)}, writer, time.Minute, ErrUnavailable},
		{"a writer, a stopping writer holding it", []RecordSeen{rec("s-1", "team", StateStopping, writer)}, writer, 0, ErrConflict},
		{"a writer, a reader holding it", []RecordSeen{rec("s-1", "team", StateRunning, reader)}, writer, 0, ErrConflict},
		{"a reader, a reader holding it", []RecordSeen{rec("s-1", "team", StateRunning, reader)}, reader, 0, nil},
		{"a writer, another tenant's writer of the id", []RecordSeen{rec("s-1", "other", StateRunning, writer)}, writer, 0, nil},
		{"a writer, a writer of another profile", []RecordSeen{rec("s-1", "team", StateRunning, &ProfileUse{ID: "prof_00000000000000bb", Persist: true})}, writer, 0, nil},
		{"a writer, none held", nil, writer, 0, nil},
	} {
		records = c.held
		made := len(b.created)
		_, err := a.Create(context.Background(), Spec{Tenant: "team", Runtime: "runc", TTL: time.Minute, Profile: c.use, Wait: c.wait}, lim, runtimes, "runc", extra)
		var pe *PublicError
		switch {
		case c.refused == nil:
			// Admitted: its sandbox made (its start fails here).
			if len(b.created) != made+1 || errors.As(err, &pe) && errors.Is(pe.Class, ErrConflict) {
				t.Errorf("%s: %v, %d sandboxes made, want it admitted", c.name, err, len(b.created)-made)
			}
		case !errors.As(err, &pe) || !errors.Is(pe.Class, c.refused) || !strings.Contains(pe.Msg, pid) || len(b.created) != made:
			t.Errorf("%s: %v, %d sandboxes made, want %v and none", c.name, err, len(b.created)-made, c.refused)
		case c.refused == ErrUnavailable && pe.RetryAfter == 0:
			t.Errorf("%s: %v without a Retry-After", c.name, err)
		}
	}
	records = nil
	if _, err := a.Create(context.Background(), Spec{Tenant: "team", Runtime: "runc", TTL: time.Minute, Profile: writer}, lim, runtimes, "runc", nil); err == nil {
		t.Error("a create with a profile and no extra to write it in: made")
	}
}

// TestStartingAloneHoldsProfile: a leader that sees a session a replica
// starts alone holds its profile for it as for a create of its own (a
// create of the leader's from that profile is refused meanwhile; one
// from another profile, the control, is not), the hold becomes the
// session's as it is adopted (its end drops it), and it is dropped if
// the session is not adopted (its Pod gone, or removed as it turns
// running).
func TestStartingAloneHoldsProfile(t *testing.T) {
	m := &Manager{base: context.Background(), log: slog.New(slog.DiscardHandler), sessions: map[string]*sess{},
		profiles: map[string]*profileHold{}, profileFreed: make(chan struct{}), cfg: Config{ReadyTimeout: time.Minute}}
	const pid = "prof_00000000000000aa"
	box := func(id string, due time.Duration) *recordBox {
		r, err := containerLabels(Info{ID: id, Tenant: "gone", Kind: KindBrowser, Runtime: "runc", Profile: &ProfileUse{ID: pid, Persist: true},
			CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}, "")
		if err != nil {
			t.Fatal(err)
		}
		r[RecordCreatedAlone] = "replica-b"
		r[RecordAloneDue] = time.Now().Add(due).UTC().Format(time.RFC3339Nano)
		return &recordBox{record: r}
	}
	// (All in the finder before any look at them runs.)
	f := &finder{boxes: map[string]*recordBox{"s-1": box("s-1", 100*time.Second), "s-2": box("s-2", 300*time.Millisecond), "s-3": box("s-3", 100*time.Second)}}
	m.backend = f
	leaderCreate := func(id string) error {
		release, err := m.holdProfile(context.Background(), Spec{Tenant: "gone", Profile: &ProfileUse{ID: id}})
		if err == nil {
			release()
		}
		return err
	}

	// Seen at the leader's takeover: held.
	if !m.takeOver(context.Background(), idRecordBox{f.boxes["s-1"]}) || !m.ProfileInUse("gone", pid) {
		t.Fatalf("a session starting alone, at the takeover: its profile in use %v, want held", m.ProfileInUse("gone", pid))
	}
	var pe *PublicError
	if err := leaderCreate(pid); !errors.As(err, &pe) || !errors.Is(pe.Class, ErrConflict) {
		t.Errorf("a leader's create from the profile of a session starting alone: %v, want a conflict", err)
	}
	if err := leaderCreate("prof_00000000000000bb"); err != nil {
		t.Errorf("a leader's create from another profile: %v", err)
	}
	// Adopted: the session's hold, dropped as it ends.
	s := newSess(Info{ID: "s-1", Tenant: "gone", Profile: &ProfileUse{ID: pid, Persist: true}})
	m.mu.Lock()
	m.keepHoldLocked(s, m.log)
	moved := len(m.aloneHolds) == 0
	m.mu.Unlock()
	if !moved || s.releaseProfile == nil || !m.ProfileInUse("gone", pid) {
		t.Fatalf("the hold as the session is adopted: moved %v, the session's %v, in use %v", moved, s.releaseProfile != nil, m.ProfileInUse("gone", pid))
	}
	s.releaseProfile()
	if m.ProfileInUse("gone", pid) || leaderCreate(pid) != nil {
		t.Errorf("the profile after the adopted session ended: still held")
	}

	// Seen as its record changes, then its Pod gone by its due time:
	// dropped.
	m.recordChanged(maps.Clone(f.boxes["s-2"].record))
	if !m.ProfileInUse("gone", pid) {
		t.Fatal("a session starting alone, seen by its record's change: its profile not held")
	}
	f.boxes["s-2"].mu.Lock()
	f.boxes["s-2"].readErr = ErrSandboxGone
	f.boxes["s-2"].mu.Unlock()
	waitUntil(t, 10*time.Second, func() bool { return !m.ProfileInUse("gone", pid) })

	// Seen, then running: the adoption fails here (the tenant is not
	// configured), and the session is removed with its hold.
	m.recordChanged(maps.Clone(f.boxes["s-3"].record))
	if !m.ProfileInUse("gone", pid) {
		t.Fatal("a third session starting alone: its profile not held")
	}
	f.boxes["s-3"].mu.Lock()
	f.boxes["s-3"].record[labelState] = string(StateRunning)
	running := maps.Clone(f.boxes["s-3"].record)
	f.boxes["s-3"].mu.Unlock()
	m.recordChanged(running)
	// (The first look, awaiting its due time, may see it running too and
	// take it over again: this fake's record outlives its removal, where
	// a Pod's would not.)
	waitUntil(t, 10*time.Second, func() bool {
		f.boxes["s-3"].mu.Lock()
		defer f.boxes["s-3"].mu.Unlock()
		return f.boxes["s-3"].removed > 0 && !m.ProfileInUse("gone", pid)
	})
}

// TestAdoptExpiredProfile: a session that expired while no gateway held
// it is removed as expired at a takeover, unless it writes its profile
// back: that one is adopted to be stopped (here it goes on to fail for
// its runtime, which shows it was not refused as expired).
func TestAdoptExpiredProfile(t *testing.T) {
	m := &Manager{base: context.Background(), log: slog.New(slog.DiscardHandler), sessions: map[string]*sess{},
		cfg: Config{ReadyTimeout: time.Minute, Tenants: map[string]TenantLimits{"team": {MaxTTL: time.Hour}}}}
	for _, c := range []struct {
		name string
		use  *ProfileUse
		why  string
	}{
		{"none", nil, "expired"},
		{"a profile it reads", &ProfileUse{ID: "prof_00000000000000aa"}, "expired"},
		{"a profile it writes back", &ProfileUse{ID: "prof_00000000000000aa", Persist: true}, "runtime no longer usable"},
	} {
		r, err := containerLabels(Info{ID: "s-1", Tenant: "team", Kind: KindBrowser, Runtime: "runc", Profile: c.use,
			CreatedAt: time.Now().Add(-time.Hour), ExpiresAt: time.Now().Add(-time.Minute)}, "")
		if err != nil {
			t.Fatal(err)
		}
		r[labelState] = string(StateRunning)
		if _, _, why := m.adopt(context.Background(), idRecordBox{&recordBox{record: r}}); why != c.why {
			t.Errorf("an expired session, %s: %q, want %q", c.name, why, c.why)
		}
	}
}

// savingKeeper is an Observer and a Keeper that counts the saves asked.
type savingKeeper struct {
	mu    sync.Mutex
	saved int
}

func (k *savingKeeper) SessionRunning(Info, Endpoint)                {}
func (k *savingKeeper) SessionEnded(Info, []Event)                   {}
func (k *savingKeeper) Restore(context.Context, Info, *Inside) error { return nil }
func (k *savingKeeper) Save(context.Context, Info, *Inside) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.saved++
}

func (k *savingKeeper) saves() int { k.mu.Lock(); defer k.mu.Unlock(); return k.saved }

// TestSaveAwaitsObserver: a session that writes its profile back and is
// stopped before the gateway observes the manager (adopted as the
// manager starts: its stop resumed, or expired) has its profile saved
// once it does, not skipped for want of a Keeper; the control, a
// session that only reads its profile, is never saved.
func TestSaveAwaitsObserver(t *testing.T) {
	m := &Manager{base: context.Background(), log: slog.New(slog.DiscardHandler), sessions: map[string]*sess{},
		observed: make(chan struct{}), cfg: Config{StateDir: t.TempDir()}}
	writer := newSess(Info{ID: "s-1", Tenant: "team", Profile: &ProfileUse{ID: "prof_00000000000000aa", Persist: true}})
	reader := newSess(Info{ID: "s-2", Tenant: "team", Profile: &ProfileUse{ID: "prof_00000000000000aa"}})
	done := make(chan struct{}, 2)
	for _, s := range []*sess{writer, reader} {
		go func() {
			m.save(context.Background(), s, &recordBox{record: map[string]string{}}, StateStopped)
			done <- struct{}{}
		}()
	}
	<-done // the reader's, at once
	select {
	case <-done:
		t.Fatal("the save of a session that writes its profile back ended before the gateway observed the manager")
	case <-time.After(200 * time.Millisecond):
	}
	k := &savingKeeper{}
	m.Observe(k)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the save did not go on once the gateway observed the manager")
	}
	if k.saves() != 1 {
		t.Errorf("saves asked: %d, want the writer's alone", k.saves())
	}
	m.wg.Wait()
}
