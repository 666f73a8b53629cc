package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/images"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/session/kube"
)

// The single-node cluster of deploy/kubernetes/cluster.sh, brought up
// once for the run by the first test that needs it and stopped after the
// last (TestMain calls kubeDown).
var kubeState struct {
	once       sync.Once
	kubeconfig string
	err        error
	started    bool
}

// Where deploy/kubernetes/cluster.sh keeps its containerd socket and
// its kubelet's files.
const (
	kubeSock   = "/run/sandgate-kube/containerd.sock"
	kubeletDir = "/var/lib/sandgate-kube/kubelet"
)

// needKube brings the cluster up and imports the session image into its
// containerd.
func needKube(t *testing.T) string {
	t.Helper()
	kubeState.once.Do(func() {
		start := time.Now()
		// A cluster that already runs (a developer's) stays up after.
		running := exec.Command("../deploy/kubernetes/cluster.sh", "status").Run() == nil
		out, err := exec.Command("../deploy/kubernetes/cluster.sh", "up").CombinedOutput()
		if err != nil {
			kubeState.err = fmt.Errorf("cluster.sh up: %v\n%s", err, out)
			return
		}
		kubeState.started = !running
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		kubeState.kubeconfig = lines[len(lines)-1]
		t.Logf("cluster up in %.1f s", time.Since(start).Seconds())
		// No registry: the session image comes from the archive the
		// embedded backend's build left in the cache.
		client, err := containerd.New(kubeSock)
		if err != nil {
			kubeState.err = err
			return
		}
		defer client.Close()
		ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), "k8s.io"), 10*time.Minute)
		defer cancel()
		b := &images.Builder{Client: client, CacheDir: cacheDir(), Log: testLogger(t)}
		if _, err := b.Ensure(ctx, images.SessionDefinition()); err != nil {
			kubeState.err = fmt.Errorf("session image into the cluster's containerd: %w", err)
			return
		}
		// The session seccomp profiles, installed on the node as an
		// operator does (deploy/kubernetes/README.md).
		dir := kubeletDir + "/seccomp/sandgate"
		if err := os.MkdirAll(dir, 0o755); err != nil {
			kubeState.err = err
			return
		}
		for _, rt := range []string{"gvisor", "runc"} {
			raw, err := session.SeccompProfile(rt)
			if err == nil {
				err = os.WriteFile(dir+"/"+rt+".json", raw, 0o644)
			}
			if err != nil {
				kubeState.err = err
				return
			}
		}
	})
	if kubeState.err != nil {
		t.Fatal(kubeState.err)
	}
	return kubeState.kubeconfig
}

// kubeDown stops the cluster if this run started it.
func kubeDown() {
	if kubeState.started {
		if out, err := exec.Command("../deploy/kubernetes/cluster.sh", "down").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "cluster.sh down: %v\n%s", err, out)
		}
	}
}

