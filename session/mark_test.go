package session

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"sync"
	"testing"
	"time"
)

// recordBox is a sandbox whose record is a map (SetRecord alone); the
// first fail writes fail.
type recordBox struct {
	Sandbox
	mu     sync.Mutex
	record map[string]string
	writes int
	fail   int
	// removed counts the removals.
	removed int
	delay   time.Duration
	// readErr, if set, is what reading the record returns.
	readErr error
}

func (b *recordBox) SetRecord(_ context.Context, change map[string]string) (map[string]string, error) {
	time.Sleep(b.delay)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail > 0 {
		b.fail--
		return nil, errors.New("the API server does not answer")
	}
	for k, v := range change {
		b.record[k] = v
	}
	b.writes++
	return b.record, nil
}

func (b *recordBox) Remove(context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.removed++
	return nil
}

func (b *recordBox) Record(context.Context) (map[string]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.readErr != nil {
		return nil, b.readErr
	}
	return maps.Clone(b.record), nil
}

// UpdateRecord is SetRecord of what change makes of the record, as a
// write conditional on it (one writer at a time here).
func (b *recordBox) UpdateRecord(_ context.Context, change func(map[string]string) (map[string]string, error)) (map[string]string, error) {
	b.mu.Lock()
	rec := maps.Clone(b.record)
	b.mu.Unlock()
	set, err := change(rec)
	if err != nil || len(set) == 0 {
		return rec, err
	}
	return b.SetRecord(context.Background(), set)
}

func (b *recordBox) state(t *testing.T) State {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	info, _, err := FromRecord(b.record)
	if err != nil {
		t.Fatal(err)
	}
	return info.State
}

