package test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/images"
	"github.com/sandgate/sandgate/session/kube"
)

// The images the trial cluster runs gateway.yaml and minio-trial.yaml
// with: cluster.sh image builds each from one static program. Names of
// the tests' own, put in the manifests: not the ones a user of the trial
// cluster would import.
const (
	deployGatewayImage = "sandgate.local/gateway:test"
	deployMinioImage   = "sandgate.local/minio:test"
)

// TestKubeDeployment runs deploy/kubernetes as its README says, on the
// trial cluster: rbac.yaml, networkpolicies.yaml, minio-trial.yaml and
// gateway.yaml as they are (in a test namespace, and MinIO's password replaced), the config in the Secret
// the Deployment mounts.
// Both replicas come up ready, one leads (its Pod labelled) and the
// other stands by. Through the gateway's Service, as a client reaches
// it, a session is created and driven (exec, CDP with chromedp, a file),
// and its browser and commands reach an allowed host through the egress
// proxy's Service and are refused one off the list; from the session,
// the API server is not reached while the gateway reaches it. Each
// replica's own egress proxy serves the session (the one standing by
// knows it by its Pod), and reports its events to the leader's trail. The
// leader's gateway is then SIGKILLed, while a download through the
// other's proxy goes on to its end: a replica takes over (in practice
// the same Pod's container, started again, which knows its dead run);
// then the leader's Pod is deleted, as a rolling update does: the other
// replica takes over. Each time the same session is driven through the
// Service again and its recording goes on; its audit trail has the
// events from before. The logs hold none of the secrets.
//
// The trial cluster has no DNS: the config names MinIO and the egress
// proxy by their Services' cluster IPs (a cluster with DNS names MinIO
// sandgate-minio.sandgate.svc, as the README's config does).
func TestKubeDeployment(t *testing.T) {
	started := time.Now()
	e := needE2E(t)
	kubeconfig := needKube(t)
	admin := kubeNamespace(t, kubeconfig)
	ns, c := admin.Namespace(), admin.Client()
	kubeGatewayIdentity(t, admin, kubeconfig) // rbac.yaml and networkpolicies.yaml, in ns
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	// The images: the gateway as the Containerfile makes it (the static
	// binary, ffmpeg for the recordings), MinIO as the suite runs it.
	t0 := time.Now()
	bin := filepath.Join(t.TempDir(), "sandgate")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "../cmd/sandgate")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("static gateway binary: %v\n%s", err, out)
	}
	for name, progs := range map[string][]string{deployGatewayImage: {bin, "ffmpeg", "ffprobe"}, deployMinioImage: {filepath.Join(cacheDir(), "minio")}} {
		if out, err := exec.Command("../deploy/kubernetes/cluster.sh", append([]string{"image", name}, progs...)...).CombinedOutput(); err != nil {
			t.Fatalf("cluster.sh image %s: %v\n%s", name, err, out)
		}
	}
	t.Logf("images built and imported in %.1f s", time.Since(t0).Seconds())

	create := kubeCreator(t, kubeconfig, admin)
	apply := func(ctx context.Context, obj *unstructured.Unstructured) {
		t.Helper()
		if err := create(ctx, obj, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	gwPods, minioPods := "app.kubernetes.io/name=sandgate-gateway", "app.kubernetes.io/name=sandgate-minio"
	t.Cleanup(func() {
		if t.Failed() {
			deployLogs(t, c, ns, gwPods)
			deployLogs(t, c, ns, minioPods)
		}
	})
	minioSecret := "minio-" + strings.ToLower(ids.NewSession()[2:14])
	setImage := func(obj *unstructured.Unstructured, image string) {
		containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
		containers[0].(map[string]any)["image"] = image
		unstructured.SetNestedSlice(obj.Object, containers, "spec", "template", "spec", "containers")
	}
	for _, obj := range manifestDocs(t, "../deploy/kubernetes/minio-trial.yaml") {
		switch obj.GetKind() {
		case "Secret":
			unstructured.SetNestedField(obj.Object, minioSecret, "stringData", "MINIO_ROOT_PASSWORD")
		case "Deployment":
			setImage(obj, deployMinioImage)
		}
		apply(ctx, obj)
	}
	waitFor(t, 3*time.Minute, "MinIO ready", func() bool {
		return len(deployReady(t, ctx, c, ns, minioPods)) == 1
	})
	// The Services first: the config names their addresses.
	var deployment *unstructured.Unstructured
	for _, obj := range manifestDocs(t, "../deploy/kubernetes/gateway.yaml") {
		if obj.GetKind() == "Deployment" {
			deployment = obj
			continue
		}
		apply(ctx, obj)
	}
	svcIP := func(name string) string {
		svc, err := c.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || svc.Spec.ClusterIP == "" {
			t.Fatalf("Service %s: %v", name, err)
		}
		return svc.Spec.ClusterIP
	}
	gwIP, egressIP, minioIP := svcIP("sandgate-gateway"), svcIP("sandgate-egress"), svcIP("sandgate-minio")

	sum, sumB := sha256.Sum256([]byte(e.keyA)), sha256.Sum256([]byte(e.keyB))
	cfg := map[string]any{
		"listen": "0.0.0.0:8080", "public_url": "http://" + gwIP,
		"state_dir": "/var/lib/sandgate",
		"backend":   "kubernetes",
		"kubernetes": map[string]any{
			"namespace": ns, "image": images.SessionDefinition().Ref(), "pull_policy": "Never",
			"runtime_classes": map[string]string{"runc": "sandgate-runc"},
			"seccomp":         map[string]string{"gvisor": "sandgate/gvisor.json", "runc": "sandgate/runc.json"},
		},
		// Under the runc RuntimeClass, as the other gateway tests on
		// this cluster (see kubeGatewayConfig).
		"default_runtime": "runc",
		"recording":       map[string]any{"segment": "2s"},
		"egress":          map[string]any{"listen": "0.0.0.0:3128", "advertise": egressIP + ":3128", "hosts": testHostNames},
		"minio":           map[string]any{"endpoint": minioIP + ":9000", "access_key": "sandgate", "secret_key": minioSecret},
		"tokens":          map[string]any{"active_key": "k1", "keys": map[string]string{"k1": e.tokenKey}},
		"vault":           map[string]any{"key": e.vaultKey},
		"tenants": []map[string]any{
			{"name": "tenant-a", "api_key_sha256": []string{hex.EncodeToString(sum[:])}, "max_sessions": 2, "default_ttl": "10m", "max_ttl": "1h"},
			{"name": "tenant-b", "api_key_sha256": []string{hex.EncodeToString(sumB[:])}, "max_sessions": 1, "default_ttl": "10m", "max_ttl": "1h"},
		},
	}
	raw, _ := json.MarshalIndent(cfg, "", "  ")
	if _, err := c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "sandgate-gateway-config", Namespace: ns},
		Data:       map[string][]byte{"config.json": raw},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	setImage(deployment, deployGatewayImage)
	apply(ctx, deployment)

	t0 = time.Now()
	// The replicas ready, the leader (its Pod's label) and the others.
	roles := func() (leader string, standing []string, ready int) {
		pods := deployReady(t, ctx, c, ns, gwPods)
		for _, p := range pods {
			if p.Labels[kube.LabelGatewayRole] == kube.RoleLeader {
				leader = p.Name
			} else {
				standing = append(standing, p.Name)
			}
		}
		return leader, standing, len(pods)
	}
	var leader string
	waitFor(t, 5*time.Minute, "both replicas ready, one leading", func() bool {
		l, standing, ready := roles()
		leader = l
		return l != "" && len(standing) == 1 && ready == 2
	})
	t.Logf("the Deployment's two replicas ready, %s leading, %.1f s after it was applied", leader, time.Since(t0).Seconds())
	// The egress proxy's Service sends to both once the leader's probe
	// found their proxies answering (and sessions have egress only from
	// then: a new gateway's first seconds).
	egressTo := func(serving ...string) func() bool {
		return func() bool { return deployEgress(ctx, c, ns, gwPods, "sandgate-egress", serving...) }
	}
	waitFor(t, 2*time.Minute, "the egress proxy's Service sending to both replicas", egressTo(leader, standingBy(roles)))
	t.Logf("the egress proxy's Service sends to both replicas %.1f s after the Deployment was applied", time.Since(t0).Seconds())

	k := &testEnv{gwURL: "http://" + gwIP, keyA: e.keyA, keyB: e.keyB, tokenKey: e.tokenKey, vaultKey: e.vaultKey, canary: e.canary}
	// kube-proxy sends to the replicas once it has seen them ready.
	for end := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		st, body, err := deployGet(k.gwURL+"/v1/sessions", k.keyA)
		if err == nil && st == 200 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the API through the gateway's Service, a minute on: %d %.300s %v", st, body, err)
		}
	}
	// The control for the key: another is refused.
	if st, body := k.api(t, "sg_not-a-key", "GET", "/v1/sessions", nil); st != 401 {
		t.Fatalf("a wrong key through the gateway's Service: %d %s", st, body)
	}

	t0 = time.Now()
	s := k.createSession(t, k.keyA, map[string]any{"runtime": "runc", "record": true, "egress": map[string]any{"allow": []string{"pages.sandgate.test:80"}}})
	t.Logf("a session created through the gateway's Service in %.1f s (Chromium answering)", time.Since(t0).Seconds())
	drive := func(when string) {
		t.Helper()
		out := k.execIn(t, k.keyA, s.ID, map[string]any{"cmd": []string{"sh", "-c", "echo " + when + "; id -u"}})
		if out.ExitCode != 0 || string(out.Stdout) != when+"\n1000\n" {
			t.Fatalf("%s: exec through the Service: exit %d, %q %q", when, out.ExitCode, out.Stdout, out.Stderr)
		}
		p := k.preview(t, k.keyA, s.ID, 300)
		// As the README says to: the gateway's URL has no port here.
		actx, acancel := remote.NewAllocator(ctx, browserWS(t, p.URL), remote.NoModifyURL)
		defer acancel()
		cctx, ccancel := chromedp.NewContext(actx)
		defer ccancel()
		if err := chromedp.Do(cctx, chromedp.Navigate(`data:text/html,<title>d</title><script>window.answer=6*7</script>`)); err != nil {
			t.Fatalf("%s: chromedp through the Service: %v", when, err)
		}
		if answer, err := chromedp.Run(cctx, chromedp.Evaluate[int](`window.answer`)); err != nil || answer != 42 {
			t.Fatalf("%s: chromedp through the Service: answer %d, %v", when, answer, err)
		}
		// The browser's egress, through the proxy's Service, to the
		// leader's proxy, which knows the session by its Pod's address.
		if title, err := navigateTitle(cctx, "http://pages.sandgate.test/hello.html"); err != nil || title != "Sandgate test page" {
			t.Fatalf("%s: the browser, through the egress proxy's Service, to a host on the allow list: %q, %v", when, title, err)
		}
		blob := []byte(when + " file")
		if st, body := k.putFile(t, s.ID, "/home/sandgate/workspace/"+when, blob); st != 200 && st != 201 && st != 204 {
			t.Fatalf("%s: upload: %d %s", when, st, body)
		}
		if st, got := k.getFile(t, s.ID, "/home/sandgate/workspace/"+when); st != 200 || !bytes.Equal(got, blob) {
			t.Fatalf("%s: download: %d %q", when, st, got)
		}
	}
	drive("before")

	sh := func(script string) execOut {
		return k.execIn(t, k.keyA, s.ID, map[string]any{"cmd": []string{"bash", "-c", script}, "timeout_seconds": 30})
	}
	if out := sh("curl -sS --max-time 10 http://pages.sandgate.test/hello.html"); out.ExitCode != 0 || !strings.Contains(string(out.Stdout), "Sandgate test page") {
		t.Fatalf("curl through the egress proxy's Service to a host on the allow list: exit %d %q %q", out.ExitCode, out.Stdout, out.Stderr)
	}
	if out := sh("curl -sf --max-time 10 http://other.sandgate.test/"); out.ExitCode == 0 {
		t.Errorf("curl through the egress proxy to a host off the allow list: reached (%q)", out.Stdout)
	}
	// The API server, through its Service: the gateway's Pods reach it
	// (they run), a session's may not (NetworkPolicy).
	apiProbe := `perl -MIO::Socket::IP -e 'IO::Socket::IP->new(PeerAddr => "%s", Timeout => 5) or exit 1; exit 0'`
	if out := sh(fmt.Sprintf(apiProbe, "10.99.0.1:443")); out.ExitCode == 0 {
		t.Errorf("the session's Pod opened a connection to the API server")
	}
	if out := sh(fmt.Sprintf(apiProbe, egressIP+":3128")); out.ExitCode != 0 {
		t.Errorf("the control: the session's Pod could not open a connection to the egress proxy's Service: %q", out.Stderr)
	}
	// A node port to the gateway's API (kube-proxy marks such
	// connections, and accepts them before any filter rule of the
	// node's): the policy holds for it too. The control: the node
	// reaches it.
	nodePort, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "gateway-nodeport", Namespace: ns},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app.kubernetes.io/name": "sandgate-gateway"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromString("api")}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodeAddr := fmt.Sprintf("10.97.0.1:%d", nodePort.Spec.Ports[0].NodePort)
	waitFor(t, time.Minute, "the gateway through the node port, from the node", func() bool {
		st, _, err := deployGet("http://"+nodeAddr+"/healthz", "")
		return err == nil && st == 200
	})
	if out := sh(fmt.Sprintf(apiProbe, nodeAddr)); out.ExitCode == 0 {
		t.Errorf("the session's Pod opened a connection to the gateway's API through a node port")
	}

	// Every replica serves the sessions' egress, the one standing by
	// knowing the session by its Pod: straight to its Pod's proxy, a
	// host on the allow list is reached and one off it refused, as
	// through the leader's (the control).
	standby := ""
	addrs := map[string]string{}
	ready := deployReady(t, ctx, c, ns, gwPods)
	for _, p := range ready {
		addrs[p.Name] = p.Status.PodIP
		if p.Name != leader {
			standby = p.Name
		}
	}
	if standby == "" || addrs[leader] == "" {
		t.Fatalf("the replicas' addresses: %v (leader %s)", addrs, leader)
	}
	// Each replica's metrics, scraped as its Pod's annotations say (by
	// its address, as Prometheus names it): the leader counts the
	// session; the replica standing by answers its own, counting none.
	for _, p := range ready {
		a := p.Annotations
		if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] == "" || a["prometheus.io/path"] == "" {
			t.Fatalf("the gateway Pod %s's scrape annotations: %v", p.Name, a)
		}
		st, body, err := deployGet("http://"+p.Status.PodIP+":"+a["prometheus.io/port"]+a["prometheus.io/path"], "")
		leading := p.Name == leader
		switch {
		case err != nil || st != 200:
			t.Errorf("a scrape of %s (leading: %v): %d %v", p.Name, leading, st, err)
		case leading && (!strings.Contains(string(body), "\nsandgate_gateway_leading 1\n") || !strings.Contains(string(body), `sandgate_sessions{state="running"} `) ||
			strings.Contains(string(body), "sandgate_sessions{state=\"running\"} 0\n")):
			t.Errorf("a scrape of the leader %s: %s, want it leading and counting the session", p.Name, body)
		case !leading && (!strings.Contains(string(body), "\nsandgate_gateway_leading 0\n") || strings.Contains(string(body), "sandgate_sessions")):
			t.Errorf("a scrape of %s, standing by: %s, want its own, counting no session", p.Name, body)
		}
	}
	for _, name := range []string{leader, standby} {
		via := "curl -sS --max-time 10 -x http://" + addrs[name] + ":3128 "
		if out := sh(via + "http://pages.sandgate.test/hello.html"); out.ExitCode != 0 || !strings.Contains(string(out.Stdout), "Sandgate test page") {
			t.Errorf("curl through the egress proxy of %s (leading: %v) to a host on the allow list: exit %d %q %q", name, name == leader, out.ExitCode, out.Stdout, out.Stderr)
		}
		if out := sh(via + "-f http://other.sandgate.test/"); out.ExitCode == 0 {
			t.Errorf("curl through the egress proxy of %s (leading: %v) to a host off the allow list: reached (%q)", name, name == leader, out.Stdout)
		}
	}

	// The recording is stored as it goes.
	var segments int
	waitFor(t, 2*time.Minute, "a segment of the recording stored", func() bool {
		segments = recordingSegments(t, k, s.ID)
		return segments > 0
	})

	// The leader's gateway is SIGKILLed on the node: a replica takes
	// over (the other, once the lease runs out, or the same Pod's
	// container as it starts again, which knows its dead run).
	holder := func() string {
		le, err := c.CoordinationV1().Leases(ns).Get(ctx, kube.HoldLease, metav1.GetOptions{})
		if err != nil || le.Spec.HolderIdentity == nil {
			return ""
		}
		return *le.Spec.HolderIdentity
	}
	held := holder()
	pod, err := c.CoreV1().Pods(ns).Get(ctx, leader, metav1.GetOptions{})
	if err != nil || held == "" || len(pod.Status.ContainerStatuses) != 1 {
		t.Fatalf("the leader's Pod %s: %v, lease held by %q", leader, err, held)
	}
	container := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	// A download through the proxy of the replica standing by, under
	// way as the leader dies: it goes on to its end.
	const slowSecs = 12
	if out := sh(fmt.Sprintf(`setsid sh -c 'curl -sS -o /tmp/slow.out -x http://%s:3128 "http://pages.sandgate.test/slow?seconds=%d"; echo $? >/tmp/slow.rc' </dev/null >/dev/null 2>&1 &`,
		addrs[standby], slowSecs)); out.ExitCode != 0 {
		t.Fatalf("start a download through %s's egress proxy: exit %d %q", standby, out.ExitCode, out.Stderr)
	}
	waitFor(t, time.Minute, "the download under way", func() bool {
		out := sh("test ! -e /tmp/slow.rc && test -s /tmp/slow.out")
		return out.ExitCode == 0
	})
	t0 = time.Now()
	if out, err := exec.Command("ctr", "-a", kubeSock, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", container).CombinedOutput(); err != nil {
		t.Fatalf("SIGKILL the leader's gateway: %v\n%s", err, out)
	}
	var next string
	waitFor(t, 3*time.Minute, "a replica leading again", func() bool {
		l, _, _ := roles()
		next = l
		return l != "" && holder() != held && holder() != ""
	})
	t.Logf("%s leads %.1f s after the gateway of %s was SIGKILLed", next, time.Since(t0).Seconds(), leader)
	// Until every replica knows who leads again, one may answer 503 with
	// a Retry-After, which clients (the SDKs) wait out: the test waits
	// until each ready replica carries a command of the session.
	running := func() bool {
		for _, p := range deployReady(t, ctx, c, ns, gwPods) {
			if deployExec(p.Status.PodIP, gwIP, k.keyA, s.ID) != 200 {
				return false
			}
		}
		return true
	}
	waitFor(t, 2*time.Minute, "every replica carrying the session's commands", running)
	drive("after")
	waitFor(t, 2*time.Minute, "the download through the replica standing by ending", func() bool {
		return sh("test -e /tmp/slow.rc").ExitCode == 0
	})
	if out := sh("cat /tmp/slow.rc; wc -c </tmp/slow.out"); string(out.Stdout) != fmt.Sprintf("0\n%d\n", slowBytes(slowSecs)) {
		t.Errorf("the download through %s's egress proxy, the leader SIGKILLed meanwhile: exit and bytes %q, want 0 and %d", standby, out.Stdout, slowBytes(slowSecs))
	}
	waitFor(t, 2*time.Minute, "the recording going on after the takeover", func() bool {
		return recordingSegments(t, k, s.ID) > segments
	})

	// The leading replica's Pod deleted, as a rolling update or a drain
	// does: it hands over on SIGTERM, and the other replica's Pod leads.
	killedLog := deployLog(c, ns, leader, true)
	if killedLog == "" {
		t.Errorf("no log of the SIGKILLed run of %s", leader)
	}
	held = holder()
	t0 = time.Now()
	if err := c.CoreV1().Pods(ns).Delete(ctx, next, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var other string
	waitFor(t, 3*time.Minute, "the other replica leading", func() bool {
		l, _, _ := roles()
		other = l
		return l != "" && l != next && holder() != held && holder() != ""
	})
	t.Logf("%s leads %.1f s after the Pod of %s was deleted", other, time.Since(t0).Seconds(), next)
	waitFor(t, 2*time.Minute, "every replica carrying the session's commands", running)
	segments = recordingSegments(t, k, s.ID)
	drive("moved")
	waitFor(t, 2*time.Minute, "the recording going on after the handover", func() bool {
		return recordingSegments(t, k, s.ID) > segments
	})
	evs := k.events(t, k.keyA, s.ID)
	if !hasEvent(evs, "egress_allowed", "pages.sandgate.test", "") || !hasEvent(evs, "egress_denied", "other.sandgate.test", "allow list") {
		t.Errorf("the session's trail after the takeover lacks the egress events from before: %v", evs)
	}
	// Each refusal of other.sandgate.test is in it: through the Service,
	// and through each replica's proxy (the one standing by reported
	// its own to the leader).
	// The standby's carry the time it saw them (happened_at); the
	// leader's own, recorded as they happen, none.
	denied, relayed := 0, 0
	for _, ev := range evs {
		if ev.Type == "egress_denied" && ev.Fields["host"] == "other.sandgate.test" {
			denied++
			if at, ok := ev.Fields["happened_at"].(string); ok {
				relayed++
				if when, err := time.Parse(time.RFC3339Nano, at); err != nil || when.Before(started) || when.After(time.Now()) {
					t.Errorf("a relayed refusal happened at %q (%v), not during the test (from %v)", at, err, started)
				}
			}
		}
	}
	if denied != 3 {
		t.Errorf("the session's trail has %d refusals of other.sandgate.test, want 3 (through the Service, the leader's proxy and the other's): %v", denied, evs)
	}
	if relayed < 1 || relayed > 2 {
		t.Errorf("%d of the refusals carry the time a standby saw them, want the standby's proxy's and perhaps the Service's: %v", relayed, evs)
	}
	for _, when := range []string{"before", "after", "moved"} {
		found := false
		for _, ev := range evs {
			found = found || ev.Type == "exec" && strings.Contains(fmt.Sprint(ev.Fields), "echo "+when)
		}
		if !found {
			t.Errorf("the session's trail lacks the exec %s the takeovers: %v", when, evs)
		}
	}

	// A replica whose process hangs (as on a node that died; its Pod
	// stays) leaves the egress proxy's Service once it has missed the
	// leader's probes, and the session's egress through the Service goes
	// on through the other; it comes back once it answers again. (The
	// one standing by now is the Pod that replaced the deleted one: it
	// joins the Service as a new replica does.)
	waitFor(t, 3*time.Minute, "the replaced replica ready", func() bool {
		_, standing, ready := roles()
		return ready == 2 && len(standing) == 1
	})
	frozen := standingBy(roles)
	waitFor(t, 2*time.Minute, "the egress proxy's Service sending to both replicas", egressTo(other, frozen))
	fpod, err := c.CoreV1().Pods(ns).Get(ctx, frozen, metav1.GetOptions{})
	if err != nil || len(fpod.Status.ContainerStatuses) != 1 {
		t.Fatalf("the Pod %s: %v", frozen, err)
	}
	fcontainer := strings.TrimPrefix(fpod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	ctrTask := func(verb string) error {
		out, err := exec.Command("ctr", "-a", kubeSock, "-n", "k8s.io", "tasks", verb, fcontainer).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr tasks %s: %v: %s", verb, err, out)
		}
		return nil
	}
	t0 = time.Now()
	if err := ctrTask("pause"); err != nil {
		t.Fatal(err)
	}
	thawed := false
	defer func() {
		if !thawed {
			ctrTask("resume")
		}
	}()
	waitFor(t, 2*time.Minute, "the frozen replica out of the egress proxy's Service", egressTo(other))
	t.Logf("the gateway of %s frozen: out of the egress proxy's Service %.1f s on", frozen, time.Since(t0).Seconds())
	for i := range 3 {
		if out := sh("curl -sS --max-time 10 http://pages.sandgate.test/hello.html"); out.ExitCode != 0 || !strings.Contains(string(out.Stdout), "Sandgate test page") {
			t.Errorf("curl %d through the egress proxy's Service, one replica frozen: exit %d %q %q", i, out.ExitCode, out.Stdout, out.Stderr)
		}
	}
	t0 = time.Now()
	thawed = true
	if err := ctrTask("resume"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the thawed replica back in the egress proxy's Service", egressTo(other, frozen))
	t.Logf("the gateway of %s thawed: back in the egress proxy's Service %.1f s on", frozen, time.Since(t0).Seconds())

	if st, body := k.api(t, k.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != 204 && st != 200 {
		t.Fatalf("delete: %d %s", st, body)
	}
	waitFor(t, 2*time.Minute, "the session's Pod gone", func() bool {
		pods, err := admin.List(ctx)
		return err == nil && len(pods) == 0
	})
	waitFor(t, 2*time.Minute, "the recording finished", func() bool {
		return len(recordedSegments(t, k, s.ID)) > 0
	})

	// No secret in either replica's log, nor in the SIGKILLed run's
	// (read before its Pod went).
	logs := killedLog + deployLogs(nil, c, ns, gwPods)
	if logs == "" {
		t.Errorf("no gateway log read")
	}
	for name, secret := range map[string]string{"tenant-a's key": e.keyA, "the token key": e.tokenKey, "the vault key": e.vaultKey, "MinIO's secret": minioSecret} {
		if strings.Contains(logs, secret) {
			t.Errorf("%s in the gateway's log", name)
		}
	}
}

// deployGet is a GET with the API key, which may fail.
func deployGet(u, key string) (int, []byte, error) {
	req, _ := http.NewRequest("GET", u, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// deployExec runs true in the session through the replica at podIP
// (port 8080), naming the gateway by host; its status, 0 when there is
// none.
func deployExec(podIP, host, key, id string) int {
	req, _ := http.NewRequest("POST", "http://"+podIP+":8080/v1/sessions/"+id+"/exec", strings.NewReader(`{"cmd":["true"]}`))
	req.Host = host
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// deployLog is the log of the Pod's container, or of its run before
// (previous); "" if there is none.
func deployLog(c kubernetes.Interface, ns, pod string, previous bool) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc, err := c.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Previous: previous}).Stream(ctx)
	if err != nil {
		return ""
	}
	defer rc.Close()
	raw, _ := io.ReadAll(io.LimitReader(rc, 4<<20))
	return string(raw)
}

// deployReady is the Pods selector picks that run, not being deleted,
// and are ready. A container restarted three times fails the test.
func deployReady(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, selector string) []corev1.Pod {
	t.Helper()
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	var ready []corev1.Pod
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount >= 3 {
				t.Fatalf("the container %s of %s restarted %d times", cs.Name, p.Name, cs.RestartCount)
			}
		}
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				ready = append(ready, p)
			}
		}
	}
	return ready
}

