package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"
)

// The test gateway's own containerd namespace, bridge and subnet, so that
// nothing it does touches a development gateway on the same host.
const (
	testNamespace = "sandgate-test"
	testBridge    = "sgtest0"
	testSubnet    = "10.232.0.0/24"
	bridgeIP      = "10.232.0.1"
)

type testEnv struct {
	dir       string
	bin       string
	cfgPath   string
	gwAddr    string // host:port
	gwURL     string
	gw        *exec.Cmd
	gwLog     string
	minio     *exec.Cmd
	minioAddr string
	minioLog  string
	keyA      string
	keyB      string
	keyC      string // tenant-c: artifacts kept for seconds only
	adminKey  string // the admin API's
	minioBin  string
	minioUI   string
	tokenKey  string
	vaultKey  string
	canary    string // the secret of the test credentials; must never show
	hosts     *testHosts
	client    *containerd.Client

	mu     sync.Mutex
	tokens []string // every preview token issued, for the log check
}

var env *testEnv

// e2eLock holds the host's end-to-end lock for the whole run (a package
// variable: a local one is closed by its finaliser, and the lock with it).
var e2eLock *os.File

func TestMain(m *testing.M) {
	if os.Getenv("SANDGATE_E2E") == "" {
		fmt.Println("end-to-end tests skipped: run them with `make test` (root, containerd, MinIO)")
		os.Exit(m.Run())
	}
	// One end-to-end run at a time on a host: they share the test
	// namespace, bridge and subnet.
	var err error
	e2eLock, err = os.OpenFile("/tmp/sandgate-e2e.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		err = syscall.Flock(int(e2eLock.Fd()), syscall.LOCK_EX)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e lock:", err)
		os.Exit(1)
	}
	e, err := setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		if e != nil {
			e.printLogs()
			e.teardown()
		}
		os.Exit(1)
	}
	env = e
	code := m.Run()
	kubeDown()
	e.stopGateway(syscall.SIGTERM)
	if secrets := e.secretsInLogs(); len(secrets) > 0 {
		fmt.Fprintln(os.Stderr, "SECRETS in the gateway log:", strings.Join(secrets, ", "))
		code = 1
	}
	if leaks := e.leaks(); len(leaks) > 0 {
		fmt.Fprintln(os.Stderr, "LEAKS after the tests:")
		for _, l := range leaks {
			fmt.Fprintln(os.Stderr, "  "+l)
		}
		code = 1
	} else {
		fmt.Println("leak check: no containers, tasks, snapshots, network namespaces, veths, cgroups or mounts left")
	}
	if code != 0 {
		e.printLogs()
	}
	e.teardown()
	os.Exit(code)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func setup() (*testEnv, error) {
	dir, err := os.MkdirTemp("", "sandgate-e2e-")
	if err != nil {
		return nil, err
	}
	e := &testEnv{dir: dir, bin: filepath.Join(dir, "sandgate"), gwLog: filepath.Join(dir, "gateway.log"), minioLog: filepath.Join(dir, "minio.log")}
	build := exec.Command("go", "build", "-o", e.bin, "../cmd/sandgate")
	if out, err := build.CombinedOutput(); err != nil {
		return e, fmt.Errorf("build sandgate: %v\n%s", err, out)
	}
	e.client, err = containerd.New("/run/containerd/containerd.sock")
	if err != nil {
		return e, fmt.Errorf("containerd: %w", err)
	}
	// Empty cgroups that runs before the gateway removed them were left
	// by the runtime (no run holds the test namespace now: the e2e lock).
	for _, c := range sessionCgroups() {
		os.Remove(c)
	}
	if err := e.startMinIO(); err != nil {
		return e, err
	}
	if e.hosts, err = newTestHosts(dir); err != nil {
		return e, fmt.Errorf("test hosts: %w", err)
	}
	if err := e.serveTestSites(); err != nil {
		return e, err
	}
	port, err := freePort()
	if err != nil {
		return e, err
	}
	e.gwAddr = fmt.Sprintf("127.0.0.1:%d", port)
	e.gwURL = "http://" + e.gwAddr
	e.keyA, e.keyB, e.keyC, e.tokenKey = "sg_a_"+randHex(16), "sg_b_"+randHex(16), "sg_c_"+randHex(16), randHex(32)
	e.vaultKey, e.canary = randHex(32), "canary-"+randHex(12)
	e.adminKey = "sg_admin_" + randHex(16)
	hash := func(k string) string { s := sha256.Sum256([]byte(k)); return hex.EncodeToString(s[:]) }
	cfg := map[string]any{
		"listen":     e.gwAddr,
		"public_url": e.gwURL,
		"hosts":      []string{fmt.Sprintf("localhost:%d", port)},
		"state_dir":  filepath.Join(dir, "state"),
		"cache_dir":  cacheDir(),
		"containerd": map[string]string{"namespace": testNamespace},
		"network":    map[string]string{"bridge": testBridge, "subnet": testSubnet},
		"minio":      map[string]any{"endpoint": e.minioAddr, "access_key": "sandgate", "secret_key": "sandgate-test-secret"},
		"tokens":     map[string]any{"active_key": "k1", "keys": map[string]string{"k1": e.tokenKey}},
		"egress":     map[string]any{"hosts": testHostNames, "upstream_ca_file": e.hosts.caFile},
		"vault":      map[string]any{"key": e.vaultKey},
		"tenants": []map[string]any{
			{"name": "tenant-a", "api_key_sha256": []string{hash(e.keyA)}, "max_sessions": 6, "default_ttl": "10m", "max_ttl": "1h", "egress_allow": []string{"pages.sandgate.test:80"}},
			{"name": "tenant-b", "api_key_sha256": []string{hash(e.keyB)}, "max_sessions": 2, "default_ttl": "10m", "max_ttl": "1h", "max_file_bytes": 1 << 20, "egress_allow": []string{"pages.sandgate.test:80"}},
			{"name": "tenant-c", "api_key_sha256": []string{hash(e.keyC)}, "max_sessions": 1, "default_ttl": "10m", "max_ttl": "1h", "artifact_retention": "3s"},
		},
		"admin_key_sha256": []string{hash(e.adminKey)},
		"retention_check":  "1s",
		// Short, so that TestSlowUpload shows uploads outlive it.
		"read_timeout": gatewayReadTimeout.String(),
	}
	// With gVisor built (deploy/setup.sh), the suite runs under it: the
	// default is the strongest usable runtime. Without, under runc.
	if runsc := filepath.Join(cacheDir(), "runsc"); fileExists(runsc) {
		cfg["runtimes"] = map[string]any{"gvisor": map[string]string{"runsc": runsc}}
	} else {
		cfg["default_runtime"] = "runc"
	}
	raw, _ := json.MarshalIndent(cfg, "", "  ")
	e.cfgPath = filepath.Join(dir, "config.json")
	if err := os.WriteFile(e.cfgPath, raw, 0o600); err != nil {
		return e, err
	}
	// Import the session image into the test namespace before the clock
	// of any test starts.
	imp := exec.Command(e.bin, "image", "build", "-config", e.cfgPath)
	if out, err := imp.CombinedOutput(); err != nil {
		return e, fmt.Errorf("session image: %v\n%s", err, out)
	}
	if err := e.startGateway(); err != nil {
		return e, err
	}
	return e, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func cacheDir() string {
	if d := os.Getenv("SANDGATE_CACHE"); d != "" {
		return d
	}
	return "/var/cache/sandgate"
}

func (e *testEnv) startMinIO() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	cport, err := freePort()
	if err != nil {
		return err
	}
	e.minioAddr = fmt.Sprintf("127.0.0.1:%d", port)
	bin := os.Getenv("SANDGATE_MINIO")
	if bin == "" {
		bin = filepath.Join(cacheDir(), "minio")
	}
	e.minioBin, e.minioUI = bin, fmt.Sprintf("127.0.0.1:%d", cport)
	return e.runMinIO(bin, e.minioUI)
}