// kubeNamespace makes a namespace for one test, with the RuntimeClasses
// of deploy/kubernetes/runtimeclasses.yaml and a runc one for
// development, and removes all of it after, checking nothing stays.
func kubeNamespace(t *testing.T, kubeconfig string) *kube.Backend {
	t.Helper()
	ns := "sandgate-test-" + strings.ToLower(ids.NewSession()[2:10])
	b, err := kube.New(kube.Config{
		Kubeconfig: kubeconfig, Namespace: ns, Image: images.SessionDefinition().Ref(), PullPolicy: corev1.PullNever,
		RuntimeClasses: map[string]string{"kata": "kata", "gvisor": "gvisor", "runc": "sandgate-runc"},
		Seccomp:        map[string]string{"gvisor": "sandgate/gvisor.json", "runc": "sandgate/runc.json"},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := b.Client()
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Pods need the namespace's default ServiceAccount, which the
	// controller manager makes soon after.
	waitFor(t, time.Minute, "the default ServiceAccount of "+ns, func() bool {
		_, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
	raw, err := os.ReadFile("../deploy/kubernetes/runtimeclasses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var classes []*nodev1.RuntimeClass
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var rc nodev1.RuntimeClass
		if err := yaml.UnmarshalStrict([]byte(doc), &rc); err != nil {
			t.Fatalf("runtimeclasses.yaml: %v", err)
		}
		classes = append(classes, &rc)
	}
	classes = append(classes, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "sandgate-runc"}, Handler: "runc"})
	for _, rc := range classes {
		if rc.Name == "kata" {
			continue // this cluster has no Kata handler: its RuntimeClass stays missing, and is refused
		}
		if _, err := c.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := c.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete namespace %s: %v", ns, err)
		}
		for {
			_, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			if ctx.Err() != nil {
				t.Errorf("namespace %s still there after 3 minutes", ns)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	return b
}

// kubeRun runs a command in a session Pod and returns its output.
func kubeRun(t *testing.T, b *kube.Backend, id string, e kube.Exec) (stdout, stderr string, code int) {
	t.Helper()
	var o, s bytes.Buffer
	e.Stdout, e.Stderr = &o, &s
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code, err := b.Run(ctx, id, e)
	if err != nil {
		t.Fatalf("exec %q: %v", e.Args, err)
	}
	return o.String(), s.String(), code
}

// TestKubeBackend drives session Pods on a real single-node cluster:
// hardening, CDP with a real client, exec with streams and a TTY, files,
// a runtime the cluster lacks refused, and nothing left behind.
func TestKubeBackend(t *testing.T) {
	needE2E(t)
	b := kubeNamespace(t, needKube(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	spec := func(runtime string) kube.Spec {
		return kube.Spec{
			ID: ids.NewSession(), Tenant: "tenant-a", Runtime: runtime, Expires: time.Now().Add(time.Hour),
			CPUs: 1, MemoryMB: 1024, Info: `{"kind":"browser"}`,
			Env: []string{"SANDGATE_KIND=browser", "SANDGATE_SCREEN_WIDTH=1280", "SANDGATE_SCREEN_HEIGHT=800",
				"SANDGATE_CDP_PORT=9222", "SANDGATE_VNC_PORT=5900"},
		}
	}

	// A runtime without its RuntimeClass is refused, with nothing made.
	kata := spec("kata")
	if err := b.Create(ctx, kata); !errors.Is(err, kube.ErrRuntimeMissing) {
		t.Fatalf("kata without a RuntimeClass: want ErrRuntimeMissing, got %v", err)
	} else {
		t.Logf("kata refused: %v", err)
	}
	if pods, err := b.List(ctx); err != nil || len(pods) != 0 {
		t.Fatalf("after the refusal: %d pods, %v", len(pods), err)
	}

	// The control: the runtimes the cluster has run. gVisor is what
	// sessions use here; runc is for development only.
	for _, runtime := range []string{"gvisor", "runc"} {
		t.Run(runtime, func(t *testing.T) { kubeSessionFlow(t, b, spec(runtime)) })
	}
}

// kubeSessionFlow creates one session Pod and drives it: CDP with a real
// client, hardening, exec, a terminal, files, then its deletion.
func kubeSessionFlow(t *testing.T, b *kube.Backend, s kube.Spec) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	if err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Delete(context.Background(), s.ID, 0) }) // after a failure; the end of the test deletes it too
	pod, err := b.Wait(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod running at %s after %.1f s", pod.Addr, time.Since(start).Seconds())
	pods, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, p := range pods {
		if p.ID == s.ID {
			listed = p.Tenant == "tenant-a" && p.Info == s.Info && p.Addr == pod.Addr
		}
	}
	if !listed {
		t.Fatalf("%s is not listed as made: %+v", s.ID, pods)
	}

	// CDP from the gateway's side, with a real client.
	version := "http://" + pod.CDP().String() + "/json/version"
	waitFor(t, 3*time.Minute, "CDP at "+version, func() bool {
		resp, err := http.Get(version)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	t.Logf("CDP answers after %.1f s", time.Since(start).Seconds())
	var v struct {
		WS string `json:"webSocketDebuggerUrl"`
	}
	resp, err := http.Get(version)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&v)
	resp.Body.Close()
	actx, acancel := remote.NewAllocator(ctx, v.WS)
	defer acancel()
	cctx, ccancel := chromedp.NewContext(actx)
	defer ccancel()
	if err := chromedp.Do(cctx, chromedp.Navigate(`data:text/html,<title>k</title><script>window.answer=6*7</script>`)); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	if answer, err := chromedp.Run(cctx, chromedp.Evaluate[int](`window.answer`)); err != nil || answer != 42 {
		t.Fatalf("window.answer = %d, %v", answer, err)
	}

	// Hardening, as the session sees it; the writable places beside the
	// read-only root are the control.
	out, _, code := kubeRun(t, b, s.ID, kube.Exec{Args: []string{"sh", "-c",
		`id -u; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\t' ' '
		touch /etc/x 2>/dev/null && echo root-writable || echo root-read-only
		touch /tmp/x /home/sandgate/x /home/sandgate/workspace/x && echo tmp-writable
		[ -e /var/run/secrets/kubernetes.io ] && echo token-mounted || echo no-token`}})
	wants := []string{"1000\n", "CapEff: 0000000000000000", "Seccomp: 2", "root-read-only", "tmp-writable", "no-token"}
	if s.Runtime == "runc" {
		wants = append(wants, "NoNewPrivs: 1") // gVisor's /proc does not show the line
	}
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("hardening: no %q in %q (exit %d)", want, out, code)
		}
	}

	// The RuntimeClass picked the runtime: gVisor shows its own kernel,
	// runc the host's.
	host, err := exec.Command("uname", "-r").Output()
	if err != nil {
		t.Fatal(err)
	}
	kernel, _, _ := kubeRun(t, b, s.ID, kube.Exec{Args: []string{"uname", "-r"}})
	if underGVisor := kernel != string(host); underGVisor != (s.Runtime == "gvisor") {
		t.Errorf("runtime %s: the session's kernel is %q, the host's %q", s.Runtime, strings.TrimSpace(kernel), strings.TrimSpace(string(host)))
	}

	// Exec: streams, environment, working directory, exit codes.
	o, e, code := kubeRun(t, b, s.ID, kube.Exec{Args: []string{"sh", "-c", `printf '%s|%s|' "$GREETING" "$(pwd)"; cat; echo oops >&2; exit 3`},
		Env: []string{"GREETING=hi"}, Cwd: "/tmp", Stdin: strings.NewReader("in")})
	if o != "hi|/tmp|in" || e != "oops\n" || code != 3 {
		t.Errorf("exec: stdout %q stderr %q exit %d", o, e, code)
	}
	if _, _, code := kubeRun(t, b, s.ID, kube.Exec{Args: []string{"no-such-program"}}); code == 0 {
		t.Error("a missing program exited 0")
	}
	if _, err := b.Run(ctx, s.ID, kube.Exec{Args: []string{"true"}, Env: []string{"=x"}}); err == nil {
		t.Error("an environment entry without a name was taken")
	}

	// A terminal that resizes.
	sizes := make(chan kube.TermSize, 2)
	sizes <- kube.TermSize{Cols: 100, Rows: 30}
	inR, inW := io.Pipe()
	term := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		code, err := b.Run(ctx, s.ID, kube.Exec{Args: []string{"bash"}, Terminal: true, Stdin: inR, Stdout: term, Sizes: sizes})
		if err != nil {
			t.Errorf("terminal: %v", err)
		}
		done <- code
	}()
	fmt.Fprint(inW, "stty size\n")
	waitFor(t, time.Minute, "30 100 from stty", func() bool { return strings.Contains(term.String(), "30 100") })
	sizes <- kube.TermSize{Cols: 120, Rows: 40}
	waitFor(t, time.Minute, "40 120 after the resize", func() bool {
		fmt.Fprint(inW, "stty size\n")
		time.Sleep(100 * time.Millisecond)
		return strings.Contains(term.String(), "40 120")
	})
	fmt.Fprint(inW, "exit 5\n")
	select {
	case code := <-done:
		if code != 5 {
			t.Errorf("terminal exit %d, want 5", code)
		}
	case <-time.After(time.Minute):
		t.Fatal("the terminal did not end")
	}
	close(sizes)
	inW.Close()

	// Files, through the exec API as the gateway does them.
	blob := make([]byte, 1<<20)
	rand.Read(blob)
	if _, _, code := kubeRun(t, b, s.ID, kube.Exec{Args: []string{"sh", "-c", `cat > "$1"`, "sh", "/home/sandgate/workspace/blob"}, Stdin: bytes.NewReader(blob)}); code != 0 {
		t.Fatalf("put: exit %d", code)
	}
	got, _, _ := kubeRun(t, b, s.ID, kube.Exec{Args: []string{"cat", "/home/sandgate/workspace/blob"}})
	if sha256.Sum256([]byte(got)) != sha256.Sum256(blob) {
		t.Fatalf("get: %d bytes back, not the %d put", len(got), len(blob))
	}

	// Delete: the Pod goes and its containers with it.
	if err := b.Delete(ctx, s.ID, 0); err != nil {
		t.Fatal(err)
	}
	gctx, gcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer gcancel()
	if err := b.Gone(gctx, s.ID); err != nil {
		t.Fatal(err)
	}
	pods, err = b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.ID == s.ID {
			t.Fatalf("%s still listed after its deletion", s.ID)
		}
	}
	waitFor(t, 2*time.Minute, "no running container of the deleted Pod", func() bool {
		return kubeRunningContainers(t, "sandgate-"+strings.ToLower(s.ID)) == 0
	})
	// Deleting again is not an error.
	if err := b.Delete(ctx, s.ID, 0); err != nil {
		t.Fatal(err)
	}
}

// kubeRunningContainers counts the cluster containerd's running tasks of
// a Pod.
func kubeRunningContainers(t *testing.T, pod string) int {
	client, err := containerd.New(kubeSock)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := namespaces.WithNamespace(context.Background(), "k8s.io")
	cs, err := client.Containers(ctx, fmt.Sprintf(`labels."io.kubernetes.pod.name"==%s`, pod))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range cs {
		task, err := c.Task(ctx, nil)
		if err != nil {
			continue
		}
		if st, err := task.Status(ctx); err == nil && st.Status == containerd.Running {
			n++
		}
	}
	return n
}

// waitFor polls cond until it holds, failing the test after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("waited %s for %s", limit, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and a polling reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, nil))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
