package session

import (
	"context"
	"errors"
	"log/slog"
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
	delay  time.Duration
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