// restartMinIO starts MinIO again on the same address and data.
func (e *testEnv) restartMinIO() error { return e.runMinIO(e.minioBin, e.minioUI) }

// minioAway kills MinIO; back starts it again (once), and the test's end
// does if the test did not, so the tests after it have their store.
func (e *testEnv) minioAway(t *testing.T) (back func()) {
	t.Helper()
	e.minio.Process.Kill()
	e.minio.Wait()
	up := false
	start := func() error {
		if up {
			return nil
		}
		up = true
		return e.restartMinIO()
	}
	t.Cleanup(func() {
		if err := start(); err != nil {
			t.Errorf("restart MinIO: %v", err)
		}
	})
	return func() {
		t.Helper()
		if err := start(); err != nil {
			t.Fatalf("restart MinIO: %v", err)
		}
	}
}

func (e *testEnv) runMinIO(bin, console string) error {
	logf, err := os.OpenFile(e.minioLog, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, "server", filepath.Join(e.dir, "minio"), "--address", e.minioAddr, "--console-address", console)
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER=sandgate", "MINIO_ROOT_PASSWORD=sandgate-test-secret")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start minio (%s): %w", bin, err)
	}
	e.minio = cmd
	return waitHTTP("http://"+e.minioAddr+"/minio/health/live", 60*time.Second)
}

