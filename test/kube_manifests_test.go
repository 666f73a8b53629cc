package test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/sandgate/sandgate/session/kube"
)

// manifestDocs reads a manifest's objects as the API server would get
// them, unknown fields and all.
func manifestDocs(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out
}

// kubeCreator creates objects in b's namespace as the API server gets
// them from a manifest, unknown fields and all.
func kubeCreator(t testing.TB, kubeconfig string, b *kube.Backend) func(context.Context, *unstructured.Unstructured, metav1.CreateOptions) error {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(b.Client().Discovery())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	ns := b.Namespace()
	return func(ctx context.Context, obj *unstructured.Unstructured, opts metav1.CreateOptions) error {
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return err
		}
		obj.SetNamespace(ns)
		_, err = dyn.Resource(m.Resource).Namespace(ns).Create(ctx, obj, opts)
		return err
	}
}

// TestKubeManifests: every object of deploy/kubernetes's gateway.yaml and
// minio-trial.yaml passes the real API server's validation (a dry-run
// create with strict field validation, in a test namespace), and the
// pieces agree: the gateway's Pods run as rbac.yaml's ServiceAccount,
// carry the label networkpolicies.yaml lets reach session Pods, and are
// what both Services select (the egress proxy's with each session's
// connections sent to one replica), on the ports the
// policy and the config name; a rolling update adds a replica before it
// removes one.
// The control: the same Deployment with a misspelt field is refused.
func TestKubeManifests(t *testing.T) {
	needE2E(t)
	kubeconfig := needKube(t)
	b := kubeNamespace(t, kubeconfig)
	create := kubeCreator(t, kubeconfig, b)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dryRun := func(obj *unstructured.Unstructured) error {
		return create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
	}
	kinds := map[string]int{}
	for _, path := range []string{"../deploy/kubernetes/gateway.yaml", "../deploy/kubernetes/minio-trial.yaml"} {
		for _, obj := range manifestDocs(t, path) {
			if obj.GetNamespace() != "sandgate" {
				t.Errorf("%s: %s %s is in namespace %q, not sandgate", path, obj.GetKind(), obj.GetName(), obj.GetNamespace())
			}
			if err := dryRun(obj); err != nil {
				t.Errorf("%s: %s %s refused by the API server: %v", path, obj.GetKind(), obj.GetName(), err)
			}
			kinds[obj.GetKind()]++
		}
	}
	if kinds["Deployment"] != 2 || kinds["Service"] != 3 || kinds["Secret"] != 1 {
		t.Errorf("objects found: %v", kinds)
	}

	// The control: a misspelt field is refused.
	bad := manifestDocs(t, "../deploy/kubernetes/gateway.yaml")[0]
	unstructured.SetNestedField(bad.Object, int64(1), "spec", "replica")
	if err := dryRun(bad); err == nil || !strings.Contains(err.Error(), "replica") {
		t.Errorf("a Deployment with a misspelt field: %v, want it refused naming the field", err)
	}

	// The pieces agree.
	var gw *appsv1.Deployment
	var services []*corev1.Service
	for _, obj := range kubeManifest(t, "../deploy/kubernetes/gateway.yaml") {
		switch o := obj.(type) {
		case *appsv1.Deployment:
			gw = o
		case *corev1.Service:
			services = append(services, o)
		}
	}
	if gw == nil || len(services) != 2 {
		t.Fatalf("gateway.yaml: deployment %v, %d services", gw != nil, len(services))
	}
	pod := labels.Set(gw.Spec.Template.Labels)
	var sa string
	for _, obj := range kubeManifest(t, "../deploy/kubernetes/rbac.yaml") {
		if o, ok := obj.(*corev1.ServiceAccount); ok {
			sa = o.Name
		}
	}
	if gw.Spec.Template.Spec.ServiceAccountName != sa || sa == "" {
		t.Errorf("the gateway runs as %q, rbac.yaml's ServiceAccount is %q", gw.Spec.Template.Spec.ServiceAccountName, sa)
	}
	ports := map[string]int32{}
	for _, p := range gw.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = p.ContainerPort
	}
	// Both Services send to every replica: the API's (one standing by
	// forwards), and the egress proxy's (each replica's proxy knows a
	// session by its connection's source address), a session's
	// connections to one (so that its limits hold as one replica counts
	// them), and only to those whose proxy answers (the leader's probe
	// labels them serving).
	leader := labels.Merge(pod, labels.Set{kube.LabelGatewayRole: kube.RoleLeader})
	serving := labels.Set{kube.LabelEgress: kube.EgressServing}
	pending := labels.Set{kube.LabelEgress: kube.EgressPending}
	for _, svc := range services {
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		egress := len(svc.Spec.Ports) == 1 && svc.Spec.Ports[0].TargetPort.StrVal == "egress"
		if egress {
			if !sel.Matches(labels.Merge(leader, serving)) || !sel.Matches(labels.Merge(pod, serving)) {
				t.Errorf("Service %s does not select every gateway replica's Pod whose proxy serves", svc.Name)
			}
			if sel.Matches(pod) || sel.Matches(labels.Merge(leader, pending)) {
				t.Errorf("Service %s selects a gateway replica's Pod whose proxy has not answered the leader's probe", svc.Name)
			}
		} else if !sel.Matches(leader) || !sel.Matches(pod) || len(svc.Spec.Selector) == 0 {
			t.Errorf("Service %s does not select every gateway replica's Pod", svc.Name)
		}
		// A proxy serves while its replica's /readyz says 503 (full,
		// draining, no leader answering).
		if egress && (!svc.Spec.PublishNotReadyAddresses || svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP) {
			t.Errorf("Service %s sends egress only to a replica that is ready (%v), or a session's connections to any (affinity %q)",
				svc.Name, !svc.Spec.PublishNotReadyAddresses, svc.Spec.SessionAffinity)
		}
		for _, p := range svc.Spec.Ports {
			if _, ok := ports[p.TargetPort.StrVal]; !ok {
				t.Errorf("Service %s targets port %q, which the gateway's Pod does not name", svc.Name, p.TargetPort.StrVal)
			}
		}
	}
	// Replicas: each tells the others where it serves (its Pod IP and
	// API port) and names its own Pod (labelled while it leads); a
	// rolling update starts a new replica before it stops an old one.
	c := gw.Spec.Template.Spec.Containers[0]
	args := map[string]string{}
	for i, a := range c.Args {
		if strings.HasPrefix(a, "-") && i+1 < len(c.Args) {
			args[a] = c.Args[i+1]
		}
	}
	fieldEnv := map[string]string{}
	for _, env := range c.Env {
		if env.ValueFrom != nil && env.ValueFrom.FieldRef != nil {
			fieldEnv[env.Name] = env.ValueFrom.FieldRef.FieldPath
		}
	}
	if args["-advertise"] != fmt.Sprintf("$(POD_IP):%d", ports["api"]) || fieldEnv["POD_IP"] != "status.podIP" {
		t.Errorf("the gateway advertises %q (POD_IP from %q), want $(POD_IP):%d from the Pod's IP", args["-advertise"], fieldEnv["POD_IP"], ports["api"])
	}
	if args["-pod"] != "$(POD_NAME)" || fieldEnv["POD_NAME"] != "metadata.name" {
		t.Errorf("the gateway's Pod is %q (POD_NAME from %q), want $(POD_NAME) from its name", args["-pod"], fieldEnv["POD_NAME"])
	}
	ru := gw.Spec.Strategy.RollingUpdate
	if gw.Spec.Replicas == nil || *gw.Spec.Replicas < 2 || gw.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType ||
		ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 || ru.MaxSurge == nil || ru.MaxSurge.IntValue() < 1 {
		t.Errorf("the gateway's Deployment: replicas %v, strategy %+v; want 2 or more, a rolling update that adds one before it removes one", gw.Spec.Replicas, gw.Spec.Strategy)
	}
	// Room for the leader to drain (drain_timeout's default, 2m) and
	// give the lease back before it is killed; the Services stop sending
	// to a replica before its SIGTERM.
	if g := gw.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g < 150 {
		t.Errorf("the gateway's grace period is %v s: shorter than its drain", g)
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds < 2 {
		t.Errorf("the gateway has no preStop pause: %+v", c.Lifecycle)
	}
	if ports["egress"] != 3128 {
		t.Errorf("the gateway's egress port is %d, the policy lets sessions reach 3128", ports["egress"])
	}
	policies := map[string]*networkingv1.NetworkPolicy{}
	for _, obj := range kubeManifest(t, "../deploy/kubernetes/networkpolicies.yaml") {
		np := obj.(*networkingv1.NetworkPolicy)
		policies[np.Name] = np
	}
	sessions, gateway := policies["sandgate-sessions"], policies["sandgate-gateway"]
	if sessions == nil || gateway == nil {
		t.Fatalf("networkpolicies.yaml: %d policies, want sandgate-sessions and sandgate-gateway", len(policies))
	}
	if sel, err := metav1.LabelSelectorAsSelector(&gateway.Spec.PodSelector); err != nil || !sel.Matches(pod) {
		t.Errorf("sandgate-gateway does not select the gateway's Pods")
	}
	sessionPod := labels.Set(sessions.Spec.PodSelector.MatchLabels)
	apiOpen, proxyFromSessions := false, false
	for _, in := range gateway.Spec.Ingress {
		for _, p := range in.Ports {
			switch {
			case p.Port.IntVal == ports["api"] && len(in.From) == 0:
				apiOpen = true
			case p.Port.IntVal == ports["egress"] && len(in.From) == 2:
				// Session Pods, and the gateway's own (the leader probes
				// each replica's proxy), each peer one or the other.
				var fromSessions, fromGateway bool
				for _, from := range in.From {
					sel, err := metav1.LabelSelectorAsSelector(from.PodSelector)
					if err != nil || from.NamespaceSelector != nil || from.IPBlock != nil {
						continue
					}
					fromSessions = fromSessions || sel.Matches(sessionPod) && !sel.Matches(pod)
					fromGateway = fromGateway || sel.Matches(pod) && !sel.Matches(sessionPod)
				}
				proxyFromSessions = fromSessions && fromGateway
			}
		}
	}
	if !apiOpen || !proxyFromSessions {
		t.Errorf("sandgate-gateway: the API port open to all %v, the proxy's port to session Pods and the gateway's only %v", apiOpen, proxyFromSessions)
	}
	for _, np := range []*networkingv1.NetworkPolicy{sessions} {
		for _, in := range np.Spec.Ingress {
			for _, from := range in.From {
				if sel, err := metav1.LabelSelectorAsSelector(from.PodSelector); err != nil || !sel.Matches(pod) {
					t.Errorf("networkpolicies.yaml: the gateway's Pods are not among those that reach session Pods (%v)", from.PodSelector)
				}
			}
		}
		for _, out := range np.Spec.Egress {
			for _, to := range out.To {
				if sel, err := metav1.LabelSelectorAsSelector(to.PodSelector); err != nil || !sel.Matches(pod) {
					t.Errorf("networkpolicies.yaml: session Pods may not reach the gateway's Pods (%v)", to.PodSelector)
				}
			}
		}
	}
}
