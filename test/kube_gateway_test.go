package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandgate/sandgate/images"
	"github.com/sandgate/sandgate/session/kube"
)

// kubeGateway starts a second gateway, with `backend: kubernetes`, whose
// sessions are Pods in the namespace of b on the trial cluster. It shares
// the suite's MinIO and tenant-a's key; it stops when the test ends.
func kubeGateway(t testing.TB, e *testEnv, kubeconfig string, b *kube.Backend, extra ...map[string]any) *testEnv {
	t.Helper()
	k := kubeGatewayConfig(t, e, kubeconfig, b, extra...)
	if err := k.startGateway(); err != nil {
		log, _ := os.ReadFile(k.gwLog)
		t.Fatalf("kubernetes gateway: %v\n%s", err, log)
	}
	t.Cleanup(func() {
		k.stopGateway(syscall.SIGTERM)
		if t.Failed() {
			log, _ := os.ReadFile(k.gwLog)
			t.Logf("the kubernetes gateway's log:\n%s", log)
		}
		if secrets := k.secretsInLogs(); len(secrets) > 0 {
			t.Errorf("secrets in the kubernetes gateway's log: %v", secrets)
		}
	})
	return k
}

// kubeGatewayConfig writes the config of a gateway with backend
// kubernetes on b's namespace, on a port and state directory of its own.
func kubeGatewayConfig(t testing.TB, e *testEnv, kubeconfig string, b *kube.Backend, extra ...map[string]any) *testEnv {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	k := &testEnv{dir: dir, bin: e.bin, gwAddr: fmt.Sprintf("127.0.0.1:%d", port), gwLog: filepath.Join(dir, "gateway.log"),
		keyA: e.keyA, keyB: e.keyB, minioAddr: e.minioAddr, tokenKey: e.tokenKey, vaultKey: e.vaultKey, canary: e.canary}
	k.gwURL = "http://" + k.gwAddr
	sum, sumB := sha256.Sum256([]byte(e.keyA)), sha256.Sum256([]byte(e.keyB))
	cfg := map[string]any{
		"listen": k.gwAddr, "public_url": k.gwURL, "hosts": []string{fmt.Sprintf("localhost:%d", port)},
		"state_dir": filepath.Join(dir, "state"), "cache_dir": cacheDir(),
		"minio":   map[string]any{"endpoint": e.minioAddr, "access_key": "sandgate", "secret_key": "sandgate-test-secret"},
		"tokens":  map[string]any{"active_key": "k1", "keys": map[string]string{"k1": e.tokenKey}},
		"vault":   map[string]any{"key": e.vaultKey},
		"backend": "kubernetes",
		// The egress proxy on the trial cluster's bridge address, which
		// cluster.sh opens to Pods (the stand-in for the proxy's Service);
		// it resolves the suite's test hosts as the suite's gateway does.
		"egress": map[string]any{"listen": kubeEgressAddr, "advertise": kubeEgressAddr, "hosts": testHostNames, "upstream_ca_file": e.hosts.caFile},
		"kubernetes": map[string]any{
			"kubeconfig": kubeconfig, "namespace": b.Namespace(), "image": images.SessionDefinition().Ref(), "pull_policy": "Never",
			"runtime_classes": map[string]string{"runc": "sandgate-runc"},
			"seccomp":         map[string]string{"gvisor": "sandgate/gvisor.json", "runc": "sandgate/runc.json"},
		},
		// The sessions of this test run under the runc RuntimeClass: a
		// gVisor Pod runs on this cluster, but its termination takes from
		// 30 s to minutes here (see TestKubeBackend), too long to wait
		// for at every delete.
		"default_runtime": "runc",
		"tenants": []map[string]any{
			{"name": "tenant-a", "api_key_sha256": []string{hex.EncodeToString(sum[:])}, "max_sessions": 2, "default_ttl": "10m", "max_ttl": "1h"},
			{"name": "tenant-b", "api_key_sha256": []string{hex.EncodeToString(sumB[:])}, "max_sessions": 1, "default_ttl": "10m", "max_ttl": "1h"},
		},
	}
	for _, x := range extra {
		for key, v := range x {
			cfg[key] = v
		}
	}
	raw, _ := json.MarshalIndent(cfg, "", "  ")
	k.cfgPath = filepath.Join(dir, "config.json")
	if err := os.WriteFile(k.cfgPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return k
}

// TestKubeGateway drives the gateway with sessions as Pods, through the
// same API as the containerd backend: a create answered once Chromium
// answers, CDP with a real client through the gateway, exec, files, the
// audit trail, a download; a runtime the cluster lacks and an egress
// allow list (nothing would enforce it) refused; a session adopted by a
// restarted gateway from its Pod alone (its trail from MinIO alone); and
// its Pod gone once it is deleted. The gateway has the cluster credentials of rbac.yaml only.
func TestKubeGateway(t *testing.T) {
	e := needE2E(t)
	kubeconfig := needKube(t)
	b := kubeNamespace(t, kubeconfig)
	// The gateway runs as deploy/kubernetes/rbac.yaml allows, no more.
	gwKubeconfig := kubeGatewayIdentity(t, b, kubeconfig)
	k := kubeGateway(t, e, gwKubeconfig, b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// The namespace has the policy (kubeGatewayIdentity applied it), and
	// the gateway, which may list policies, found it: no warning.
	if raw, err := os.ReadFile(k.gwLog); err != nil || len(raw) == 0 {
		t.Errorf("the gateway's log: %d bytes, %v", len(raw), err)
	} else if bytes.Contains(raw, []byte("NetworkPolicies")) || bytes.Contains(raw, []byte("no NetworkPolicy")) {
		t.Errorf("the gateway warned about the namespace's NetworkPolicy, which is there:\n%s", raw)
	}

	// Refused with the reason, and nothing made.
	for name, c := range map[string]struct {
		req    map[string]any
		status int
		want   string
	}{
		"kata, which the cluster lacks": {map[string]any{"runtime": "kata"}, 422, "not usable"},
		"a bad allow list":              {map[string]any{"egress": map[string]any{"allow": []string{"*"}}}, 400, "host:port"},
	} {
		status, body := k.api(t, k.keyA, "POST", "/v1/sessions", c.req)
		if status != c.status || !strings.Contains(string(body), c.want) {
			t.Errorf("%s: %d %s, want %d naming %q", name, status, body, c.status, c.want)
		}
	}
	if pods, err := b.List(ctx); err != nil || len(pods) != 0 {
		t.Fatalf("after the refusals: %d pods, %v", len(pods), err)
	}

	// A session: its Pod is the record.
	t0 := time.Now()
	st, body := k.api(t, k.keyA, "POST", "/v1/credentials", map[string]any{"name": "kube token", "kind": "bearer", "secret": e.canary,
		"destinations": []map[string]any{{"scheme": "https", "host": "bearer.sandgate.test"}}})
	if st != 201 {
		t.Fatalf("credential: %d %s", st, body)
	}
	bearer := jsonField(body, "id")
	t.Cleanup(func() { k.api(t, k.keyA, "DELETE", "/v1/credentials/"+bearer, nil) })
	s := k.createSession(t, k.keyA, map[string]any{"runtime": "runc",
		"egress":      map[string]any{"allow": []string{"pages.sandgate.test:80"}},
		"credentials": []map[string]any{{"credential": bearer, "scheme": "https", "host": "bearer.sandgate.test", "path_prefix": "/"}},
	})
	created := time.Since(t0)
	t.Logf("create answered (Chromium answering) after %.1f s under the runc RuntimeClass", created.Seconds())
	pods, err := b.List(ctx)
	if err != nil || len(pods) != 1 || pods[0].ID != s.ID || pods[0].Tenant != "tenant-a" || !pods[0].Addr.IsValid() {
		t.Fatalf("the session's Pod: %+v, %v", pods, err)
	}
	if s.Runtime != "runc" {
		t.Errorf("runtime %q", s.Runtime)
	}

	// A second gateway on the namespace is refused while this one runs
	// (it would adopt this one's Pods), once it has waited in vain for
	// the namespace's lease to run out; this one goes on.
	second := kubeGatewayConfig(t, e, gwKubeconfig, b)
	cmd := exec.Command(second.bin, "serve", "-config", second.cfgPath)
	refusal, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(refusal), "another gateway") {
		t.Fatalf("a second gateway on the namespace: %v\n%s", err, refusal)
	}
	if status, body := k.api(t, k.keyA, "GET", "/v1/sessions/"+s.ID, nil); status != 200 || jsonField(body, "state") != "running" {
		t.Fatalf("the first gateway's session after the second was refused: %d %s", status, body)
	}

	// CDP through the gateway, with chromedp.
	p := k.preview(t, k.keyA, s.ID, 300)
	cdp := func() {
		t.Helper()
		actx, acancel := remote.NewAllocator(ctx, browserWS(t, p.URL))
		defer acancel()
		cctx, ccancel := chromedp.NewContext(actx)
		defer ccancel()
		if err := chromedp.Do(cctx, chromedp.Navigate(`data:text/html,<title>k</title><script>window.answer=6*7</script>`)); err != nil {
			t.Fatalf("chromedp through the gateway: navigate: %v", err)
		}
		if answer, err := chromedp.Run(cctx, chromedp.Evaluate[int](`window.answer`)); err != nil || answer != 42 {
			t.Fatalf("chromedp through the gateway: answer %d, %v", answer, err)
		}
	}
	cdp()

	// Exec, as the session's user, with the exit code passed through.
	out := k.execIn(t, k.keyA, s.ID, map[string]any{"cmd": []string{"sh", "-c", "id -u; echo err >&2; exit 3"}})
	if out.ExitCode != 3 || string(out.Stdout) != "1000\n" || string(out.Stderr) != "err\n" {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q", out.ExitCode, out.Stdout, out.Stderr)
	}
	// A working directory given loosely is cleaned, as the containerd
	// backend takes it.
	if out := k.execIn(t, k.keyA, s.ID, map[string]any{"cmd": []string{"pwd"}, "cwd": "/tmp/"}); out.ExitCode != 0 || string(out.Stdout) != "/tmp\n" {
		t.Errorf("exec in /tmp/: exit %d, %q", out.ExitCode, out.Stdout)
	}
	// Environment values would travel in the exec request's URL, which
	// the API server logs: refused, with the reason.
	if status, body := k.api(t, k.keyA, "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"cmd": []string{"env"}, "env": map[string]string{"TOKEN": "x"}}); status != 400 || !strings.Contains(string(body), "URL") {
		t.Errorf("exec with env: %d %s", status, body)
	}
	// Root is refused: session Pods run as non-root.
	if status, body := k.api(t, k.keyA, "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"cmd": []string{"id"}, "root": true}); status < 400 || status >= 500 {
		t.Errorf("exec as root: %d %s", status, body)
	}

	// Egress: the gateway's proxy knows the session by its Pod address.
	// Its allow list holds there, for the browser and for commands; an
	// address on it is not reached around the proxy.
	func() {
		actx, acancel := remote.NewAllocator(ctx, browserWS(t, p.URL))
		defer acancel()
		cctx, ccancel := chromedp.NewContext(actx)
		defer ccancel()
		if title, err := navigateTitle(cctx, "http://pages.sandgate.test/hello.html"); err != nil || title != "Sandgate test page" {
			t.Fatalf("the browser, through the egress proxy, to a host on the allow list: %q, %v", title, err)
		}
		// The bound credential is added by the proxy, under the session's
		// own CA, which the Pod's Chromium trusts by key hash.
		if title, err := navigateTitle(cctx, "https://bearer.sandgate.test/"); err != nil || title != "bearer ok" {
			t.Fatalf("the browser, through the egress proxy, to a host behind the bound bearer token: %q, %v", title, err)
		}
	}()
	sh := func(script string) execOut {
		return k.execIn(t, k.keyA, s.ID, map[string]any{"cmd": []string{"bash", "-c", script}, "timeout_seconds": 30})
	}
	if out := sh("curl -sS --max-time 10 http://pages.sandgate.test/hello.html"); out.ExitCode != 0 || !strings.Contains(string(out.Stdout), "Sandgate test page") {
		t.Fatalf("curl through the egress proxy to a host on the allow list: exit %d %q %q", out.ExitCode, out.Stdout, out.Stderr)
	}
	for name, script := range map[string]string{
		"off the allow list, through the proxy": "curl -sf --max-time 10 http://other.sandgate.test/",
		"the allowed host's address, directly":  fmt.Sprintf(`perl -MIO::Socket::IP -e 'IO::Socket::IP->new(PeerAddr => "%s:80", Timeout => 3) or exit 1; exit 0'`, sitesIP),
	} {
		if out := sh(script); out.ExitCode == 0 {
			t.Errorf("%s: reached from the session Pod (stdout %q)", name, out.Stdout)
		}
	}
	evs := k.events(t, k.keyA, s.ID)
	if !hasEvent(evs, "egress_allowed", "pages.sandgate.test", "") || !hasEvent(evs, "egress_denied", "other.sandgate.test", "allow list") {
		t.Errorf("the egress events are not in the session's trail: %v", evs)
	}

	// Files, both ways, byte for byte.
	blob := make([]byte, 3<<20)
	rand.Read(blob)
	path := "/home/sandgate/workspace/k.bin"
	st, up := k.putFile(t, s.ID, path, blob)
	sum := sha256.Sum256(blob)
	if st != 201 || jsonField(up, "sha256") != hex.EncodeToString(sum[:]) {
		t.Fatalf("upload: %d %s", st, up)
	}
	if out := k.execIn(t, k.keyA, s.ID, map[string]any{"cmd": []string{"wc", "-c", path}}); string(out.Stdout) != fmt.Sprintf("%d %s\n", len(blob), path) {
		t.Fatalf("the upload in the session: %q", out.Stdout)
	}
	if st, got := k.getFile(t, s.ID, path); st != 200 || !bytes.Equal(got, blob) {
		t.Fatalf("download of the upload: %d, %d bytes, equal %v", st, len(got), bytes.Equal(got, blob))
	}

	// A download in the browser reaches the store, read out of the Pod.
	kubeDownload(t, ctx, k, s.ID, p.URL)

	// A preview revoked before the restart.
	revoked := k.preview(t, k.keyA, s.ID, 300)
	if st, body := k.api(t, k.keyA, "DELETE", "/v1/sessions/"+s.ID+"/previews/"+revoked.ID, nil); st != 204 {
		t.Fatalf("revoke: %d %s", st, body)
	}

	// The gateway restarts as if on another node, without the host's
	// trail files and revocations: the session comes back from its Pod,
	// its trail and revocations from MinIO (the trail checked at the
	// end: created, started, download).
	waitFor(t, 30*time.Second, "the download in the stored trail", func() bool {
		return bytes.Contains(storedTrail(t, k.profileBucket(t), "tenant-a", s.ID), []byte(`"download"`))
	})
	// A download this gateway missed (it finished as the gateway was
	// killed): a file in the download directory under a GUID, which the
	// restarted gateway finds by listing the directory inside the Pod.
	const missed = "5d1c0e2a-8b7f-4f3e-a1c9-6e2b9d0f4a73"
	if out := k.execIn(t, k.keyA, s.ID, map[string]any{"cmd": []string{"sh", "-c",
		`printf 'missed in the pod' > "$1/$2"`, "sh", "/home/sandgate/workspace/.downloads", missed}}); out.ExitCode != 0 {
		t.Fatalf("the missed download's file: exit %d %s", out.ExitCode, out.Stderr)
	}
	k.stopGateway(syscall.SIGKILL)
	restarted := time.Now()
	for _, f := range []string{"audit", "revocations.jsonl"} {
		if err := os.RemoveAll(filepath.Join(k.dir, "state", f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.startGateway(); err != nil {
		t.Fatal(err)
	}
	status, body := k.api(t, k.keyA, "GET", "/v1/sessions/"+s.ID, nil)
	if status != 200 || jsonField(body, "state") != "running" {
		t.Fatalf("after the restart: %d %s", status, body)
	}
	// Found and stored; the download stored before the restart is not
	// stored again.
	waitFor(t, 2*time.Minute, "the missed download found and stored", func() bool {
		for _, a := range k.artifacts(t, k.keyA, s.ID) {
			if a.Kind == "download" && a.SHA256 == sha([]byte("missed in the pod")) {
				return true
			}
		}
		return false
	})
	t.Logf("the missed download found in the Pod and stored %.1f s after the gateway was killed (its start included)", time.Since(restarted).Seconds())
	var kept []string
	for _, a := range k.artifacts(t, k.keyA, s.ID) {
		if a.Kind == "download" {
			kept = append(kept, a.Name)
		}
	}
	if sort.Strings(kept); strings.Join(kept, " ") != "download k.txt" {
		t.Errorf("downloads stored after the restart: %v, want the found one and k.txt once", kept)
	}
	cdp() // the same preview: verified by the shared signing key
	if previewAnswers(t, revoked.URL) {
		t.Error("a preview revoked before the restart is taken after it")
	}
	if out := k.execIn(t, k.keyA, s.ID, map[string]any{"cmd": []string{"cat", path}}); out.ExitCode != 0 || !bytes.Equal(out.Stdout, blob) {
		t.Fatalf("after the restart, the file: exit %d, %d bytes", out.ExitCode, len(out.Stdout))
	}

	// A Pod deleted behind the restarted gateway's back (an eviction, a
	// drain): its one watch of the namespace's Pods sees the end, and
	// the session ends with it. (The session running first is the
	// control.)
	st, raw := k.api(t, k.keyA, "POST", "/v1/sessions", map[string]any{"runtime": "runc", "record": true})
	var evicted sessionInfo
	if err := json.Unmarshal(raw, &evicted); st != 201 || err != nil || evicted.State != "running" {
		t.Fatalf("a second session: %d %s", st, raw)
	}
	if err := b.Client().CoreV1().Pods(b.Namespace()).Delete(ctx, "sandgate-"+evicted.ID, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the gateway to see the deleted Pod's session end", func() bool {
		st, body := k.api(t, k.keyA, "GET", "/v1/sessions/"+evicted.ID, nil)
		return st == 404 || (st == 200 && jsonField(body, "state") != "running")
	})
	// Its recording (made by this replica through its lease) is
	// finished, and the lease goes.
	waitFor(t, 2*time.Minute, "the evicted session's recording finished and its lease gone", func() bool {
		_, err := b.Client().CoordinationV1().Leases(b.Namespace()).Get(ctx, "sandgate-recording-"+evicted.ID, metav1.GetOptions{})
		as := k.artifacts(t, k.keyA, evicted.ID)
		return apierrors.IsNotFound(err) && findKind(as, "recording", "video/mp4") != nil
	})

	// Deleted: the Pod goes, and the audit trail is stored.
	if status, body := k.api(t, k.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); status != 200 {
		t.Fatalf("delete: %d %s", status, body)
	}
	waitFor(t, 2*time.Minute, "the session's Pod to go", func() bool {
		pods, err := b.List(ctx)
		return err == nil && len(pods) == 0
	})
	status, body = k.api(t, k.keyA, "GET", "/v1/sessions/"+s.ID+"/events", nil)
	for _, want := range []string{`"created"`, `"started"`, `"adopted"`, `"download"`, `"stopped"`} {
		if status != 200 || !strings.Contains(string(body), want) {
			t.Errorf("audit trail: %d, no %s in %s", status, want, body)
		}
	}
}

// kubeDownload has the session's browser download a file it makes itself
// (a blob: nothing leaves the Pod) and waits for the gateway to store it.
func kubeDownload(t *testing.T, ctx context.Context, k *testEnv, id, previewURL string) {
	t.Helper()
	actx, acancel := remote.NewAllocator(ctx, browserWS(t, previewURL))
	defer acancel()
	cctx, ccancel := chromedp.NewContext(actx)
	defer ccancel()
	const page = `data:text/html,<a id="a" download="k.txt">x</a><script>` +
		`document.getElementById("a").href=URL.createObjectURL(new Blob(["kube download"]))</script>`
	if err := chromedp.Do(cctx, chromedp.Navigate(page), chromedp.Click(chromedp.CSS("#a"))); err != nil {
		t.Fatalf("download click: %v", err)
	}
	waitFor(t, 2*time.Minute, "the download in the audit trail", func() bool {
		status, body := k.api(t, k.keyA, "GET", "/v1/sessions/"+id+"/events", nil)
		return status == 200 && strings.Contains(string(body), `"download"`)
	})
	status, body := k.api(t, k.keyA, "GET", "/v1/sessions/"+id+"/artifacts", nil)
	if status != 200 || !strings.Contains(string(body), "k.txt") {
		t.Fatalf("artifacts: %d %s", status, body)
	}
}
