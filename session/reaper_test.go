package session

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"
)

type blockingObserver struct {
	release chan struct{}
	ended   chan string
}

func (o *blockingObserver) SessionRunning(Info, Endpoint) {}
func (o *blockingObserver) SessionEnded(info Info, _ []Event) {
	<-o.release
	o.ended <- info.ID
}

func addSess(m *Manager, id string, addr netip.Addr) *sess {
	s := newSess(Info{ID: id, Tenant: "acme", State: StateRunning})
	s.addr = addr
	s.trail = m.openTrail("acme", id)
	s.record("created", nil)
	m.sessions[id] = s
	m.byAddr[addr] = s
	return s
}

// A finalisation that hangs (the store is away) holds neither the stop
// that started it nor the stop of another session.
func TestSettleDoesNotWaitForFinalisation(t *testing.T) {
	m := testManager(t)
	m.byAddr = map[netip.Addr]*sess{}
	m.base, m.cancel = t.Context(), func() {}
	o := &blockingObserver{release: make(chan struct{}), ended: make(chan string, 8)}
	m.observer = o
	ids := []string{"s-0000000000000001", "s-0000000000000002", "s-0000000000000003"}
	var ss []*sess
	for i, id := range ids {
		ss = append(ss, addSess(m, id, netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 2)})))
	}
	for _, s := range ss {
		settled := make(chan struct{})
		go func() { m.settle(s, StateStopped, ""); close(settled) }()
		select {
		case <-settled:
		case <-time.After(10 * time.Second):
			t.Fatalf("settle of %s waited for the observer", s.info.ID)
		}
		if st := m.snapshot(s).State; st != StateStopped {
			t.Errorf("%s is %s", s.info.ID, st)
		}
		if _, ok := m.BySource(s.addr); ok {
			t.Errorf("%s still found by address after it ended", s.info.ID)
		}
	}
	select {
	case id := <-o.ended:
		t.Fatalf("%s finalised before the observer was released", id)
	default:
	}
	// Only Finalisers (2) run at once; the third waits for a slot.
	deadline := time.Now().Add(10 * time.Second)
	for len(m.finals) != cap(m.finals) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if len(m.finals) != 2 {
		t.Errorf("%d finalisations running, want 2", len(m.finals))
	}
	close(o.release)
	for range ids {
		select {
		case <-o.ended:
		case <-time.After(10 * time.Second):
			t.Fatal("a finalisation never ran")
		}
	}
	for _, s := range ss {
		<-s.final
		if _, err := os.Stat(s.trail.path); err != nil || s.trail.path[len(s.trail.path)-len(endedSuffix):] != endedSuffix {
			t.Errorf("ended trail %q: %v", s.trail.path, err)
		}
	}
	m.wg.Wait()
}

func TestBySourceIndex(t *testing.T) {
	m := testManager(t)
	m.byAddr = map[netip.Addr]*sess{}
	a := netip.MustParseAddr("10.231.0.5")
	s := addSess(m, "s-0000000000000001", a)
	if info, ok := m.BySource(a); !ok || info.ID != s.info.ID {
		t.Errorf("running session not found by its address")
	}
	if _, ok := m.BySource(netip.MustParseAddr("10.231.0.6")); ok {
		t.Errorf("found a session at an address nobody holds")
	}
	m.mu.Lock()
	s.info.State = StateStopping
	m.mu.Unlock()
	if _, ok := m.BySource(a); ok {
		t.Errorf("a stopping session is still the address's")
	}
}

