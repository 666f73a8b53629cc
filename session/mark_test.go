package session

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// recordBox is a sandbox whose record is a map (SetRecord alone).
type recordBox struct {
	Sandbox
	mu     sync.Mutex
	record map[string]string
	writes int
	delay  time.Duration
}

func (b *recordBox) SetRecord(_ context.Context, change map[string]string) (map[string]string, error) {
	time.Sleep(b.delay)
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, v := range change {
		b.record[k] = v
	}
	b.writes++
	return b.record, nil
}

// TestMarkState: the state stored with a sandbox is running once marked
// so, and stopping once its stop began, whatever comes after (a running
// mark written late, apart from the create, does not undo a stop); a
// mark already stored is not written again. FromRecord reads it: a
// record with none is a starting session's.
func TestMarkState(t *testing.T) {
	m := &Manager{base: context.Background(), log: slog.New(slog.DiscardHandler)}
	now := time.Now().UTC()
	rec := map[string]string{labelSession: "s-1", labelTenant: "t", labelExpires: now.Add(time.Hour).Format(time.RFC3339Nano),
		labelCreated: now.Format(time.RFC3339Nano), labelAddr: "10.0.0.2", labelInfo: `{"kind":"browser"}`}
	box := &recordBox{record: rec, delay: 50 * time.Millisecond}
	s := newSess(Info{ID: "s-1", Tenant: "t"})
	state := func() State {
		box.mu.Lock()
		defer box.mu.Unlock()
		info, _, err := FromRecord(box.record)
		if err != nil {
			t.Fatal(err)
		}
		return info.State
	}
	if st := state(); st != StateStarting {
		t.Fatalf("no mark: %s, want starting", st)
	}
	m.markRunning(s, box) // apart: the stop below may come first
	m.markState(s, box, StateStopping)
	m.markRunning(s, box)
	m.wg.Wait()
	if st := state(); st != StateStopping {
		t.Fatalf("after a stop began: %s, want stopping", st)
	}
	// The control: a session that runs and is not stopped reads running;
	// marked twice, it is written once.
	box2 := &recordBox{record: map[string]string{labelSession: "s-2", labelTenant: "t", labelExpires: rec[labelExpires],
		labelCreated: rec[labelCreated], labelAddr: "10.0.0.3", labelInfo: `{"kind":"browser"}`}}
	s2 := newSess(Info{ID: "s-2", Tenant: "t"})
	m.markRunning(s2, box2)
	m.wg.Wait()
	m.markState(s2, box2, StateRunning)
	info, _, err := FromRecord(box2.record)
	if err != nil || info.State != StateRunning || box2.writes != 1 {
		t.Fatalf("a running session: %s %v, %d writes", info.State, err, box2.writes)
	}
}
