package kube

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestLockAdmission: one replica at a time holds the admission lease;
// another waits for it, and takes it once it is given back (removed),
// not before. (The API server is client-go's fake clientset.)
func TestLockAdmission(t *testing.T) {
	client := fake.NewSimpleClientset()
	b := &Backend{client: client, cfg: Config{Namespace: "ns"}}
	ctx := context.Background()
	unlockA, err := b.LockAdmission(ctx, "replica-a")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = b.LockAdmission(short, "replica-b")
	cancel()
	if err == nil {
		t.Fatal("replica-b took the admission lease replica-a holds")
	}
	took := make(chan time.Time, 1)
	go func() {
		unlockB, err := b.LockAdmission(ctx, "replica-b")
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
	if _, err := client.CoordinationV1().Leases("ns").Get(ctx, admissionLease, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the admission lease once given back: %v, want it removed", err)
	}
}
