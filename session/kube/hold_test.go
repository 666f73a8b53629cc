package kube

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestHoldHandover: a leader that renews keeps the hold, and a replica
// standing by does not take it; once the leader's renewals fail, it
// gives up (lost) before the other takes over, never after; the new
// leader's address is on the lease, and it gives the hold back when it
// stops. (The API server is client-go's fake clientset: what is under
// test is the timing of the two replicas, not the server.)
func TestHoldHandover(t *testing.T) {
	holdDuration = 2 * time.Second
	client := fake.NewSimpleClientset()
	var failA atomic.Bool
	var version atomic.Int64
	client.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		le := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if failA.Load() && deref(le.Spec.HolderIdentity) == "a" {
			return true, nil, errors.New("the API server does not answer")
		}
		// As the API server does: every write a new resourceVersion.
		le.ResourceVersion = strconv.FormatInt(version.Add(1), 10)
		return false, nil, nil
	})
	b := &Backend{client: client, cfg: Config{Namespace: "ns"}}
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()

	var mu sync.Mutex
	var lostAt, tookAt time.Time
	keepA, stopA := context.WithCancel(ctx)
	releasedA, err := b.Hold(ctx, keepA, "a", "10.0.0.1:8080", time.Second, log, func() {
		mu.Lock()
		lostAt = time.Now()
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		stopA()
		<-releasedA
		holdDuration = HoldDuration
	}()
	if id, addr, err := b.Leader(ctx); id != "a" || addr != "10.0.0.1:8080" || err != nil {
		t.Fatalf("the leader: %q at %q, %v", id, addr, err)
	}
	// A second replica without an address is refused once it has waited.
	if _, err := b.Hold(ctx, ctx, "c", "", 200*time.Millisecond, log, func() {}); err == nil {
		t.Fatal("a second replica without an address was not refused")
	}
	keepB, stopB := context.WithCancel(ctx)
	var released <-chan struct{}
	took := make(chan error, 1)
	go func() {
		var err error
		released, err = b.Hold(ctx, keepB, "b", "10.0.0.2:8080", 0, log, func() { t.Error("b lost the hold") })
		mu.Lock()
		tookAt = time.Now()
		mu.Unlock()
		took <- err
	}()

	// The control: while a renews, it keeps the hold, and b waits.
	select {
	case err := <-took:
		t.Fatalf("b took the hold while a renewed it: %v", err)
	case <-time.After(3 * holdDuration):
	}
	mu.Lock()
	if !lostAt.IsZero() {
		t.Fatal("a gave the hold up while it could renew it")
	}
	mu.Unlock()

	failed := time.Now()
	failA.Store(true)
	select {
	case err := <-took:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * holdDuration):
		t.Fatal("b never took the hold over")
	}
	mu.Lock()
	defer mu.Unlock()
	if lostAt.IsZero() || !lostAt.Before(tookAt) {
		t.Fatalf("a gave up at %v, b took over at %v: both led for a while", lostAt.Sub(failed), tookAt.Sub(failed))
	}
	if d := lostAt.Sub(failed); d > renewDeadline()+200*time.Millisecond {
		t.Errorf("a gave up %v after its renewals began to fail, beyond the deadline %v", d, renewDeadline())
	}
	t.Logf("renewals failing: a gave up after %v, b took over after %v (a margin of %v)",
		lostAt.Sub(failed).Round(time.Millisecond), tookAt.Sub(failed).Round(time.Millisecond), tookAt.Sub(lostAt).Round(time.Millisecond))
	if id, addr, _ := b.Leader(ctx); id != "b" || addr != "10.0.0.2:8080" {
		t.Errorf("the leader after the takeover: %q at %q", id, addr)
	}
	stopB()
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Fatal("b did not give the hold back")
	}
	if id, _, err := b.Leader(ctx); id != "" || err != nil {
		t.Errorf("after b stopped, the hold is held by %q (%v)", id, err)
	}

	// A holder that stopped renewing is no leader to forward to: its
	// address may be someone else's by now. The control: renewed now.
	secs := int32(2)
	for _, c := range []struct {
		renewed time.Time
		want    string
	}{{time.Now().Add(-3 * time.Second), ""}, {time.Now(), "d"}} {
		client.CoordinationV1().Leases("ns").Delete(ctx, HoldLease, metav1.DeleteOptions{})
		rt := metav1.NewMicroTime(c.renewed)
		holder := "d"
		client.CoordinationV1().Leases("ns").Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: HoldLease, Annotations: map[string]string{AnnotationAddress: "10.0.0.4:8080"}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &rt},
		}, metav1.CreateOptions{})
		if id, _, err := b.Leader(ctx); id != c.want || err != nil {
			t.Errorf("a hold renewed %v ago: leader %q (%v), want %q", time.Since(c.renewed).Round(time.Second), id, err, c.want)
		}
	}
}

// TestPredecessor: only an earlier run in the same Pod (name and UID)
// is taken for a dead predecessor, never this run, a Pod made again
// under the same name, another Pod (whose name the Pod's begins), a
// replica in no Pod, nor a name of another form.
func TestPredecessor(t *testing.T) {
	const uid = "6f1c1a2e-0b7d-4c52-9a51-0d1e2f3a4b5c"
	me := Identity("gw-a", uid, 7, "0123abcd")
	for holder, want := range map[string]bool{
		Identity("gw-a", uid, 1, "ffee0011"): true,  // the container's last run
		Identity("gw-a", uid, 7, "99887766"): true,  // the same pid, another run
		me:                                   false, // this run
		Identity("gw-a", "0f1c1a2e-0b7d-4c52-9a51-0d1e2f3a4b5c", 1, "ffee0011"): false, // the name again, another Pod
		Identity("gw-a-x", uid, 1, "ffee0011"):                                  false,
		Identity("gw-b", uid, 1, "ffee0011"):                                    false,
		Identity("gw-a", "", 1, "ffee0011"):                                     false, // in no Pod, on a host so named
		Identity("gw-a", uid, 1, "FFEE0011"):                                    false,
		Identity("gw-a", uid, 1, "ffee00111"):                                   false,
		"gw-a-" + strings.ReplaceAll(uid, "-", "") + "--ffee0011":               false,
		"gw-a-" + strings.ReplaceAll(uid, "-", "") + "-1x-ffee0011":             false,
		"": false,
	} {
		if got := Predecessor("gw-a", uid, holder, me); got != want {
			t.Errorf("Predecessor(gw-a, %q) = %v, want %v", holder, got, want)
		}
	}
	if Predecessor("gw-a", "", Identity("gw-a", "", 1, "ffee0011"), Identity("gw-a", "", 2, "0123abcd")) {
		t.Error("a replica in no Pod took another for its dead predecessor")
	}
}
