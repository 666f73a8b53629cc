package kube

import (
	"context"
	"log/slog"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
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
