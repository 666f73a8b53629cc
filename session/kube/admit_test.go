package kube

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestLockAdmission: one create at a time holds the admission lease,
// of one replica or another; another waits for it, and takes it once
// it is given back (removed), not before; a holder that keeps it past
// the lease's duration keeps it (it renews it), and one that died
// (stopped renewing) loses it once it has run out. (The API server is
// client-go's fake clientset.)
func TestLockAdmission(t *testing.T) {
	client := fake.NewSimpleClientset()
	casLeases(client)
	b := &Backend{client: client, cfg: Config{Namespace: "ns"}}
	ctx := context.Background()
	unlockA, _, err := b.LockAdmission(ctx, "replica-a", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, _, err = b.LockAdmission(short, "replica-b", slog.New(slog.DiscardHandler))
	cancel()
	if err == nil {
		t.Fatal("replica-b took the admission lease replica-a holds")
	}
	took, done := make(chan time.Time, 1), make(chan struct{})
	go func() {
		defer close(done)
		unlockB, _, err := b.LockAdmission(ctx, "replica-b", slog.New(slog.DiscardHandler))
		if err != nil {
			t.Error(err)
			took <- time.Time{}
			return
		}
		took <- time.Now()
		unlockB()
	}()
	time.Sleep(200 * time.Millisecond)
	gaveBack := time.Now()
	unlockA()
	select {
	case at := <-took:
		if at.Before(gaveBack) {
			t.Errorf("replica-b took the lease %v before replica-a gave it back", gaveBack.Sub(at))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("replica-b did not take the lease once replica-a gave it back")
	}
	<-done
	if _, err := client.CoordinationV1().Leases("ns").Get(ctx, admissionLease, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the admission lease once given back: %v, want it removed", err)
	}

	// Two creates of one replica.
	log := slog.New(slog.DiscardHandler)
	unlock1, _, err := b.LockAdmission(ctx, "replica-a", log)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	_, _, err = b.LockAdmission(short, "replica-a", log)
	cancel()
	if err == nil {
		t.Error("a second create of replica-a took the admission lease the first holds")
	}
	unlock1()

	// Held for 3 s under a lease of 1 s: renewed, so nobody takes it;
	// the control, a holder that stops renewing (a dead one's lease
	// left behind), loses it once it has run out.
	unlockLong, lostLong, err := b.lockAdmission(ctx, "replica-a", time.Second, time.Second, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.lockAdmission(ctx, "replica-b", time.Second, 3*time.Second, log); err == nil {
		t.Error("replica-b took the admission lease replica-a renews")
	}
	if lostLong() {
		t.Error("replica-a says it lost the lease it renewed")
	}
	unlockLong()
	// A holder whose lease another took over (it could not renew in
	// time) says so.
	unlockTaken, lostTaken, err := b.lockAdmission(ctx, "replica-a", time.Second, time.Second, log)
	if err != nil {
		t.Fatal(err)
	}
	le, err := client.CoordinationV1().Leases("ns").Get(ctx, admissionLease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	intruder := "replica-c/0"
	le.Spec.HolderIdentity = &intruder
	if _, err := client.CoordinationV1().Leases("ns").Update(ctx, le, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(3 * time.Second); !lostTaken() && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	if !lostTaken() {
		t.Error("replica-a does not say it lost the lease another took over")
	}
	unlockTaken()
	if le, err := client.CoordinationV1().Leases("ns").Get(ctx, admissionLease, metav1.GetOptions{}); err != nil || *le.Spec.HolderIdentity != intruder {
		t.Errorf("the lease another took over, once replica-a gave it back: %v, want it left to its holder", err)
	}
	client.CoordinationV1().Leases("ns").Delete(ctx, admissionLease, metav1.DeleteOptions{})
	// A holder whose renewals fail (the API server does not answer)
	// says it may have lost the lease once a hold's length has passed
	// without one, though nobody told it another took it.
	var failing atomic.Bool
	client.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if failing.Load() {
			return true, nil, errors.New("the API server does not answer")
		}
		return false, nil, nil
	})
	unlockMute, lostMute, err := b.lockAdmission(ctx, "replica-a", time.Second, time.Second, log)
	if err != nil {
		t.Fatal(err)
	}
	if lostMute() {
		t.Error("replica-a says it lost the lease it has just taken")
	}
	failing.Store(true)
	time.Sleep(1200 * time.Millisecond)
	if !lostMute() {
		t.Error("replica-a, its renewals failing for longer than the lease lasts, does not say it may have lost it")
	}
	failing.Store(false)
	unlockMute()
	dead := &Leases{Client: client, Namespace: "ns", Identity: "replica-dead/0", Duration: time.Second}
	if held, _, err := dead.Acquire(ctx, admissionLease, "admission"); err != nil || !held {
		t.Fatalf("a lease for a holder that dies: %v %v", held, err)
	}
	at := time.Now()
	unlockB, _, err := b.lockAdmission(ctx, "replica-b", time.Second, 5*time.Second, log)
	if err != nil {
		t.Fatalf("replica-b waiting for a dead holder's lease: %v", err)
	}
	if waited := time.Since(at); waited < time.Second {
		t.Errorf("replica-b took a lease its holder had just taken after %v, before it ran out", waited)
	}
	unlockB()
}

// casLeases makes client give every Lease it stores a new version, and
// refuse an update or a delete made at another version (409), as the
// API server does and client-go's fake does not.
func casLeases(client *fake.Clientset) {
	var version atomic.Int64
	gvr := schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	client.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		o := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease)
		o.ResourceVersion = strconv.FormatInt(version.Add(1), 10)
		return false, nil, nil
	})
	client.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		o := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		cur, err := client.Tracker().Get(gvr, o.Namespace, o.Name)
		if err != nil {
			return true, nil, err
		}
		if o.ResourceVersion != cur.(*coordinationv1.Lease).ResourceVersion {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), o.Name, errors.New("the object has been modified"))
		}
		o.ResourceVersion = strconv.FormatInt(version.Add(1), 10)
		return false, nil, nil
	})
	client.PrependReactor("delete", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		d := a.(k8stesting.DeleteAction)
		cur, err := client.Tracker().Get(gvr, d.GetNamespace(), d.GetName())
		if err != nil {
			return true, nil, err
		}
		if p := d.GetDeleteOptions().Preconditions; p != nil && p.ResourceVersion != nil && *p.ResourceVersion != cur.(*coordinationv1.Lease).ResourceVersion {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), d.GetName(), errors.New("the object has been modified"))
		}
		return false, nil, nil
	})
}