// Ended, finalised sessions are forgotten after the retention and beyond
// the count cap, with their trail files; live ones never.
func TestForgetEnded(t *testing.T) {
	m := testManager(t)
	m.byAddr = map[netip.Addr]*sess{}
	m.cfg.Retention, m.cfg.MaxEnded = time.Hour, 3
	now := time.Now()
	live := addSess(m, "s-00000000000000ff", netip.MustParseAddr("10.231.0.2"))
	var ended []*sess
	for i := range 5 {
		s := addSess(m, "s-000000000000000"+string(rune('a'+i)), netip.MustParseAddr("10.231.1."+string(rune('1'+i))))
		s.info.State, s.finalised, s.endedAt = StateStopped, true, now.Add(time.Duration(i-10)*time.Minute)
		ended = append(ended, s)
	}
	unfinished := addSess(m, "s-00000000000000ee", netip.MustParseAddr("10.231.0.3"))
	unfinished.info.State, unfinished.endedAt = StateStopped, now.Add(-2*time.Hour)
	m.forget(now)
	for i, s := range ended {
		_, err := m.Get("acme", s.info.ID)
		if want := i >= 2; (err == nil) != want {
			t.Errorf("ended session %d: kept=%v, want %v", i, err == nil, want)
		}
		if _, serr := os.Stat(s.trail.path); (serr == nil) != (i >= 2) {
			t.Errorf("ended session %d: trail file present=%v", i, serr == nil)
		}
	}
	if _, err := m.Get("acme", live.info.ID); err != nil {
		t.Errorf("live session forgotten")
	}
	if _, err := m.Get("acme", unfinished.info.ID); err != nil {
		t.Errorf("a session still being finalised was forgotten")
	}
	m.forget(now.Add(2 * time.Hour))
	for _, s := range ended[2:] {
		if _, err := m.Get("acme", s.info.ID); err == nil {
			t.Errorf("%s kept past its retention", s.info.ID)
		}
	}
	// Record for a forgotten session makes no trail again.
	m.Record(ended[0].info.ID, "preview_closed", nil)
	if _, err := os.Stat(m.trailPath("acme", ended[0].info.ID)); err == nil {
		t.Errorf("Record made a trail for a forgotten session")
	}
}

type flakyFinaliser struct {
	fails int // attempts that fail before one succeeds
	calls chan []Event
}

func (o *flakyFinaliser) SessionRunning(Info, Endpoint) {}
func (o *flakyFinaliser) SessionEnded(Info, []Event) {
	panic("SessionEnded called on a SessionFinaliser")
}
func (o *flakyFinaliser) FinaliseSession(_ context.Context, _ Info, evs []Event) error {
	o.calls <- evs
	if len(o.calls) <= o.fails {
		return errors.New("store away")
	}
	return nil
}

// A finalisation that fails is retried with backoff; the session is not
// forgotten until it succeeds.
func TestFinaliseRetries(t *testing.T) {
	m := testManager(t)
	m.byAddr = map[netip.Addr]*sess{}
	m.base, m.cancel = t.Context(), func() {}
	o := &flakyFinaliser{fails: 2, calls: make(chan []Event, 8)}
	m.observer = o
	s := addSess(m, "s-0000000000000001", netip.MustParseAddr("10.231.0.2"))
	m.settle(s, StateStopped, "")
	select {
	case <-s.final:
	case <-time.After(30 * time.Second):
		t.Fatal("never finalised")
	}
	if n := len(o.calls); n != 3 {
		t.Errorf("%d attempts, want 3", n)
	}
	m.mu.Lock()
	finalised := s.finalised
	m.mu.Unlock()
	if !finalised {
		t.Error("not marked finalised after the attempt that succeeded")
	}
	evs := <-o.calls
	if count(evs, "stopped") != 1 {
		t.Errorf("the observer did not get the trail with its stop: %v", evs)
	}
	m.wg.Wait()

	// Positive control for the forget guard: while attempts fail, the
	// ended session is not forgotten.
	m2 := testManager(t)
	m2.byAddr = map[netip.Addr]*sess{}
	ctx, cancel := context.WithCancel(t.Context())
	m2.base, m2.cancel = ctx, cancel
	never := &flakyFinaliser{fails: 1000, calls: make(chan []Event, 1000)}
	m2.observer = never
	s2 := addSess(m2, "s-0000000000000002", netip.MustParseAddr("10.231.0.3"))
	m2.settle(s2, StateStopped, "")
	<-never.calls
	m2.forget(time.Now().Add(48 * time.Hour))
	if _, err := m2.Get("acme", s2.info.ID); err != nil {
		t.Error("a session whose finalisation keeps failing was forgotten")
	}
	cancel()
	<-s2.final
	m2.wg.Wait()
	if _, err := os.Stat(m2.trailPath("acme", s2.info.ID)); err != nil {
		t.Errorf("the unfinalised trail file is gone: %v", err)
	}
}
