package test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/session/kube"
)

// TestKubeRBAC runs the backend as the gateway's ServiceAccount with
// nothing but deploy/kubernetes/rbac.yaml: a session Pod is made, found,
// exec'd into and deleted, a recording's Lease taken and given back, a
// missing RuntimeClass refused as missing; and that identity can do
// nothing else asked of it here (Secrets, Nodes, another namespace,
// changing a Pod, making RuntimeClasses), where the cluster's admin can.
// The NetworkPolicies of deploy/kubernetes/networkpolicies.yaml are
// accepted by the API; TestKubeNetworkPolicy tests what they hold.
func TestKubeRBAC(t *testing.T) {
	needE2E(t)
	kubeconfig := needKube(t)
	admin := kubeNamespace(t, kubeconfig)
	ns, c := admin.Namespace(), admin.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	gw, err := kube.New(kubeBackendConfig(kubeGatewayIdentity(t, admin, kubeconfig), ns))
	if err != nil {
		t.Fatal(err)
	}
	gc := gw.Client()

	// What the gateway does, as the gateway.
	if err := gw.Create(ctx, kubeBrowserSpec("kata")); !errors.Is(err, kube.ErrRuntimeMissing) {
		t.Fatalf("kata as the gateway: want ErrRuntimeMissing (a Forbidden lookup would be something else), got %v", err)
	}
	s := kubeBrowserSpec("runc")
	if err := gw.Create(ctx, s); err != nil {
		t.Fatalf("create as the gateway: %v", err)
	}
	t.Cleanup(func() { admin.Delete(context.Background(), s.ID, 0) })
	if _, err := gw.Wait(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if pods, err := gw.List(ctx); err != nil || len(pods) != 1 || pods[0].ID != s.ID {
		t.Fatalf("list as the gateway: %+v, %v", pods, err)
	}
	if out, _, code := kubeRun(t, gw, s.ID, kube.Exec{Args: []string{"id", "-u"}}); code != 0 || strings.TrimSpace(out) != "1000" {
		t.Fatalf("exec as the gateway: exit %d, %q", code, out)
	}
	leases := &kube.Leases{Client: gc, Namespace: ns, Identity: "gateway-a", Duration: 5 * time.Second}
	name := "recording-" + s.ID
	if held, _, err := leases.Acquire(ctx, name, s.ID); err != nil || !held {
		t.Fatalf("lease as the gateway: held %v, %v", held, err)
	}
	if err := leases.Renew(ctx, name); err != nil {
		t.Fatal(err)
	}
	if l, err := leases.List(ctx); err != nil || len(l) != 1 {
		t.Fatalf("leases as the gateway: %+v, %v", l, err)
	}
	// Replicas watch the recordings' leases to spread them.
	if w, err := gc.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("watch leases as the gateway: %v", err)
	} else {
		w.Stop()
	}
	if err := leases.Release(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := gw.Delete(ctx, s.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := gw.Gone(ctx, s.ID); err != nil {
		t.Fatal(err)
	}

	// What it may not do; each asked of the admin too, who may, so a
	// refusal is the Role's and not a broken request.
	other := "sandgate-test-" + strings.ToLower(ids.NewSession()[2:10])
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "rbac-probe"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
	checks := []struct {
		what string
		do   func(kubernetes.Interface) error
	}{
		{"read the namespace's Secrets", func(k kubernetes.Interface) error {
			_, err := k.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list Nodes", func(k kubernetes.Interface) error {
			_, err := k.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list Pods in another namespace", func(k kubernetes.Interface) error {
			_, err := k.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"create a Pod in another namespace (dry run)", func(k kubernetes.Interface) error {
			_, err := k.CoreV1().Pods("default").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"create a ServiceAccount token", func(k kubernetes.Interface) error {
			_, err := k.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "sandgate-gateway", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
			return err
		}},
		{"create a RuntimeClass (dry run)", func(k kubernetes.Interface) error {
			rc, err := k.NodeV1().RuntimeClasses().Get(ctx, "gvisor", metav1.GetOptions{})
			if err != nil {
				return err
			}
			rc.ObjectMeta = metav1.ObjectMeta{Name: other}
			_, err = k.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"create a namespace (dry run)", func(k kubernetes.Interface) error {
			_, err := k.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
	}
	for _, ch := range checks {
		if err := ch.do(c); err != nil {
			t.Errorf("the admin could not %s: %v", ch.what, err)
		}
		if err := ch.do(gc); !apierrors.IsForbidden(err) {
			t.Errorf("the gateway could %s: want Forbidden, got %v", ch.what, err)
		}
	}
	// A patch of a live Pod is not granted; the admin's control is the
	// same patch. (update is: the gateway writes the session's record,
	// its info annotation, with it; TestKubeGateway uses it.)
	s2 := kubeBrowserSpec("runc")
	if err := gw.Create(ctx, s2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Delete(context.Background(), s2.ID, 0) })
	patch := []byte(`{"metadata":{"labels":{"sandgate.io/tenant":"tenant-b"}}}`)
	if _, err := gc.CoreV1().Pods(ns).Patch(ctx, "sandgate-"+s2.ID, "application/merge-patch+json", patch, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) {
		t.Errorf("the gateway could relabel a session Pod: want Forbidden, got %v", err)
	}
	if _, err := c.CoreV1().Pods(ns).Patch(ctx, "sandgate-"+s2.ID, "application/merge-patch+json", patch, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("the admin could not relabel a session Pod: %v", err)
	}
	if err := gw.Delete(ctx, s2.ID, time.Second); err != nil {
		t.Fatal(err)
	}
}

// kubeManifest decodes a multi-document YAML file of built-in kinds.
func kubeManifest(t testing.TB, path string) []runtime.Object {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// applyNetworkPolicies creates deploy/kubernetes/networkpolicies.yaml in
// b's namespace.
func applyNetworkPolicies(t testing.TB, b *kube.Backend) {
	t.Helper()
	ns := b.Namespace()
	for _, obj := range kubeManifest(t, "../deploy/kubernetes/networkpolicies.yaml") {
		np, ok := obj.(*networkingv1.NetworkPolicy)
		if !ok {
			t.Fatalf("networkpolicies.yaml: unexpected %T", obj)
		}
		np.Namespace = ns
		if _, err := b.Client().NetworkingV1().NetworkPolicies(ns).Create(context.Background(), np, metav1.CreateOptions{}); err != nil {
			t.Fatalf("networkpolicies.yaml: %v", err)
		}
	}
}

func setSubjects(subjects []rbacv1.Subject, ns string) {
	for i := range subjects {
		subjects[i].Namespace = ns
	}
}

// kubeGatewayIdentity installs deploy/kubernetes/rbac.yaml and
// networkpolicies.yaml in admin's namespace (the cluster-wide objects
// under names of their own, removed after) and returns a kubeconfig with
// a token of the gateway's ServiceAccount, as a Pod of the Deployment
// would have mounted, once its Role is in effect.
func kubeGatewayIdentity(t testing.TB, admin *kube.Backend, kubeconfig string) string {
	t.Helper()
	ns, c := admin.Namespace(), admin.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The manifests, in this test's namespace; the cluster-wide objects
	// under a name of their own, removed after.
	suffix := "-" + ns
	for _, obj := range kubeManifest(t, "../deploy/kubernetes/rbac.yaml") {
		var err error
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			o.Namespace = ns
			_, err = c.CoreV1().ServiceAccounts(ns).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			o.Namespace = ns
			_, err = c.RbacV1().Roles(ns).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			o.Namespace = ns
			setSubjects(o.Subjects, ns)
			_, err = c.RbacV1().RoleBindings(ns).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			o.Name += suffix
			_, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
			name := o.Name
			t.Cleanup(func() { c.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		case *rbacv1.ClusterRoleBinding:
			o.Name += suffix
			o.RoleRef.Name += suffix
			setSubjects(o.Subjects, ns)
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
			name := o.Name
			t.Cleanup(func() { c.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		default:
			t.Fatalf("rbac.yaml: unexpected %T", obj)
		}
		if err != nil {
			t.Fatalf("rbac.yaml: %v", err)
		}
	}
	applyNetworkPolicies(t, admin)

	// The gateway's credentials: a token of its ServiceAccount, as a Pod
	// of the Deployment would have mounted.
	secs := int64(600)
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "sandgate-gateway",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		*a = clientcmdapi.AuthInfo{Token: tr.Status.Token}
	}
	gwKubeconfig := filepath.Join(t.TempDir(), "gateway.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, gwKubeconfig); err != nil {
		t.Fatal(err)
	}
	gw, err := kube.New(kubeBackendConfig(gwKubeconfig, ns))
	if err != nil {
		t.Fatal(err)
	}
	// Bindings reach the authorizer through its cache: wait for them.
	waitFor(t, time.Minute, "the gateway's Role in effect", func() bool {
		_, err := gw.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil
	})
	return gwKubeconfig
}