func waitHTTP(url string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer within %s", url, limit)
}

func (e *testEnv) startGateway() error {
	logf, err := os.OpenFile(e.gwLog, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(e.bin, "serve", "-config", e.cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	e.gw = cmd
	go cmd.Wait()
	return waitHTTP(e.gwURL+"/healthz", 2*time.Minute)
}

// stopGateway signals the gateway and waits for it to exit.
func (e *testEnv) stopGateway(sig syscall.Signal) {
	if e.gw == nil || e.gw.Process == nil {
		return
	}
	e.gw.Process.Signal(sig)
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if e.gw.Process.Signal(syscall.Signal(0)) != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.gw = nil
}

func (e *testEnv) printLogs() {
	for _, f := range []string{e.gwLog, e.minioLog} {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if len(raw) > 20000 {
			raw = raw[len(raw)-20000:]
		}
		fmt.Fprintf(os.Stderr, "---- %s ----\n%s\n", filepath.Base(f), raw)
	}
}

func (e *testEnv) teardown() {
	e.stopGateway(syscall.SIGTERM)
	if e.minio != nil && e.minio.Process != nil {
		e.minio.Process.Kill()
		e.minio.Wait()
	}
	if e.client != nil {
		e.client.Close()
	}
	if e.hosts != nil {
		e.hosts.close()
	}
	os.RemoveAll(e.dir)
}

// leaks lists everything of the test namespace that outlived the tests:
// containers, tasks, active snapshots, network namespaces, veths,
// cgroups and mounts under the suite's directory (a session workspace's
// tmpfs). It also removes them, so one failed run does not poison the
// next.
func (e *testEnv) leaks() []string {
	ctx := namespaces.WithNamespace(context.Background(), testNamespace)
	var out []string
	cs, err := e.client.Containers(ctx)
	if err != nil {
		return []string{"list containers: " + err.Error()}
	}
	for _, c := range cs {
		out = append(out, "container "+c.ID())
		if t, err := c.Task(ctx, nil); err == nil {
			out = append(out, "task "+c.ID())
			t.Delete(ctx, containerd.WithProcessKill)
		}
		c.Delete(ctx, containerd.WithSnapshotCleanup)
	}
	sn := e.client.SnapshotService("overlayfs")
	sn.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		if i.Kind == snapshots.KindActive {
			out = append(out, "snapshot "+i.Name)
		}
		return nil
	})
	for _, ns := range sessionNetNS() {
		out = append(out, "netns "+ns)
		exec.Command("ip", "netns", "del", ns).Run()
	}
	for _, v := range bridgeVeths() {
		out = append(out, "veth "+v)
	}
	for _, c := range sessionCgroups() {
		out = append(out, "cgroup "+c)
		os.Remove(c)
	}
	for _, p := range mountsUnder(e.dir) {
		out = append(out, "mount "+p)
		syscall.Unmount(p, syscall.MNT_DETACH)
	}
	return out
}