// deployLogs is the logs of the Pods selector picks, each headed by its
// name; with t, also logged.
func deployLogs(t *testing.T, c kubernetes.Interface, ns, selector string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return ""
	}
	var all strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&all, "== %s (%s)\n%s\n", p.Name, p.Status.Phase, deployLog(c, ns, p.Name, false))
	}
	if t != nil {
		t.Logf("logs of %s:\n%s", selector, all.String())
	}
	return all.String()
}

// standingBy is the one replica of roles that stands by ("": none, or
// more than one).
func standingBy(roles func() (string, []string, int)) string {
	_, standing, _ := roles()
	if len(standing) != 1 {
		return ""
	}
	return standing[0]
}

// deployEgress says whether the egress proxy's Service svc sends to the
// Pods serving, by name, and to no other: each labelled as serving
// egress, the other gateway Pods not, and the Service's endpoints
// their addresses.
func deployEgress(ctx context.Context, c kubernetes.Interface, ns, selector, svc string, serving ...string) bool {
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return false
	}
	want := map[string]bool{}
	for _, p := range pods.Items {
		on := slices.Contains(serving, p.Name)
		if on != (p.Labels[kube.LabelEgress] == kube.EgressServing) {
			return false
		}
		if on {
			want[p.Status.PodIP] = true
		}
	}
	if len(want) != len(serving) {
		return false
	}
	eps, err := c.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
	if err != nil {
		return false
	}
	got := 0
	for _, sl := range eps.Items {
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				if !want[a] {
					return false
				}
				got++
			}
		}
	}
	return got == len(want)
}
