package test

import (
	"testing"
	"time"
)

// TestIdleBrowserSettles: an idle browser session nobody watches
// settles to next to no CPU (a few thousandths of a core here) within a
// minute of its start. A Chromium whose helper process crashes and is
// started again and again burns most of a core and never settles. The
// control is the same session running a busy loop, which the same
// measure must see over the bound.
func TestIdleBrowserSettles(t *testing.T) {
	e := needE2E(t)
	if !e.runtimeUsable(t, "runc") {
		t.Skip("runc is not usable here")
	}
	s := e.createSession(t, e.keyA, map[string]any{"runtime": "runc"})
	// Generous against the 0.01 goal: a slow machine's idle Chromium is
	// not a crash loop's 0.5 and more.
	const bound = 0.1
	const window = 5 * time.Second
	use := func() float64 {
		t.Helper()
		before, ok := sessionCPU(s.ID)
		if !ok {
			t.Fatalf("no CPU accounting for session %s", s.ID)
		}
		time.Sleep(window) // the measure's window, not a wait for anything
		after, _ := sessionCPU(s.ID)
		return float64(after-before) / float64(window)
	}
	var cores []float64
	settled := false
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); {
		c := use()
		cores = append(cores, c)
		if c < bound {
			settled = true
			break
		}
	}
	if !settled {
		t.Fatalf("the idle session never went under %.2f cores in a %v window: %.3f", bound, window, cores)
	}
	t.Logf("idle: %.4f cores (windows before it: %.3f)", cores[len(cores)-1], cores[:len(cores)-1])

	done := make(chan struct{})
	go func() {
		defer close(done)
		e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"timeout", "8", "sh", "-c", "while :; do :; done"}, "timeout_seconds": 30})
	}()
	busy := use()
	<-done
	if busy < bound {
		t.Fatalf("the control: a busy loop measured %.3f cores, under the bound %.2f; the check cannot fail", busy, bound)
	}
}
