package test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/session/kube"
)

// TestKubeShared: work on sessions (their recordings) spread over two
// replicas through Leases on the real cluster. A placed piece is taken
// by one replica, which says it has begun and sends a note; a second
// piece goes to the other replica; a piece whose holder stopped renewing
// (it died) is taken over, and the new holder knows it; a replica that
// stops gives its pieces back and the other takes them at once; a piece
// asked to stop returns its holder's result; one nobody took is
// collected with no result; nothing is left.
func TestKubeShared(t *testing.T) {
	needE2E(t)
	b := kubeNamespace(t, needKube(t))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	type took struct {
		who string
		w   kube.Work
	}
	var mu sync.Mutex
	holds := map[string]string{} // session: the replica that runs it
	taken := make(chan took, 16)
	refusals := 0
	replica := func(who string) *kube.Shared {
		return b.NewShared(who, "test", func(ctx context.Context, w kube.Work) string {
			if w.Params["p"] == "refuse" { // ends on its own at once
				mu.Lock()
				refusals++
				mu.Unlock()
				return "refused by " + who
			}
			mu.Lock()
			holds[w.Session] = who
			mu.Unlock()
			taken <- took{who, w}
			w.Ready()
			w.Note("began", map[string]any{"on": w.Params["p"]})
			<-ctx.Done()
			mu.Lock()
			delete(holds, w.Session)
			mu.Unlock()
			return "done by " + who
		}, slog.New(slog.DiscardHandler))
	}
	x, y := replica("gateway-x"), replica("gateway-y")
	type noted struct {
		typ      string
		at       time.Time
		replayed bool
		f        map[string]any
	}
	notes := map[string][]noted{}
	placed := map[string]bool{}
	place := func(s *kube.Shared, sid, p string) <-chan struct{} {
		t.Helper()
		ready, before, err := s.Place(ctx, sid, map[string]string{"p": p}, func(typ string, at time.Time, replayed bool, f map[string]any) {
			mu.Lock()
			notes[sid] = append(notes[sid], noted{typ, at, replayed, f})
			mu.Unlock()
		})
		if err != nil {
			t.Fatalf("place %s: %v", sid, err)
		}
		if before != placed[sid] {
			t.Errorf("place %s: placed before %v, want %v", sid, before, placed[sid])
		}
		placed[sid] = true
		return ready
	}
	wait := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(time.Minute):
			t.Fatalf("%s: not within a minute", what)
		}
	}
	next := func(what string) took {
		t.Helper()
		select {
		case tk := <-taken:
			return tk
		case <-time.After(time.Minute):
			t.Fatalf("%s: nobody took it within a minute", what)
		}
		return took{}
	}

	// Before any replica serves: a piece held by a replica that then
	// died (it never renews; its lease lasts 2 s).
	orphan := ids.NewSession()
	orphanReady := place(x, orphan, "orphan")
	dead := &kube.Leases{Client: b.Client(), Namespace: b.Namespace(), Identity: "gateway-dead", Duration: 2 * time.Second}
	if held, _, err := dead.Acquire(ctx, "sandgate-test-"+orphan, orphan); err != nil || !held {
		t.Fatalf("the replica that dies takes the piece: %v %v", held, err)
	}
	xctx, stopX := context.WithCancel(ctx)
	yctx, stopY := context.WithCancel(ctx)
	var served sync.WaitGroup
	for _, r := range []struct {
		s   *kube.Shared
		ctx context.Context
	}{{x, xctx}, {y, yctx}} {
		served.Add(1)
		go func() { defer served.Done(); r.s.Serve(r.ctx) }()
	}
	defer func() { stopX(); stopY(); served.Wait() }()
	died := time.Now()
	tk := next("the dead replica's piece")
	if tk.w.Session != orphan || !tk.w.TakenOver || tk.w.Params["p"] != "orphan" {
		t.Fatalf("the dead replica's piece: %+v", tk)
	}
	t.Logf("%s took over the dead replica's piece %.1f s after it was taken (its lease lasts 2 s)", tk.who, time.Since(died).Seconds())
	wait("the taken-over piece begins", orphanReady)

	// A new piece is taken, begins and sends its note.
	first := ids.NewSession()
	wait("the first piece begins", place(x, first, "one"))
	tk1 := next("the first piece")
	if tk1.w.Session != first || tk1.w.TakenOver || tk1.w.Params["p"] != "one" {
		t.Fatalf("the first piece: %+v", tk1)
	}
	waitFor(t, time.Minute, "the first piece's note", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(notes[first]) == 1 && notes[first][0].typ == "began" && notes[first][0].f["on"] == "one" && !notes[first][0].replayed
	})
	// Placed again, as a replica taking the lead does: ready at once, the
	// note handed over again, marked replayed; the piece not disturbed.
	wait("the first piece placed again", place(y, first, "one"))
	waitFor(t, time.Minute, "the first piece's note, replayed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(notes[first]) == 2 && notes[first][1].typ == "began" && notes[first][1].replayed
	})
	// Each replica holds one; both hold: the work is spread.
	waitFor(t, time.Minute, "one piece on each replica", func() bool { return x.Held() == 1 && y.Held() == 1 })

	// A third piece: either may take it; then the replica that holds two
	// stops, as a rolling update stops it: it gives them back, and the
	// other takes them at once, not taken over (nothing was lost).
	third := ids.NewSession()
	wait("the third piece begins", place(x, third, "three"))
	next("the third piece")
	busy, other, stopBusy := x, y, stopX
	if y.Held() == 2 {
		busy, other, stopBusy = y, x, stopY
	}
	if busy.Held() != 2 || other.Held() != 1 {
		t.Fatalf("x holds %d, y holds %d", x.Held(), y.Held())
	}
	stopped := time.Now()
	stopBusy()
	for range 2 {
		tk := next("a piece given back")
		if tk.w.TakenOver {
			t.Errorf("a piece given back was taken over, as from a dead replica: %+v", tk)
		}
	}
	gave := time.Since(stopped)
	t.Logf("the pieces given back were taken %.1f s after their replica stopped (a lease lasts %s)", gave.Seconds(), kube.ShareDuration)
	if gave >= kube.ShareDuration {
		t.Errorf("the pieces given back were taken only after their leases could have run out (%s)", gave)
	}
	if other.Held() != 3 {
		t.Errorf("the replica left holds %d pieces, want 3", other.Held())
	}

	// Stop (as a session stops) ends the piece at once, its result on
	// the lease; Collect then finds it and removes the lease.
	mu.Lock()
	whoThird := holds[third]
	mu.Unlock()
	if err := x.Stop(ctx, third); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the third piece to stop", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return holds[third] == ""
	})
	if result, err := x.Collect(ctx, third); err != nil || result != "done by "+whoThird {
		t.Errorf("collect the stopped piece: %q, %v; want the result of %q", result, err, whoThird)
	}
	// Each piece asked to stop returns its holder's result, and its lease
	// goes.
	for _, sid := range []string{orphan, first} {
		mu.Lock()
		who := holds[sid]
		mu.Unlock()
		result, err := x.Collect(ctx, sid)
		if err != nil || result != "done by "+who || who == "" {
			t.Errorf("collect %s: %q, %v; want the result of %q", sid, result, err, who)
		}
	}
	// A piece whose work ends on its own (it refused it): its result is
	// final, and no replica takes it again.
	refused := ids.NewSession()
	place(x, refused, "refuse")
	waitFor(t, time.Minute, "the refused piece's result", func() bool {
		le, err := b.Client().CoordinationV1().Leases(b.Namespace()).Get(ctx, "sandgate-test-"+refused, metav1.GetOptions{})
		return err == nil && le.Spec.HolderIdentity == nil && strings.HasPrefix(le.Annotations["sandgate.io/work-result"], "refused by ")
	})
	time.Sleep(2 * time.Second) // rounds every 0.5 s: time for a second take
	mu.Lock()
	n := refusals
	mu.Unlock()
	if n != 1 {
		t.Errorf("a refused piece was taken %d times", n)
	}
	if result, err := x.Collect(ctx, refused); err != nil || !strings.HasPrefix(result, "refused by ") {
		t.Errorf("collect the refused piece: %q, %v", result, err)
	}

	// A piece nobody takes (no replica serves now): collected with no
	// result; one never placed, the same.
	stopX()
	stopY()
	served.Wait()
	lone := ids.NewSession()
	place(x, lone, "lone")
	if result, err := x.Collect(ctx, lone); err != nil || result != "" {
		t.Errorf("collect a piece nobody took: %q, %v", result, err)
	}
	if result, err := x.Collect(ctx, ids.NewSession()); err != nil || result != "" {
		t.Errorf("collect a piece never placed: %q, %v", result, err)
	}
	l, err := b.Client().CoordinationV1().Leases(b.Namespace()).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, le := range l.Items {
		if strings.HasPrefix(le.Name, "sandgate-test-") {
			t.Errorf("lease left: %s", le.Name)
		}
	}
}
