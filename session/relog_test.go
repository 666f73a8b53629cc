package session

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"
)

// restorer is an observer that stores trails again, in memory.
type restorer struct {
	endedObserver
	mu     sync.Mutex
	fail   error
	stored map[string][]Event
}

func (r *restorer) StoreTrail(_ context.Context, info Info, events []Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	r.stored[info.ID] = events
	return nil
}

func (r *restorer) got(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return types(r.stored[id])
}

// An event recorded in a finalised session's trail (a review link issued
// after the end) reaches the stored log: the trail is stored again,
// whole. While the store refuses, a marker beside the trail keeps it, the
// session is not forgotten, and a gateway that starts next stores it.
func TestLateEventsStored(t *testing.T) {
	const id, other = "s-0123456789abcdef", "s-fedcba9876543210"
	r := &restorer{endedObserver: endedObserver{trails: map[string][]Event{}}, stored: map[string][]Event{}}
	m := testManager(t)
	var stop context.CancelFunc
	m.base, stop = context.WithCancel(context.Background())
	defer stop()
	m.observer = r
	finalised := func(id string) *sess {
		s := newSess(Info{ID: id, Tenant: "acme", State: StateStopped})
		s.trail = m.openTrail("acme", id)
		s.record("created", nil)
		s.record("stopped", nil)
		os.Rename(s.trail.path, s.trail.path+endedSuffix)
		s.trail.path += endedSuffix
		s.finalised, s.endedAt = true, time.Now().Add(-2*time.Hour) // past the retention
		m.sessions[id] = s
		return s
	}
	wait := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s within 10 s", what)
			}
		}
	}
	marker := m.trailPath("acme", id) + relogSuffix

	// The control: an event in a session not finalised yet is the
	// finaliser's to store.
	live := newSess(Info{ID: other, Tenant: "acme"})
	live.trail = m.openTrail("acme", other)
	m.sessions[other] = live
	m.Record(other, "exec", nil)

	s := finalised(id)
	m.Record(id, "preview_issued", nil)
	want := []string{"created", "stopped", "preview_issued"}
	wait("the late event stored", func() bool { return eq(r.got(id), want) })
	wait("the marker removed", func() bool { _, err := os.Stat(marker); return os.IsNotExist(err) })
	if r.got(other) != nil {
		t.Error("a live session's trail was stored as a finalised one's")
	}

	r.mu.Lock()
	r.fail = errors.New("away")
	r.mu.Unlock()
	m.Record(id, "preview_revoked", nil)
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("no marker while the store lacks an event: %v", err)
	}
	m.forget(time.Now())
	m.mu.Lock()
	_, kept := m.sessions[id]
	m.mu.Unlock()
	if !kept {
		t.Fatal("a session whose late event is not stored was forgotten")
	}

	// The gateway stops before the store is back; the next one stores it.
	stop()
	wait("the retries ended with the gateway", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return !s.relogging
	})
	gone := finalised("s-00000000000000aa") // the control: an ended trail with no marker
	next := testManager(t)
	next.cfg.StateDir, next.base = m.cfg.StateDir, context.Background()
	next.dropEndedTrails()
	if _, err := os.Stat(gone.trail.path); !os.IsNotExist(err) {
		t.Errorf("an ended trail with nothing left to store was kept: %v", err)
	}
	if _, err := os.Stat(s.trail.path); err != nil {
		t.Fatalf("the trail with a late event not stored was dropped: %v", err)
	}
	r2 := &restorer{endedObserver: endedObserver{trails: map[string][]Event{}}, stored: map[string][]Event{}}
	next.Observe(r2)
	if got, want := r2.got(id), append(want, "preview_revoked"); !eq(got, want) {
		t.Fatalf("stored at the next start: %v, want %v", got, want)
	}
	for _, f := range []string{marker, s.trail.path} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s kept after the trail was stored: %v", f, err)
		}
	}
}

// finaliser stores the trail it is handed at the end, as the gateway
// does; during tells it to record an event meanwhile (a preview
// connection cut as the session stopped).
type finaliser struct {
	restorer
	m      *Manager
	during string
	calls  int
}

func (f *finaliser) FinaliseSession(ctx context.Context, info Info, events []Event) error {
	if f.during != "" {
		f.m.Record(info.ID, f.during, nil)
	}
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	return f.StoreTrail(ctx, info, events)
}

// An event recorded while the session was being finalised, after its
// trail was read for the log, is stored with it once the session is
// finalised. The control: an end with no such event stores the log once.
func TestEventsDuringFinalisationStored(t *testing.T) {
	for _, during := range []string{"preview_closed", ""} {
		m := testManager(t)
		m.base = context.Background()
		f := &finaliser{restorer: restorer{endedObserver: endedObserver{trails: map[string][]Event{}}, stored: map[string][]Event{}}, m: m, during: during}
		m.observer = f
		const id = "s-0123456789abcdef"
		s := newSess(Info{ID: id, Tenant: "acme", State: StateStopped})
		s.trail = m.openTrail("acme", id)
		s.record("created", nil)
		m.sessions[id] = s
		m.ended(s)
		want := []string{"created"}
		if during != "" {
			want = append(want, during)
		}
		for deadline := time.Now().Add(10 * time.Second); !eq(f.got(id), want); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%q: stored %v, want %v", during, f.got(id), want)
			}
		}
		m.mu.Lock()
		relogging := s.relogging
		m.mu.Unlock()
		if during == "" && relogging {
			t.Error("a trail with nothing new since it was read is stored again")
		}
	}
}
