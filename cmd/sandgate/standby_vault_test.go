package main

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/vault"
)

// TestStandbyVault: a replica's own vault is opened when first asked
// for, once; a failed try is the answer for 5 s (MinIO not asked
// again meanwhile), whether its askers waited for its end or gave up
// before it; while a try is under way, every asker waits for it,
// within its own deadline, and no second try begins.
func TestStandbyVault(t *testing.T) {
	want := &vault.Vault{}
	var tries atomic.Int32
	var result atomic.Pointer[func(context.Context) (*vault.Vault, error)]
	set := func(f func(context.Context) (*vault.Vault, error)) { result.Store(&f) }
	fresh := func() *standby[vault.Vault] {
		tries.Store(0)
		return newStandby("vault", func(ctx context.Context) (*vault.Vault, error) {
			tries.Add(1)
			return (*result.Load())(ctx)
		})
	}
	ctx := context.Background()
	// tryEnds waits, within 10 s, until s has no try under way.
	tryEnds := func(s *standby[vault.Vault]) {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			s.mu.Lock()
			ended := s.try == nil
			s.mu.Unlock()
			if ended {
				return
			}
		}
	}

	s := fresh()
	down := errors.New("MinIO does not answer")
	set(func(context.Context) (*vault.Vault, error) { return nil, down })
	for i := range 2 {
		if v, err := s.get(ctx); v != nil || !errors.Is(err, down) {
			t.Fatalf("ask %d while MinIO is down: %v %v", i, v, err)
		}
	}
	if n := tries.Load(); n != 1 {
		t.Fatalf("MinIO asked %d times within 5 s of a failed try, want once", n)
	}
	// 5 s on (the try made older), it is tried again: opened.
	s.mu.Lock()
	s.at = s.at.Add(-6 * time.Second)
	s.mu.Unlock()
	set(func(context.Context) (*vault.Vault, error) { return want, nil })
	if v, err := s.get(ctx); v != want || err != nil {
		t.Fatalf("asked 5 s after a failed try, MinIO up: %v %v", v, err)
	}
	if v, err := s.get(ctx); v != want || err != nil || tries.Load() != 2 {
		t.Fatalf("asked once open: %v %v, %d tries, want no new one", v, err, tries.Load())
	}

	// A try under way: an asker within 50 ms gives up; two that wait get
	// what the one try opens.
	s = fresh()
	release := make(chan struct{})
	entered := make(chan struct{})
	set(func(ctx context.Context) (*vault.Vault, error) {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("a try without a deadline")
		}
		close(entered)
		<-release
		return want, nil
	})
	got := make(chan *vault.Vault, 2)
	for range 2 {
		go func() {
			v, _ := s.get(ctx)
			got <- v
		}()
	}
	<-entered
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if v, err := s.get(short); v != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("asked within 50 ms while a try is under way: %v %v, want the deadline", v, err)
	}
	cancel()
	select {
	case v := <-got:
		t.Fatalf("an asker got %v before the try ended", v)
	default:
	}
	close(release)
	for range 2 {
		if v := <-got; v != want {
			t.Errorf("an asker waiting for the try got %v", v)
		}
	}
	if n := tries.Load(); n != 1 {
		t.Errorf("%d tries, want one", n)
	}

	// A try whose asker gave up still ends, and is recorded: its
	// failure is the answer for 5 s, its success the vault.
	s = fresh()
	release = make(chan struct{})
	set(func(context.Context) (*vault.Vault, error) { <-release; return nil, down })
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if v, err := s.get(gone); v != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("a try its asker gave up on: %v %v", v, err)
	}
	close(release)
	tryEnds(s)
	set(func(context.Context) (*vault.Vault, error) { return want, nil })
	if v, err := s.get(ctx); v != nil || !errors.Is(err, down) || tries.Load() != 1 {
		t.Errorf("asked right after a failed try its asker gave up on: %v %v, %d tries, want its failure and 1", v, err, tries.Load())
	}
	// A try whose asker gave up that succeeds: the vault, no new try.
	s = fresh()
	release = make(chan struct{})
	set(func(context.Context) (*vault.Vault, error) { <-release; return want, nil })
	gone, cancel = context.WithCancel(ctx)
	cancel()
	if v, err := s.get(gone); v != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("a try its asker gave up on: %v %v", v, err)
	}
	close(release)
	tryEnds(s)
	if v, err := s.get(ctx); v != want || err != nil || tries.Load() != 1 {
		t.Errorf("asked after a try its asker gave up on opened the vault: %v %v, %d tries, want it and 1", v, err, tries.Load())
	}
	// An opener that panics is an error, not the replica's end.
	s = fresh()
	set(func(context.Context) (*vault.Vault, error) { panic("a bug") })
	if v, err := s.get(ctx); v != nil || err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Errorf("an opener that panics: %v %v, want an error", v, err)
	}
	// (nil and no error from the opener is no vault.)
	s = fresh()
	set(func(context.Context) (*vault.Vault, error) { return nil, nil })
	if v, err := s.get(ctx); v != nil || err == nil {
		t.Errorf("an opener that opened none: %v %v, want an error", v, err)
	}
}

// TestStandbyNone: a replica with no vault.key has no standby to open
// (nil): its get says none, with no error, as RelayAlone's openers are
// to say it. The control: one that opens gives what it opened.
func TestStandbyNone(t *testing.T) {
	var none *standby[vault.Vault]
	if v, err := none.get(context.Background()); v != nil || err != nil {
		t.Errorf("no standby: %v %v, want none and no error", v, err)
	}
	want := &vault.Vault{}
	some := newStandby("vault", func(context.Context) (*vault.Vault, error) { return want, nil })
	if v, err := some.get(context.Background()); v != want || err != nil {
		t.Errorf("a standby that opens: %v %v, want what it opened", v, err)
	}
}