// mountsUnder lists the mount points below dir (a session's workspace
// left mounted), deepest first, as /proc/self/mountinfo has them.
func mountsUnder(dir string) []string {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil || dir == "" {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		// The mount point, with space, tab, newline and backslash
		// written as octal escapes.
		p := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(fields[4])
		if strings.HasPrefix(p, filepath.Clean(dir)+"/") {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// secretsInLogs names the API keys, token signing key and preview tokens
// that appear in the gateway's log (none may).
func (e *testEnv) secretsInLogs() []string {
	raw, err := os.ReadFile(e.gwLog)
	if err != nil {
		return []string{"gateway log unreadable: " + err.Error()}
	}
	var out []string
	check := func(name, secret string) {
		if secret != "" && bytes.Contains(raw, []byte(secret)) {
			out = append(out, name)
		}
	}
	check("tenant A's API key", e.keyA)
	check("tenant B's API key", e.keyB)
	check("tenant C's API key", e.keyC)
	check("the admin key", e.adminKey)
	check("the token signing key", e.tokenKey)
	check("the vault key", e.vaultKey)
	check("the test credentials' canary secret", e.canary)
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, tok := range e.tokens {
		// The signature alone identifies a token.
		check(fmt.Sprintf("preview token %d", i), tok[strings.LastIndex(tok, ".")+1:])
	}
	return out
}

func sessionNetNS() []string {
	entries, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), testNamespace+"-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// sessionCgroups are the cgroup directories of the test namespace's
// containers, in every hierarchy (cgroup v1 controllers and v2).
func sessionCgroups() []string {
	a, _ := filepath.Glob("/sys/fs/cgroup/*/" + testNamespace + "/*")
	b, _ := filepath.Glob("/sys/fs/cgroup/" + testNamespace + "/*")
	var out []string
	for _, p := range append(a, b...) {
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			out = append(out, filepath.Clean(p))
		}
	}
	return out
}

func bridgeVeths() []string {
	entries, _ := os.ReadDir("/sys/class/net/" + testBridge + "/brif")
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// needE2E skips a test outside `make test`.
func needE2E(t testing.TB) *testEnv {
	t.Helper()
	if env == nil {
		t.Skip("end-to-end: run with `make test`")
	}
	// A test that failed between stopping the gateway and starting it
	// again must not fail every test after it.
	if env.gw == nil || env.gw.Process.Signal(syscall.Signal(0)) != nil {
		t.Logf("the gateway is not running (a test before this one stopped it): starting it")
		if err := env.startGateway(); err != nil {
			t.Fatal(err)
		}
	}
	return env
}

// api calls the management API and returns the status and body.
func (e *testEnv) api(t testing.TB, key, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		r = bytes.NewReader(b)
	case string:
		r = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, e.gwURL+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	client := &http.Client{Timeout: 3 * time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

type sessionInfo struct {
	ID        string                      `json:"id"`
	Kind      string                      `json:"kind"`
	Runtime   string                      `json:"runtime"`
	State     string                      `json:"state"`
	CreatedAt time.Time                   `json:"created_at"`
	ExpiresAt time.Time                   `json:"expires_at"`
	Screen    struct{ Width, Height int } `json:"screen"`
	Labels    map[string]string           `json:"labels"`
	Failure   string                      `json:"failure"`
}

type previewInfo struct {
	ID        string    `json:"id"`
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
	Scope     string    `json:"scope"`
}

// createSession makes a running session for the test and deletes it when
// the test ends.
func (e *testEnv) createSession(t testing.TB, key string, req map[string]any) sessionInfo {
	t.Helper()
	if req == nil {
		req = map[string]any{}
	}
	if _, ok := req["labels"]; !ok {
		req["labels"] = map[string]string{"test": t.Name()}
	}
	status, body := e.api(t, key, "POST", "/v1/sessions", req)
	if status != 201 {
		t.Fatalf("create session: %d %s", status, body)
	}
	var s sessionInfo
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatal(err)
	}
	if s.State != "running" {
		t.Fatalf("session %s is %s, want running", s.ID, s.State)
	}
	t.Cleanup(func() { e.api(t, key, "DELETE", "/v1/sessions/"+s.ID, nil) })
	return s
}

func (e *testEnv) preview(t testing.TB, key, id string, ttl int) previewInfo {
	t.Helper()
	status, body := e.api(t, key, "POST", "/v1/sessions/"+id+"/previews", map[string]any{"scope": "cdp", "ttl_seconds": ttl})
	if status != 201 {
		t.Fatalf("preview: %d %s", status, body)
	}
	var p previewInfo
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	e.tokens = append(e.tokens, p.URL[strings.LastIndex(p.URL, "/")+1:])
	e.mu.Unlock()
	return p
}

// browserWS returns the gateway's CDP browser WebSocket URL of a preview.
func browserWS(t testing.TB, previewURL string) string {
	t.Helper()
	ws, err := browserWSErr(previewURL)
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

func browserWSErr(previewURL string) (string, error) {
	resp, err := http.Get(previewURL + "/json/version")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var v struct {
		WS string `json:"webSocketDebuggerUrl"`
	}
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("json/version: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return "", err
	}
	return v.WS, nil
}