// TestMarkState: under a backend whose records other replicas read, a
// session's record says starting from its creation, running once marked
// so (a failed write is tried again), and stopping once its stop began,
// whatever comes after (a running mark written late does not undo a
// stop); a mark already stored is not written again. A record of a
// gateway before the marks reads running. Under the containerd backend
// nothing is written.
func TestMarkState(t *testing.T) {
	m := &Manager{base: context.Background(), log: slog.New(slog.DiscardHandler)}
	now := time.Now().UTC()
	info := Info{ID: "s-1", Tenant: "t", Kind: KindBrowser, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	rec, err := containerLabels(info, "10.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	box := &recordBox{record: rec, delay: 20 * time.Millisecond}
	if st := box.state(t); st != StateStarting {
		t.Fatalf("as created: %s, want starting", st)
	}
	s := newSess(info)
	m.markRunning(s, box) // apart: the stop below may come first
	if err := m.markState(context.Background(), s, box, StateStopping); err != nil {
		t.Fatal(err)
	}
	m.markRunning(s, box)
	m.wg.Wait()
	if st := box.state(t); st != StateStopping {
		t.Fatalf("after a stop began: %s, want stopping", st)
	}

	// The control: a session that runs and is not stopped reads running,
	// its failed first write tried again; marked twice, written once.
	rec2, _ := containerLabels(Info{ID: "s-2", Tenant: "t", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, "10.0.0.3")
	box2 := &recordBox{record: rec2, fail: 1}
	s2 := newSess(Info{ID: "s-2", Tenant: "t"})
	m.markRunning(s2, box2)
	m.wg.Wait()
	if err := m.markState(context.Background(), s2, box2, StateRunning); err != nil {
		t.Fatal(err)
	}
	if st := box2.state(t); st != StateRunning || box2.writes != 1 {
		t.Fatalf("a running session: %s, %d writes", st, box2.writes)
	}

	// A record of a gateway before the marks.
	old, _ := containerLabels(Info{ID: "s-3", Tenant: "t", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, "10.0.0.4")
	delete(old, labelState)
	if st := (&recordBox{record: old}).state(t); st != StateRunning {
		t.Fatalf("a record with no state: %s, want running", st)
	}

	// The containerd backend (its own network): nothing written.
	cm := &Manager{base: context.Background(), log: slog.New(slog.DiscardHandler), net: &network{}}
	box4 := &recordBox{record: map[string]string{}}
	cm.markRunning(newSess(info), box4)
	cm.wg.Wait()
	if err := cm.markState(context.Background(), newSess(info), box4, StateStopping); err != nil || box4.writes != 0 {
		t.Fatalf("under containerd: %d writes, %v", box4.writes, err)
	}
}

// TestRecordWrittenElsewhere: under a backend whose records another
// gateway replica writes (a delete or an extension while no leader
// answered it), the manager holds to them. Its extension is written
// (the control), but refused (409) over a stop another replica stored,
// the record and the session kept; a running mark is not written over
// such a stop; an expiry another replica wrote is the session's, and
// so is one the reaper finds in the record as the session comes due;
// a stop another replica asked stops the session, recorded once, the
// stop asked cleared from the record.
func TestRecordWrittenElsewhere(t *testing.T) {
	now := time.Now().UTC()
	info := Info{ID: "s-1", Tenant: "t", Kind: KindBrowser, State: StateRunning, CreatedAt: now, ExpiresAt: now.Add(10 * time.Minute)}
	rec, err := containerLabels(info, "10.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	rec[labelState] = string(StateRunning)
	box := &recordBox{record: rec}
	s := newSess(info)
	s.box = box
	m := &Manager{base: context.Background(), log: slog.New(slog.DiscardHandler), sessions: map[string]*sess{"s-1": s},
		cfg: Config{Tenants: map[string]TenantLimits{"t": {MaxTTL: time.Hour}}}}
	ctx := context.Background()

	got, err := m.Extend(ctx, "t", "s-1", 30*time.Minute)
	if err != nil || box.record[labelExpires] != got.ExpiresAt.Format(time.RFC3339Nano) {
		t.Fatalf("an extension: %v, record %q, answered %v", err, box.record[labelExpires], got.ExpiresAt)
	}
	extended := box.record[labelExpires]
	box.mu.Lock()
	box.record[labelState], box.record[RecordStopAsked] = string(StateStopping), now.Format(time.RFC3339Nano)
	box.mu.Unlock()
	var pe *PublicError
	if _, err := m.Extend(ctx, "t", "s-1", 40*time.Minute); !errors.As(err, &pe) || pe.Class != ErrConflict || box.record[labelExpires] != extended ||
		s.info.ExpiresAt.Format(time.RFC3339Nano) != extended {
		t.Fatalf("an extension over a stop another replica stored: %v, record %q, session %v, want 409 and %q", err, box.record[labelExpires], s.info.ExpiresAt, extended)
	}

	// A running mark over such a stop: not written.
	s2 := newSess(Info{ID: "s-2", Tenant: "t"})
	box2 := &recordBox{record: map[string]string{labelState: string(StateStopping), RecordStopAsked: now.Format(time.RFC3339Nano)}}
	if err := m.markState(ctx, s2, box2, StateRunning); err != nil || box2.writes != 0 || box2.state2() != StateStopping {
		t.Fatalf("a running mark over a stop another replica stored: %v, %d writes, state %s", err, box2.writes, box2.state2())
	}
	// The control: over a starting record it is.
	box3 := &recordBox{record: map[string]string{labelState: string(StateStarting)}}
	if err := m.markState(ctx, newSess(Info{ID: "s-3", Tenant: "t"}), box3, StateRunning); err != nil || box3.state2() != StateRunning {
		t.Fatalf("a running mark over a starting record: %v, state %s", err, box3.state2())
	}

	// An expiry another replica wrote, told by the watch.
	later := now.Add(50 * time.Minute).Truncate(time.Millisecond)
	told := maps.Clone(rec)
	told[labelState], told[labelExpires] = string(StateRunning), later.Format(time.RFC3339Nano)
	m.recordChanged(told)
	if !s.info.ExpiresAt.Equal(later) {
		t.Fatalf("an expiry another replica wrote: the session expires %v, want %v", s.info.ExpiresAt, later)
	}
	other := maps.Clone(told)
	other[labelSession], other[labelExpires] = "s-9", now.Format(time.RFC3339Nano)
	m.recordChanged(other) // not held: nothing
	if !s.info.ExpiresAt.Equal(later) {
		t.Fatalf("another session's record moved this one's expiry to %v", s.info.ExpiresAt)
	}

	// The reaper's look: a session come due whose record holds a later
	// expiry runs on.
	m.backend = watchingBackend{}
	s.info.ExpiresAt = now.Add(-time.Second)
	box.mu.Lock()
	box.record[labelState], box.record[RecordStopAsked] = string(StateRunning), ""
	box.record[labelExpires] = now.Add(time.Minute).Format(time.RFC3339Nano)
	box.mu.Unlock()
	m.wg.Add(1)
	m.reapUnlessExtended(s)
	if s.info.State != StateRunning || !s.info.ExpiresAt.After(now) {
		t.Fatalf("a session due whose record was extended: %s, expires %v", s.info.State, s.info.ExpiresAt)
	}
	// A stop another replica stored, told by the watch: the session
	// stops, its trail saying when the stop was asked, once; its record
	// is stopping, the stop asked cleared (recorded).
	asked := now.Add(-time.Second).Truncate(time.Millisecond)
	stop := maps.Clone(box.record)
	stop[labelState], stop[RecordStopAsked] = string(StateStopping), asked.Format(time.RFC3339Nano)
	box.mu.Lock()
	maps.Copy(box.record, stop)
	box.mu.Unlock()
	m.recordChanged(stop)
	m.recordChanged(stop) // told twice (a late event): one stop
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the session whose record another replica marked stopping did not stop")
	}
	var requested []map[string]any
	for _, ev := range s.trail.events() {
		if ev.Type == "stop_requested" {
			requested = append(requested, ev.Fields)
		}
	}
	if len(requested) != 1 || requested[0]["happened_at"] != asked.Format(time.RFC3339Nano) || s.info.State != StateStopped {
		t.Errorf("the stop another replica asked: %s, stop_requested %v, want stopped, one at %v", s.info.State, requested, asked)
	}
	if box.state2() != StateStopping || box.record[RecordStopAsked] != "" || box.removed != 1 {
		t.Errorf("the stopped session's record: %s, stop asked %q, removed %d times", box.state2(), box.record[RecordStopAsked], box.removed)
	}
}

// watchingBackend is a backend whose records others write.
type watchingBackend struct{ Backend }

func (watchingBackend) WatchRecords(func(map[string]string)) {}

// state2 is the record's state, as read by a replica (no session
// needed).
func (b *recordBox) state2() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return State(b.record[labelState])
}
