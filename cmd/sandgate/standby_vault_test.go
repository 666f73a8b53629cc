package main

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/vault"
)

// TestStandbyVault: a replica's own vault is opened when first asked
// for, once; a failed try is the answer for 5 s (MinIO not asked
// again meanwhile), unless its asker gave up on it; while a try is
// under way, an asker that does not wait gets nothing at once, one
// that waits gets the vault the try opens, or its own deadline.
func TestStandbyVault(t *testing.T) {
	want := &vault.Vault{}
	var tries atomic.Int32
	var result atomic.Pointer[func(context.Context) (*vault.Vault, error)]
	set := func(f func(context.Context) (*vault.Vault, error)) { result.Store(&f) }
	s := newStandbyVault(func(ctx context.Context) (*vault.Vault, error) {
		tries.Add(1)
		return (*result.Load())(ctx)
	})
	ctx := context.Background()

	down := errors.New("MinIO does not answer")
	set(func(context.Context) (*vault.Vault, error) { return nil, down })
	for i := range 2 {
		if v, err := s.get(ctx, true); v != nil || !errors.Is(err, down) {
			t.Fatalf("ask %d while MinIO is down: %v %v", i, v, err)
		}
	}
	if n := tries.Load(); n != 1 {
		t.Fatalf("MinIO asked %d times within 5 s of a failed try, want once", n)
	}
	// 5 s on (the try made older), it is tried again: opened.
	s.at = s.at.Add(-6 * time.Second)
	set(func(context.Context) (*vault.Vault, error) { return want, nil })
	if v, err := s.get(ctx, true); v != want || err != nil {
		t.Fatalf("asked 5 s after a failed try, MinIO up: %v %v", v, err)
	}
	if v, err := s.get(ctx, false); v != want || err != nil || tries.Load() != 2 {
		t.Fatalf("asked once open: %v %v, %d tries, want no new one", v, err, tries.Load())
	}

	// A try under way.
	s = newStandbyVault(func(ctx context.Context) (*vault.Vault, error) {
		tries.Add(1)
		return (*result.Load())(ctx)
	})
	tries.Store(0)
	release := make(chan struct{})
	entered := make(chan struct{})
	set(func(ctx context.Context) (*vault.Vault, error) {
		close(entered)
		select {
		case <-release:
			return want, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	first := make(chan *vault.Vault, 1)
	go func() {
		v, _ := s.get(ctx, true)
		first <- v
	}()
	<-entered
	if v, err := s.get(ctx, false); v != nil || err != nil {
		t.Errorf("asked without waiting while a try is under way: %v %v, want nothing at once", v, err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if v, err := s.get(short, true); v != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("asked within 50 ms while a try is under way: %v %v, want the deadline", v, err)
	}
	cancel()
	waited := make(chan *vault.Vault, 1)
	go func() {
		v, _ := s.get(ctx, true)
		waited <- v
	}()
	close(release)
	if v := <-first; v != want {
		t.Errorf("the try's asker got %v", v)
	}
	if v := <-waited; v != want {
		t.Errorf("an asker waiting for the try got %v", v)
	}
	if n := tries.Load(); n != 1 {
		t.Errorf("%d tries, want one", n)
	}

	// A try whose asker gave up says nothing of MinIO: the next asker
	// tries again at once.
	s = newStandbyVault(func(ctx context.Context) (*vault.Vault, error) {
		tries.Add(1)
		return (*result.Load())(ctx)
	})
	tries.Store(0)
	set(func(ctx context.Context) (*vault.Vault, error) { <-ctx.Done(); return nil, ctx.Err() })
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if v, err := s.get(gone, true); v != nil || err == nil {
		t.Fatalf("a try its asker gave up on: %v %v", v, err)
	}
	set(func(context.Context) (*vault.Vault, error) { return want, nil })
	if v, err := s.get(ctx, true); v != want || err != nil || tries.Load() != 2 {
		t.Errorf("asked right after a try its asker gave up on: %v %v, %d tries, want 2", v, err, tries.Load())
	}
}
