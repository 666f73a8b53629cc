package kube

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestShareLeave: a piece placed again says it was placed before (the
// first placement, not). A replica that placed a piece stops following
// it on Leave, its lease left as it is; a Leave with the readiness of
// an earlier placement (the piece was placed here again since, on
// taking the lead) leaves the later one followed. (The API server is
// client-go's fake clientset.)
func TestShareLeave(t *testing.T) {
	b := &Backend{client: fake.NewSimpleClientset(), cfg: Config{Namespace: "ns"}}
	sh := b.NewShared("replica-b", "recording", nil, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	followed := func() bool {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return sh.placed[sh.name("sess")] != nil
	}
	first, before, err := sh.Place(ctx, "sess", map[string]string{"tenant": "t"}, nil)
	if err != nil || !followed() || before {
		t.Fatalf("placed: %v, followed %v, placed before %v", err, followed(), before)
	}
	again, before, err := sh.Place(ctx, "sess", map[string]string{"tenant": "t"}, nil)
	if err != nil || !before {
		t.Fatalf("placed again: %v, placed before %v", err, before)
	}
	sh.Leave("sess", first)
	if !followed() {
		t.Error("a Leave of the first placement dropped the one placed since")
	}
	sh.Leave("sess", again)
	if followed() {
		t.Error("a Leave of the placement followed: still followed")
	}
	if _, err := b.client.CoordinationV1().Leases("ns").Get(ctx, sh.name("sess"), metav1.GetOptions{}); err != nil {
		t.Errorf("the piece's lease after a Leave: %v, want it left", err)
	}
}

// TestSharePlaceLostAnswer: a Place whose create made the lease but
// lost its answer says the piece was not placed before (the lease bears
// its mark); another Place then says it was. (The API server is
// client-go's fake clientset, its create answering an error after
// storing the lease.)
func TestSharePlaceLostAnswer(t *testing.T) {
	client := fake.NewSimpleClientset()
	client.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj := a.(k8stesting.CreateAction).GetObject()
		if err := client.Tracker().Create(coordinationv1.SchemeGroupVersion.WithResource("leases"), obj, a.GetNamespace()); err != nil {
			return true, nil, err
		}
		return true, nil, errors.New("the connection broke before the answer")
	})
	b := &Backend{client: client, cfg: Config{Namespace: "ns"}}
	sh := b.NewShared("replica-a", "recording", nil, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	if _, before, err := sh.Place(ctx, "sess", map[string]string{"tenant": "t"}, nil); err != nil || before {
		t.Errorf("a Place whose answer was lost: placed before %v, %v; want this call's", before, err)
	}
	other := b.NewShared("replica-b", "recording", nil, slog.New(slog.DiscardHandler))
	if _, before, err := other.Place(ctx, "sess", map[string]string{"tenant": "t"}, nil); err != nil || !before {
		t.Errorf("a Place after it: placed before %v, %v; want placed before", before, err)
	}
}
