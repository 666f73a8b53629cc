package kube

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// TestKeepEgress: the leader's rounds label a replica's Pod serving
// once its proxy answers, pending once it has missed 3 probes in a row
// (not before), and serving again once it answers; they never touch a
// session's Pod, nor probe one, nor a Pod without the label; they take
// no Pod out in a round where two others or more that serve were probed
// and none answered (one out already does not count), nor the last Pod
// that serves; and a Pod whose label its replica took off is not
// labelled again. (The API server is client-go's fake clientset; the
// probe answers as the test says.)
func TestKeepEgress(t *testing.T) {
	ctx := context.Background()
	pod := func(name, ip string, lbl map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name), Labels: lbl},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip}}
	}
	pending := func() map[string]string { return map[string]string{LabelEgress: EgressPending} }
	client := fake.NewSimpleClientset(
		pod("gw-a", "10.0.0.1", pending()),
		pod("gw-b", "10.0.0.2", pending()),
		pod("gw-c", "10.0.0.3", pending()),
		pod("gw-d", "10.0.0.4", nil),
		pod("sess", "10.0.0.9", map[string]string{LabelEgress: EgressPending, LabelManaged: managedBy}),
	)
	b := &Backend{client: client, cfg: Config{Namespace: "ns"}}
	var mu sync.Mutex
	down := map[string]bool{}
	probed := map[string]int{}
	probe := func(_ context.Context, ap netip.AddrPort) error {
		mu.Lock()
		defer mu.Unlock()
		probed[ap.Addr().String()]++
		if ap.Port() != 3128 {
			t.Errorf("probed port %d, want 3128", ap.Port())
		}
		if down[ap.Addr().String()] {
			return errors.New("no answer")
		}
		return nil
	}
	setDown := func(ips ...string) {
		mu.Lock()
		defer mu.Unlock()
		clear(down)
		for _, ip := range ips {
			down[ip] = true
		}
	}
	k := &egressKeeper{b: b, own: "gw-a", port: 3128, probe: probe, log: slog.New(slog.DiscardHandler), missed: map[string]int{}}
	round := func() {
		t.Helper()
		if err := k.round(ctx); err != nil {
			t.Fatal(err)
		}
	}
	labels := func() map[string]string {
		t.Helper()
		out := map[string]string{}
		for _, n := range []string{"gw-a", "gw-b", "gw-c", "gw-d", "sess"} {
			p, err := client.CoreV1().Pods("ns").Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out[n] = p.Labels[LabelEgress]
		}
		return out
	}
	expect := func(when string, want map[string]string) {
		t.Helper()
		got := labels()
		for n, w := range want {
			if got[n] != w {
				t.Errorf("%s: %s labelled %q, want %q (all: %v)", when, n, got[n], w, got)
			}
		}
	}

	round()
	expect("all answer", map[string]string{"gw-a": EgressServing, "gw-b": EgressServing, "gw-c": EgressServing, "gw-d": "", "sess": EgressPending})
	if probed["10.0.0.9"] != 0 || probed["10.0.0.4"] != 0 {
		t.Errorf("probed a session's Pod (%d) or one without the label (%d)", probed["10.0.0.9"], probed["10.0.0.4"])
	}

	setDown("10.0.0.2")
	round()
	round()
	expect("b missed 2", map[string]string{"gw-b": EgressServing})
	round()
	expect("b missed 3", map[string]string{"gw-a": EgressServing, "gw-b": EgressPending, "gw-c": EgressServing})
	setDown()
	round()
	expect("b answers again", map[string]string{"gw-b": EgressServing})

	// Neither other answers: the fault may be the leader's.
	setDown("10.0.0.2", "10.0.0.3")
	for range 5 {
		round()
	}
	expect("no other answers", map[string]string{"gw-a": EgressServing, "gw-b": EgressServing, "gw-c": EgressServing})
	// One of them answers: the other goes.
	setDown("10.0.0.3")
	for range 3 {
		round()
	}
	expect("c alone silent", map[string]string{"gw-b": EgressServing, "gw-c": EgressPending})

	// b silent too: c, out already, says nothing of the leader's side,
	// and b goes.
	setDown("10.0.0.2", "10.0.0.3")
	for range 3 {
		round()
	}
	expect("b silent, c out already", map[string]string{"gw-a": EgressServing, "gw-b": EgressPending, "gw-c": EgressPending})

	// The last that serves stays: b and c gone, a silent too.
	if err := b.LeaveEgress(ctx, "gw-b"); err != nil {
		t.Fatal(err)
	}
	setDown("10.0.0.1", "10.0.0.3")
	for range 5 {
		round()
	}
	expect("the last that serves", map[string]string{"gw-a": EgressServing, "gw-b": "", "gw-c": EgressPending})
	// b left: not labelled again, though it answers.
	setDown()
	round()
	expect("after b left", map[string]string{"gw-a": EgressServing, "gw-b": "", "gw-c": EgressServing, "sess": EgressPending})
}
