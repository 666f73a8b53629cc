package test

import (
	"context"
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/session/kube"
)

// podState is the state session id's Pod's record holds
// (session.FromRecord).
func podState(t testing.TB, b *kube.Backend, id string) session.State {
	t.Helper()
	p, err := b.Client().CoreV1().Pods(b.Namespace()).Get(context.Background(), "sandgate-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := map[string]string{}
	if err := json.Unmarshal([]byte(p.Annotations[kube.AnnInfo]), &r); err != nil {
		t.Fatal(err)
	}
	r[session.RecordAddr] = p.Status.PodIP
	info, _, err := session.FromRecord(r)
	if err != nil {
		t.Fatal(err)
	}
	return info.State
}

// kubePods lists the namespace's session Pods by session id, with their
// tenant label.
func kubePods(t testing.TB, b *kube.Backend) map[string]string {
	t.Helper()
	pods, err := b.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods {
		out[p.ID] = p.Tenant
	}
	return out
}

// TestKubeWarmPool: a warm pool under the Kubernetes backend is Pods
// that belong to nobody (no tenant label) until a create takes one: it
// answers warm, well before a cold start, and the Pod's record and
// labels are the tenant's then. The claimant's cookie and local storage
// are absent for the next claimant (a fresh Pod from the refill; the
// first claimant sees both, the control). A gateway killed with a
// claimed session and a full pool adopts the one and replaces the other;
// nothing is left once the session is deleted and the gateway stops.
func TestKubeWarmPool(t *testing.T) {
	e := needE2E(t)
	kubeconfig := needKube(t)
	b := kubeNamespace(t, kubeconfig)
	gwKubeconfig := kubeGatewayIdentity(t, b, kubeconfig)
	pool := map[string]any{"kind": "browser", "size": 1}
	for k, v := range poolShape {
		pool[k] = v
	}
	k := kubeGateway(t, e, gwKubeconfig, b, map[string]any{"pools": []map[string]any{pool}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	k.waitPool(t, 1)
	pods := kubePods(t, b)
	if len(pods) != 1 {
		t.Fatalf("the full pool: %v, want one Pod", pods)
	}
	for id, tenant := range pods {
		if tenant != "" {
			t.Fatalf("the pooled Pod %s is labelled for tenant %q before any claim", id, tenant)
		}
	}

	allow := map[string]any{"egress": map[string]any{"allow": []string{"pages.sandgate.test:80"}}}
	storage := func(id, set string) string {
		t.Helper()
		p := k.preview(t, k.keyA, id, 300)
		actx, acancel := remote.NewAllocator(ctx, browserWS(t, p.URL))
		defer acancel()
		cctx, ccancel := chromedp.NewContext(actx)
		defer ccancel()
		if title, err := navigateTitle(cctx, "http://pages.sandgate.test/hello.html"); err != nil || title != "Sandgate test page" {
			t.Fatalf("page: %q, %v", title, err)
		}
		got, err := chromedp.Run(cctx, chromedp.Evaluate[string](set+`; document.cookie + "|" + (localStorage.getItem("claimant") || "")`))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	// Not e.claim: its cleanup asks a gateway this test stops.
	claim := func() (sessionInfo, string, time.Duration) {
		t.Helper()
		req := map[string]any{"egress": allow["egress"]}
		for key, v := range poolShape {
			req[key] = v
		}
		t0 := time.Now()
		st, body := k.api(t, k.keyA, "POST", "/v1/sessions", req)
		took := time.Since(t0)
		var s sessionInfo
		if st != 201 || json.Unmarshal(body, &s) != nil {
			t.Fatalf("create: %d %s", st, body)
		}
		return s, jsonField(body, "start"), took
	}
	s, start, took := claim()
	if start != "warm" {
		t.Fatalf("the first create was %q, want warm", start)
	}
	t.Logf("warm claim of a pooled Pod answered in %s", took)
	if tenant := kubePods(t, b)[s.ID]; tenant != "tenant-a" {
		t.Errorf("the claimed Pod's tenant label: %q", tenant)
	}
	// The claimed Pod's record says running (the pooled Pod's own mark,
	// which the claim leaves): a replica standing by admits it while no
	// leader answers.
	waitFor(t, 30*time.Second, "the claimed Pod's record to say running", func() bool {
		return podState(t, b, s.ID) == session.StateRunning
	})
	if got := storage(s.ID, `document.cookie = "claimant=first; max-age=3600"; localStorage.setItem("claimant", "first")`); got != "claimant=first|first" {
		t.Fatalf("the first claimant's own cookie and storage: %q", got)
	}
	if st, body := k.api(t, k.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != 200 {
		t.Fatalf("delete: %d %s", st, body)
	}

	k.waitPool(t, 1)
	s2, start, _ := claim()
	if start != "warm" || s2.ID == s.ID {
		t.Fatalf("the second create: %q, id %s after %s", start, s2.ID, s.ID)
	}
	if got := storage(s2.ID, `0`); got != "|" {
		t.Errorf("the next claimant finds %q: a pooled browser carried the last one's cookie or storage", got)
	}

	// Killed with a claimed session and a full pool: the claimed one is
	// adopted, the pooled one (an earlier gateway's) replaced.
	k.waitPool(t, 1)
	var pooled string
	for id := range kubePods(t, b) {
		if id != s2.ID {
			pooled = id
		}
	}
	k.stopGateway(syscall.SIGKILL)
	if err := k.startGateway(); err != nil {
		t.Fatal(err)
	}
	if st, body := k.api(t, k.keyA, "GET", "/v1/sessions/"+s2.ID, nil); st != 200 || jsonField(body, "state") != "running" {
		t.Fatalf("the claimed session after the restart: %d %s", st, body)
	}
	k.waitPool(t, 1)
	waitFor(t, 2*time.Minute, "the earlier gateway's pooled Pod gone", func() bool {
		pods := kubePods(t, b)
		_, old := pods[pooled]
		return !old && len(pods) == 2
	})
	if st, body := k.api(t, k.keyA, "DELETE", "/v1/sessions/"+s2.ID, nil); st != 200 {
		t.Fatalf("delete: %d %s", st, body)
	}
	k.stopGateway(syscall.SIGTERM)
	waitFor(t, 2*time.Minute, "no Pod left once the gateway stopped", func() bool {
		return len(kubePods(t, b)) == 0
	})
}
