package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The warm pool's shape in the tests: one no other test asks for, under
// runc (the quickest to refill), so that the rest of the suite starts cold.
var poolShape = map[string]any{"runtime": "runc", "screen": map[string]int{"width": 1024, "height": 768}}

const poolSize = 2

type poolStats struct {
	Key       string `json:"key"`
	Size      int    `json:"size"`
	Available int    `json:"available"`
	Starting  int    `json:"starting"`
	Settling  int    `json:"settling"`
	Claims    int64  `json:"claims"`
	Misses    int64  `json:"misses"`
	Refills   int64  `json:"refills"`
}

func (e *testEnv) pools(t testing.TB) []poolStats {
	t.Helper()
	st, body := e.api(t, e.keyA, "GET", "/v1/pools", nil)
	var out struct{ Pools []poolStats }
	if st != 200 || json.Unmarshal(body, &out) != nil {
		t.Fatalf("GET /v1/pools: %d %s", st, body)
	}
	return out.Pools
}

// waitPool waits until the (only) pool has at least n sessions available.
func (e *testEnv) waitPool(t testing.TB, n int) poolStats {
	t.Helper()
	deadline := time.Now().Add(4 * time.Minute)
	for {
		ps := e.pools(t)
		if len(ps) != 1 {
			t.Fatalf("pools: %+v, want one", ps)
		}
		if ps[0].Available >= n {
			return ps[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not reach %d available: %+v", n, ps[0])
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// pooledContainers are the ids of the containers marked as pooled.
func (e *testEnv) pooledContainers(t testing.TB) map[string]bool {
	t.Helper()
	cs, err := e.client.Containers(e.ctx(), `labels."sandgate.pool"`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, c := range cs {
		if l, err := c.Labels(e.ctx()); err == nil && l["sandgate.pool"] != "" {
			out[c.ID()] = true
		}
	}
	return out
}

// taskCPU is the CPU time the cgroup of a session's task has used.
func (e *testEnv) taskCPU(t testing.TB, id string) (time.Duration, string) {
	t.Helper()
	c, err := e.client.LoadContainer(e.ctx(), id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(e.ctx(), nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := task.Status(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	return cgroupCPU(t, int(task.Pid())), string(st.Status)
}

// cgroupCPU reads the CPU time of the cgroup a process is in (cgroup v1
// cpuacct or v2 cpu.stat).
func cgroupCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if strings.Contains(","+parts[1]+",", ",cpuacct,") {
			for _, dir := range []string{"cpuacct", "cpu,cpuacct"} {
				if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", dir, parts[2], "cpuacct.usage")); err == nil {
					n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
					return time.Duration(n)
				}
			}
		}
		if parts[0] == "0" && parts[1] == "" {
			if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", parts[2], "cpu.stat")); err == nil {
				for _, l := range strings.Split(string(b), "\n") {
					if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
						n, _ := strconv.ParseInt(v, 10, 64)
						return time.Duration(n) * time.Microsecond
					}
				}
			}
		}
	}
	t.Fatalf("no CPU accounting for process %d: %s", pid, raw)
	return 0
}

// claim creates a session of the pool's shape with more fields and
// reports whether it came warm.
func (e *testEnv) claim(t *testing.T, key string, extra map[string]any) (sessionInfo, string, time.Duration) {
	t.Helper()
	req := map[string]any{}
	for k, v := range poolShape {
		req[k] = v
	}
	for k, v := range extra {
		req[k] = v
	}
	t0 := time.Now()
	st, body := e.api(t, key, "POST", "/v1/sessions", req)
	took := time.Since(t0)
	if st != 201 {
		t.Fatalf("create: %d %s", st, body)
	}
	var s sessionInfo
	json.Unmarshal(body, &s)
	t.Cleanup(func() {
		if t.Failed() {
			_, evs := e.api(t, key, "GET", "/v1/sessions/"+s.ID+"/events", nil)
			t.Logf("session %s's trail: %s", s.ID, evs)
		}
		e.api(t, key, "DELETE", "/v1/sessions/"+s.ID, nil)
	})
	start := jsonField(body, "start")
	if start == "warm" {
		warmClaims.Add(1)
	}
	return s, start, took
}

// warmClaims counts the warm starts the tests saw.
var warmClaims atomic.Int64

// TestWarmPool: a pool keeps sessions of its shape started; a create of
// that shape gets one at once, with everything that is per session
// applied at the claim as on the cold path and a fresh profile; the pool
// never holds more than its limit; a gateway killed with a full pool
// leaves nothing behind after its restart.
func TestWarmPool(t *testing.T) {
	e := needE2E(t)
	e.withGatewayConfig(t, func(cfg map[string]any) {
		cfg["pools"] = []map[string]any{{"runtime": "runc", "screen": poolShape["screen"], "size": poolSize}}
		// Frozen: every claim below goes through the thaw.
		cfg["pool_limits"] = map[string]any{"max_sessions": poolSize, "freeze": true}
	})
	// The limit is watched all along: pooled containers in containerd and
	// the pool's own count.
	var mu sync.Mutex
	maxPooled, maxLive, samples := 0, 0, 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			// Errors are skipped, not fatal: the gateway is down for a
			// while when the test restarts it.
			n := 0
			if cs, err := e.client.Containers(e.ctx(), `labels."sandgate.pool"`); err == nil {
				for _, c := range cs {
					if l, err := c.Labels(e.ctx()); err == nil && l["sandgate.pool"] != "" {
						n++
					}
				}
			}
			live := 0
			req, _ := http.NewRequest("GET", e.gwURL+"/v1/pools", nil)
			req.Header.Set("Authorization", "Bearer "+e.keyA)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				var out struct{ Pools []poolStats }
				json.NewDecoder(resp.Body).Decode(&out)
				resp.Body.Close()
				for _, p := range out.Pools {
					live += p.Available + p.Starting
				}
			}
			mu.Lock()
			maxPooled, maxLive, samples = max(maxPooled, n), max(maxLive, live), samples+1
			mu.Unlock()
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
		t.Logf("pool limit %d: at most %d pooled containers and %d pooled sessions in %d samples", poolSize, maxPooled, maxLive, samples)
		// Control: the sampler saw the pool at all.
		if maxPooled == 0 || samples < 10 {
			t.Errorf("the sampler saw no pooled container (%d samples)", samples)
		}
		if maxPooled > poolSize || maxLive > poolSize {
			t.Errorf("the pool went over its limit of %d: %d containers, %d sessions", poolSize, maxPooled, maxLive)
		}
	}()
	full := e.waitPool(t, poolSize)
	t.Logf("pool %s full: %+v", full.Key, full)

	t.Run("frozen-while-waiting", func(t *testing.T) {
		e.waitPool(t, poolSize)
		pooled := e.pooledContainers(t)
		// Frozen once settled, which takes at most a minute.
		deadline := time.Now().Add(2 * time.Minute)
		for id := range pooled {
			for {
				if _, st := e.taskCPU(t, id); st == "paused" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("pooled session %s was not frozen", id)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		// Control: a claimed session, thawed and idle, uses some CPU in
		// the same window; the frozen ones use none.
		s, start, _ := e.claim(t, e.keyA, nil)
		if start != "warm" {
			t.Fatalf("start %q", start)
		}
		if _, st := e.taskCPU(t, s.ID); st != "running" {
			t.Fatalf("the claimed session is %s", st)
		}
		var ids []string
		before := map[string]time.Duration{}
		for id := range e.pooledContainers(t) {
			if _, st := e.taskCPU(t, id); st == "paused" {
				ids = append(ids, id)
			}
		}
		ids = append(ids, s.ID)
		for _, id := range ids {
			before[id], _ = e.taskCPU(t, id)
		}
		const window = 5 * time.Second
		time.Sleep(window)
		for _, id := range ids {
			after, st := e.taskCPU(t, id)
			used := after - before[id]
			t.Logf("%s (%s): %v of CPU in %v, %.4f cores", id, st, used, window, used.Seconds()/window.Seconds())
			if id == s.ID && used <= 0 {
				t.Errorf("the claimed session used no CPU: the measure cannot tell")
			}
			if id != s.ID && used > 0 {
				t.Errorf("frozen pooled session %s used %v", id, used)
			}
		}
		if len(ids) < 2 {
			t.Errorf("no frozen pooled session was measured: %v", ids)
		}
	})

	t.Run("claim-applies-the-request", func(t *testing.T) {
		e.waitPool(t, 1)
		before := time.Now().UTC()
		s, start, took := e.claim(t, e.keyA, map[string]any{
			"ttl_seconds": 120, "record": true, "labels": map[string]string{"claim": "applied"},
			"egress": map[string]any{"allow": []string{"site.sandgate.test:443"}},
		})
		if start != "warm" || s.State != "running" {
			t.Fatalf("a request of the pool's shape: start %q, state %s", start, s.State)
		}
		t.Logf("claimed %s in %v", s.ID, took.Round(time.Millisecond))
		if s.ExpiresAt.Before(before.Add(119*time.Second)) || s.ExpiresAt.After(time.Now().Add(121*time.Second)) {
			t.Errorf("expires_at %v: the TTL does not count from the claim (%v)", s.ExpiresAt, before)
		}
		if s.Labels["claim"] != "applied" || s.Screen.Width != 1024 {
			t.Errorf("labels %v, screen %+v", s.Labels, s.Screen)
		}
		// Its audit trail is the claimant's, from the claim on.
		created := e.waitEvent(t, s.ID, "created", 5*time.Second)
		if created["start"] != "warm" {
			t.Errorf("created event: %v", created)
		}
		e.waitEvent(t, s.ID, "recording_started", 60*time.Second)
		// The allow list of the request holds: the named site answers,
		// another name does not.
		sh := func(script string) execOut {
			return e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"bash", "-c", script}, "timeout_seconds": 30})
		}
		if out := sh("curl -sS -k --max-time 10 https://site.sandgate.test/"); !strings.Contains(string(out.Stdout), "allowed site") {
			t.Errorf("an allowed site from a warm session: exit %d %q %q", out.ExitCode, out.Stdout, out.Stderr)
		}
		if out := sh("curl -sS -k --max-time 10 https://other.sandgate.test/"); out.ExitCode == 0 {
			t.Errorf("a site off the allow list answered a warm session: %q", out.Stdout)
		}
		// Another tenant does not see it.
		if st, _ := e.api(t, e.keyB, "GET", "/v1/sessions/"+s.ID, nil); st != 404 {
			t.Errorf("another tenant's GET: %d", st)
		}
		// A request too large to store is a 400 and costs the pool
		// nothing (it was a 503 after a warm session was thrown away).
		e.waitPool(t, 1)
		poolBefore := e.pools(t)[0]
		big := map[string]string{}
		for i := 0; i < 32; i++ {
			big[fmt.Sprintf("label-%02d-%s", i, strings.Repeat("k", 50))] = strings.Repeat("v", 250)
		}
		req := map[string]any{"labels": big}
		for k, v := range poolShape {
			req[k] = v
		}
		if st, body := e.api(t, e.keyA, "POST", "/v1/sessions", req); st != 400 || !strings.Contains(string(body), "too large") {
			t.Errorf("a request too large to store: %d %s", st, body)
		}
		if after := e.pools(t)[0]; after.Claims != poolBefore.Claims || after.Misses != poolBefore.Misses || after.Available < 1 {
			t.Errorf("the refused request touched the pool: %+v, then %+v", poolBefore, after)
		}
		// Control: a request of another shape starts cold.
		other, start2, _ := e.claim(t, e.keyA, map[string]any{"screen": map[string]int{"width": 1280, "height": 800}})
		if start2 != "cold" {
			t.Errorf("a request of another shape: start %q", start2)
		}
		e.api(t, e.keyA, "DELETE", "/v1/sessions/"+other.ID, nil)
	})

	t.Run("credential-binding", func(t *testing.T) {
		st, body := e.api(t, e.keyA, "POST", "/v1/credentials", map[string]any{"name": "pool basic", "kind": "basic", "username": basicUser, "secret": e.canary,
			"destinations": []map[string]any{{"scheme": "https", "host": "basic.sandgate.test"}}})
		if st != 201 {
			t.Fatalf("credential: %d %s", st, body)
		}
		cred := jsonField(body, "id")
		e.waitPool(t, 1)
		s, start, _ := e.claim(t, e.keyA, map[string]any{"credentials": []map[string]any{
			{"credential": cred, "scheme": "https", "host": "basic.sandgate.test"},
		}})
		if start != "warm" {
			t.Fatalf("start %q", start)
		}
		ctx := e.cdpContextKey(t, e.keyA, s.ID)
		if title, err := navigateTitle(ctx, "https://basic.sandgate.test/"); err != nil || title != "basic ok" {
			t.Errorf("the bound site from a warm session: %q, %v", title, err)
		}
		// Control: an unbound site behind a credential stays out of reach.
		if title, err := navigateTitle(ctx, "https://bearer.sandgate.test/"); err == nil && title == "bearer ok" {
			t.Errorf("an unbound site answered: %q", title)
		}
	})

	t.Run("fresh-profile", func(t *testing.T) {
		const page = "http://pages.sandgate.test/hello.html"
		state := func(ctx context.Context) (cookie, stored string) {
			t.Helper()
			if _, err := navigateTitle(ctx, page); err != nil {
				t.Fatal(err)
			}
			cookie, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.cookie`))
			if err != nil {
				t.Fatal(err)
			}
			stored, err = chromedp.Run(ctx, chromedp.Evaluate[string](`String(localStorage.getItem("pooltest"))`))
			if err != nil {
				t.Fatal(err)
			}
			return cookie, stored
		}
		e.waitPool(t, 1)
		first, start, _ := e.claim(t, e.keyA, nil)
		if start != "warm" {
			t.Fatalf("first claim: start %q", start)
		}
		ctx := e.cdpContextKey(t, e.keyA, first.ID)
		if _, err := navigateTitle(ctx, page); err != nil {
			t.Fatal(err)
		}
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.cookie = "pooltest=1; max-age=3600"; localStorage.setItem("pooltest", "1"); "set"`)); err != nil {
			t.Fatal(err)
		}
		// Control: the first claimant reads back what it set.
		if c, s := state(ctx); !strings.Contains(c, "pooltest=1") || s != "1" {
			t.Fatalf("the first claimant's own cookie %q and storage %q", c, s)
		}
		e.api(t, e.keyA, "DELETE", "/v1/sessions/"+first.ID, nil)
		// The next claimant, another tenant, starts with nothing.
		e.waitPool(t, 1)
		second, start, _ := e.claim(t, e.keyB, nil)
		if start != "warm" || second.ID == first.ID {
			t.Fatalf("second claim: start %q, id %s (first %s)", start, second.ID, first.ID)
		}
		if c, s := state(e.cdpContextKey(t, e.keyB, second.ID)); strings.Contains(c, "pooltest") || s != "null" {
			t.Errorf("the next claimant sees cookie %q and storage %q", c, s)
		}
	})

	t.Run("kept-profile-and-snapshot", func(t *testing.T) {
		// A warm claim with a profile: its browser starts again on the
		// profile before the session is handed out; its end saves it; the
		// next warm claim with it has what the first set. A warm claim
		// from a snapshot has the snapshot's files.
		const page = "http://pages.sandgate.test/hello.html"
		p := e.newProfile(t, e.keyA, "warm")
		e.waitPool(t, 1)
		first, start, _ := e.claim(t, e.keyA, map[string]any{"profile": map[string]any{"id": p.ID, "persist": true}})
		if start != "warm" {
			t.Fatalf("first claim: start %q", start)
		}
		ctx := e.cdpContextKey(t, e.keyA, first.ID)
		if _, err := navigateTitle(ctx, page); err != nil {
			t.Fatal(err)
		}
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.cookie = "warmkept=1; max-age=3600"; localStorage.setItem("warmkept", "1"); "set"`)); err != nil {
			t.Fatal(err)
		}
		if out := e.execIn(t, e.keyA, first.ID, map[string]any{"cmd": []string{"sh", "-c", "mkdir -p ~/workspace/w && echo warm > ~/workspace/w/f.txt"}}); out.ExitCode != 0 {
			t.Fatalf("write: %s", out.Stderr)
		}
		st, raw := e.api(t, e.keyA, "POST", "/v1/sessions/"+first.ID+"/snapshots", nil)
		if st != 201 {
			t.Fatalf("snapshot: %d %s", st, raw)
		}
		snap := jsonField(raw, "id")
		if _, ok := eventOf(e.stopSession(t, e.keyA, first.ID), "profile_saved"); !ok {
			t.Fatal("the warm session's profile was not saved")
		}
		e.waitPool(t, 1)
		second, start, _ := e.claim(t, e.keyA, map[string]any{"profile": map[string]any{"id": p.ID}, "snapshot": snap})
		if start != "warm" {
			t.Fatalf("second claim: start %q", start)
		}
		ctx2 := e.cdpContextKey(t, e.keyA, second.ID)
		if _, err := navigateTitle(ctx2, page); err != nil {
			t.Fatal(err)
		}
		c, err := chromedp.Run(ctx2, chromedp.Evaluate[string](`document.cookie + " " + localStorage.getItem("warmkept")`))
		if err != nil || !strings.Contains(c, "warmkept=1") || !strings.HasSuffix(c, " 1") {
			t.Errorf("the warm claim with the profile sees %q (%v)", c, err)
		}
		if out := e.execIn(t, e.keyA, second.ID, map[string]any{"cmd": []string{"cat", "/home/sandgate/workspace/w/f.txt"}}); string(out.Stdout) != "warm\n" {
			t.Errorf("the warm claim from the snapshot has %q %s", out.Stdout, out.Stderr)
		}
	})

	// Every claim above waited for an available session: the pool
	// counts each, and no miss.
	ps := e.pools(t)[0]
	t.Logf("pool after the claims: %+v", ps)
	if ps.Claims != warmClaims.Load() || ps.Misses != 0 {
		t.Errorf("claims %d, misses %d, want %d and 0", ps.Claims, ps.Misses, warmClaims.Load())
	}

	t.Run("restart-leaves-no-orphan", func(t *testing.T) {
		e.waitPool(t, poolSize)
		survivor, start, _ := e.claim(t, e.keyA, nil)
		if start != "warm" {
			t.Fatalf("start %q", start)
		}
		e.waitPool(t, poolSize)
		old := e.pooledContainers(t)
		if len(old) != poolSize || old[survivor.ID] {
			t.Fatalf("pooled containers before the kill: %v (claimed %s)", old, survivor.ID)
		}
		e.stopGateway(syscall.SIGKILL)
		if err := e.startGateway(); err != nil {
			t.Fatal(err)
		}
		// The claimed session is adopted, the pooled ones are removed...
		if st, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+survivor.ID, nil); st != 200 || jsonField(body, "state") != "running" {
			t.Errorf("the claimed session after the restart: %d %s", st, body)
		}
		for id := range old {
			if _, err := e.client.LoadContainer(e.ctx(), id); err == nil {
				t.Errorf("pooled container %s survived the restart", id)
			}
			if res := e.residue(t, id); len(res) > 0 {
				t.Errorf("pooled session %s left %v", id, res)
			}
		}
		// ...and the new gateway fills the pool again with its own.
		e.waitPool(t, poolSize)
		for id := range e.pooledContainers(t) {
			if old[id] {
				t.Errorf("pooled container %s of the killed gateway is handed out again", id)
			}
		}
		// A gateway that stops cleanly removes its pooled sessions
		// itself; the claimed one stays for the next to adopt.
		e.stopGateway(syscall.SIGTERM)
		if left := e.pooledContainers(t); len(left) != 0 {
			t.Errorf("pooled containers left after a clean stop: %v", left)
		}
		if _, err := e.client.LoadContainer(e.ctx(), survivor.ID); err != nil {
			t.Errorf("the claimed session's container went with the clean stop: %v", err)
		}
		if err := e.startGateway(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestWarmPoolDownloads: an unfrozen pool's browser has its download
// watcher from the moment it is ready (so a claim does not start one, and
// the claimant's first requests do not compete with it); a download in
// the claimed session is stored as the claimant's, and no one else's; and
// a pooled browser that goes unclaimed takes its watcher with it.
func TestWarmPoolDownloads(t *testing.T) {
	e := needE2E(t)
	e.withGatewayConfig(t, func(cfg map[string]any) {
		cfg["pools"] = []map[string]any{{"runtime": "runc", "screen": poolShape["screen"], "size": 1}}
		cfg["pool_limits"] = map[string]any{"max_sessions": 1, "freeze": false}
	})
	watchers := func() int { return int(e.metric(t, "sandgate_download_watchers")) }
	e.waitPool(t, 1)
	// The pooled browser's watcher, with no session of anyone's running.
	waitFor(t, 30*time.Second, "the pooled browser's download watcher", func() bool { return watchers() == 1 })

	// A pooled browser that dies unclaimed: its watcher stops with it
	// (the refill's new one starts seconds later, when it is ready).
	var dead string
	for id := range e.pooledContainers(t) {
		dead = id
	}
	c, err := e.client.LoadContainer(e.ctx(), dead)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(e.ctx(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Kill(e.ctx(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the dead pooled browser's watcher to stop", func() bool { return watchers() == 0 })
	e.waitPool(t, 1)
	waitFor(t, 60*time.Second, "the refilled browser's download watcher", func() bool { return watchers() == 1 })
	// The refilled browser counts as settling until its start's CPU use
	// has died down; then it is idle, as the pool's own measure says.
	settleFrom, sawSettling := time.Now(), false
	waitFor(t, 2*time.Minute, "the pooled browser to settle", func() bool {
		n := e.pools(t)[0].Settling
		sawSettling = sawSettling || n > 0
		return n == 0
	})
	t.Logf("pooled browser settled %v after the pool was full again (seen settling: %v)", time.Since(settleFrom).Round(100*time.Millisecond), sawSettling)
	for id := range e.pooledContainers(t) {
		before, _ := e.taskCPU(t, id)
		const window = 2 * time.Second
		time.Sleep(window)
		after, _ := e.taskCPU(t, id)
		cores := (after - before).Seconds() / window.Seconds()
		t.Logf("settled pooled browser %s: %.4f cores", id, cores)
		if after <= 0 {
			t.Errorf("no CPU use read for %s: the measure cannot tell", id)
		}
		if cores >= 0.2 {
			t.Errorf("settled pooled browser %s uses %.3f cores", id, cores)
		}
	}

	s, start, _ := e.claim(t, e.keyA, nil)
	if start != "warm" {
		t.Fatalf("a request of the pool's shape started %q", start)
	}
	t.Cleanup(func() { e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil) })
	// The claim reuses the pooled watcher: still one, until the refill's.
	if n := watchers(); n != 1 {
		t.Errorf("%d download watchers after the claim, want the pooled one only", n)
	}
	ctx, done := e.cdpPage(t, s.ID)
	pages := testPages(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(pages+"/download.html"), chromedp.Click(chromedp.CSS("#dl"))); err != nil {
		t.Fatal(err)
	}
	done()
	var dl *artifact
	waitFor(t, 30*time.Second, "the download as the claimant's artifact", func() bool {
		dl = findKind(e.artifacts(t, e.keyA, s.ID), "download", "")
		return dl != nil
	})
	if dl.SHA256 != sha(downloadBody) {
		t.Errorf("download artifact %+v, want sha256 %s", dl, sha(downloadBody))
	}
	if st, _ := e.api(t, e.keyB, "GET", "/v1/sessions/"+s.ID+"/artifacts", nil); st != 404 {
		t.Errorf("another tenant lists the claimed session's artifacts: %d", st)
	}

	// A claim answers before containerd has the claimant's labels; a
	// record in the session's host directory holds them meanwhile. Put
	// the session back in that state (labels of the pool, the record
	// written), kill the gateway, and the next one finishes the claim.
	record := filepath.Join(e.dir, "state", "sessions", s.ID, "claim.json")
	hc, err := e.client.LoadContainer(e.ctx(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	var labels map[string]string
	waitFor(t, 30*time.Second, "the claim in containerd and its record gone", func() bool {
		labels, err = hc.Labels(e.ctx())
		_, serr := os.Stat(record)
		return err == nil && labels["sandgate.pool"] == "" && os.IsNotExist(serr)
	})
	e.waitPool(t, 1)
	var poolKey string
	var pooled []string
	for id := range e.pooledContainers(t) {
		pc, err := e.client.LoadContainer(e.ctx(), id)
		if err != nil {
			t.Fatal(err)
		}
		l, err := pc.Labels(e.ctx())
		if err != nil {
			t.Fatal(err)
		}
		poolKey, pooled = l["sandgate.pool"], append(pooled, id)
	}
	if poolKey == "" {
		t.Fatal("no pooled container to take the pool's label from")
	}
	raw, _ := json.Marshal(labels)
	if err := os.WriteFile(record, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := hc.SetLabels(e.ctx(), map[string]string{"sandgate.pool": poolKey}); err != nil {
		t.Fatal(err)
	}
	e.stopGateway(syscall.SIGKILL)
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}
	if st, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID, nil); st != 200 || jsonField(body, "state") != "running" {
		t.Errorf("the half-stored claim after the restart: %d %s", st, body)
	}
	if l, err := hc.Labels(e.ctx()); err != nil || l["sandgate.pool"] != "" || l["sandgate.tenant"] != labels["sandgate.tenant"] {
		t.Errorf("the claim was not finished in containerd: %v %v", l, err)
	}
	if _, err := os.Stat(record); !os.IsNotExist(err) {
		t.Errorf("the claim record is still there: %v", err)
	}
	// Control: the pooled session of the killed gateway, with no record,
	// is removed, not adopted.
	for _, id := range pooled {
		if _, err := e.client.LoadContainer(e.ctx(), id); err == nil {
			t.Errorf("pooled container %s survived the restart", id)
		}
	}
}
