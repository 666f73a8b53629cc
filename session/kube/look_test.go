package kube

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/session"
)

// TestProbe: a runtime is usable when the config names a RuntimeClass
// for it and the cluster has that class; one not named or not there is
// not, with the reason, and Probe says nothing failed. A lookup that
// fails otherwise (the API server not answering) is Probe's error, so
// that a replica answering alone says nothing rather than a runtime
// unusable for a moment; Runtimes still lists them all.
func TestProbe(t *testing.T) {
	client := fake.NewSimpleClientset(&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "sandgate-runc"}, Handler: "runc"})
	s := NewSessions(context.Background(), &Backend{client: client,
		cfg: Config{Namespace: "ns", RuntimeClasses: map[string]string{"runc": "sandgate-runc", "gvisor": "sandgate-gvisor"}}})
	found, err := s.Probe(context.Background())
	if err != nil {
		t.Fatalf("a class missing is no failure: %v", err)
	}
	if rt := found["runc"]; rt == nil || !rt.Usable || rt.Version != "RuntimeClass sandgate-runc" || rt.Isolation != "container" {
		t.Errorf("runc, its class there: %+v", rt)
	}
	for _, name := range []string{"gvisor", "kata"} {
		if rt := found[name]; rt == nil || rt.Usable || rt.Reason == "" {
			t.Errorf("%s, its class not there or not named: %+v", name, rt)
		}
	}
	client.PrependReactor("get", "runtimeclasses", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("the API server does not answer")
	})
	if _, err := s.Probe(context.Background()); err == nil || errors.Is(err, ErrRuntimeMissing) {
		t.Errorf("the lookups failing: %v, want the failure", err)
	}
	if all := s.Runtimes(context.Background()); len(all) != 3 || all["runc"].Usable {
		t.Errorf("Runtimes, the lookups failing: %+v, want three, none usable", all)
	}
}

// TestLookEvery: every tenant's session Pods, by their records, and
// neither a warm Pod not claimed nor one whose record cannot be read;
// LookAll keeps to one tenant's, LookPools to the warm Pods.
func TestLookEvery(t *testing.T) {
	pod := func(tenant string, pooled bool, info string) (*corev1.Pod, string) {
		id := ids.NewSession()
		if info == "" {
			rec := map[string]string{"sandgate.session": id, session.RecordTenant: tenant, session.RecordState: "running"}
			if pooled {
				rec["sandgate.pool"] = "browser/runc/1280x720"
			}
			raw, _ := json.Marshal(rec)
			info = string(raw)
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "ns",
			Labels: map[string]string{LabelManaged: managedBy, LabelTenant: tenant}, Annotations: map[string]string{AnnInfo: info}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}, id
	}
	var objs []runtime.Object
	want := map[string][]string{}
	for _, p := range []struct {
		tenant string
		pooled bool
		info   string
	}{{"t", false, ""}, {"t", false, ""}, {"u", false, ""}, {"", true, ""}, {"u", false, "{not json"}} {
		o, id := pod(p.tenant, p.pooled, p.info)
		objs = append(objs, o)
		switch {
		case p.pooled:
			want["pooled"] = append(want["pooled"], id)
		case p.tenant != "" && p.info == "":
			want[p.tenant] = append(want[p.tenant], id)
		}
	}
	s := NewSessions(context.Background(), &Backend{client: fake.NewSimpleClientset(objs...), cfg: Config{Namespace: "ns"}})
	ids := func(looked []Looked) []string {
		var out []string
		for _, l := range looked {
			out = append(out, l.Record["sandgate.session"])
		}
		slices.Sort(out)
		return out
	}
	every, err := s.LookEvery(context.Background())
	all := append(slices.Clone(want["t"]), want["u"]...)
	slices.Sort(all)
	if err != nil || !slices.Equal(ids(every), all) {
		t.Errorf("LookEvery: %v %v, want %v", ids(every), err, all)
	}
	pooled, err := s.LookPools(context.Background())
	if err != nil || !slices.Equal(ids(pooled), want["pooled"]) {
		t.Errorf("LookPools: %v %v, want %v", ids(pooled), err, want["pooled"])
	}
	ts, err := s.LookAll(context.Background(), "t")
	slices.Sort(want["t"])
	if err != nil || !slices.Equal(ids(ts), want["t"]) {
		t.Errorf("LookAll(t): %v %v, want %v", ids(ts), err, want["t"])
	}
}

// TestStandbyRuntimesAndPools: what a replica standing by says of the
// runtimes and pools. A configured default whose RuntimeClass is gone
// stays the default, listed as not usable (the control: one that is
// there is usable); the pools are checked against those runtimes (a
// pool of the gone default is refused) and counted from their Pods,
// running and starting, not a tenant's Pod; with no pool configured the
// cluster is not asked.
func TestStandbyRuntimesAndPools(t *testing.T) {
	pooled := func(state string, phase corev1.PodPhase) *corev1.Pod {
		id := ids.NewSession()
		raw, _ := json.Marshal(map[string]string{"sandgate.session": id, session.RecordState: state, session.RecordPool: "browser/runc/1280x800"})
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "ns",
			Labels: map[string]string{LabelManaged: managedBy}, Annotations: map[string]string{AnnInfo: string(raw)}},
			Status: corev1.PodStatus{Phase: phase}}
	}
	tenantPod, _ := json.Marshal(map[string]string{"sandgate.session": ids.NewSession(), session.RecordTenant: "t", session.RecordState: "running"})
	client := fake.NewSimpleClientset(&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "sandgate-runc"}, Handler: "runc"},
		pooled("running", corev1.PodRunning), pooled("starting", corev1.PodPending),
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandgate-s-t", Namespace: "ns", Labels: map[string]string{LabelManaged: managedBy, LabelTenant: "t"},
			Annotations: map[string]string{AnnInfo: string(tenantPod)}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}})
	s := NewSessions(context.Background(), &Backend{client: client,
		cfg: Config{Namespace: "ns", RuntimeClasses: map[string]string{"runc": "sandgate-runc", "gvisor": "sandgate-gvisor"}}})
	ctx := context.Background()
	runtimes, def, err := s.Offered(ctx, "gvisor")
	if err != nil || def != "gvisor" || runtimes["gvisor"].Usable || !runtimes["runc"].Usable {
		t.Fatalf("the configured default's class gone: %q %v %+v", def, err, runtimes["gvisor"])
	}
	if _, def, err := s.Offered(ctx, "runc"); err != nil || def != "runc" {
		t.Errorf("the configured default's class there: %q %v", def, err)
	}
	pools, err := s.Pools(ctx, []session.PoolConfig{{Runtime: "runc", Size: 2}}, "gvisor")
	if err != nil || len(pools) != 1 || pools[0].Key != "browser/runc/1280x800" || pools[0].Available != 1 || pools[0].Starting != 1 || pools[0].Size != 2 {
		t.Errorf("the pools: %+v %v", pools, err)
	}
	if _, err := s.Pools(ctx, []session.PoolConfig{{Size: 1}}, "gvisor"); err == nil {
		t.Error("a pool of the default runtime, its class gone: no error")
	}
	asked := len(client.Actions())
	if pools, err := s.Pools(ctx, nil, "gvisor"); err != nil || pools == nil || len(pools) != 0 || len(client.Actions()) != asked {
		t.Errorf("no pools: %#v %v, %d calls to the cluster", pools, err, len(client.Actions())-asked)
	}
}
