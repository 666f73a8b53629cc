package test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sessionCPU reads the CPU time a session's cgroup has used (v1 or v2).
// Under gVisor the sandbox (sentry, gofer and systrap stubs) runs in the
// container's cgroup, so its usage counts here too.
func sessionCPU(id string) (time.Duration, bool) {
	if raw, err := os.ReadFile("/sys/fs/cgroup/cpuacct/" + testNamespace + "/" + id + "/cpuacct.usage"); err == nil {
		n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		return time.Duration(n), err == nil
	}
	raw, err := os.ReadFile("/sys/fs/cgroup/" + testNamespace + "/" + id + "/cpu.stat")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			return time.Duration(n) * time.Microsecond, err == nil
		}
	}
	return 0, false
}

// sessionMemory reads the memory a session's cgroup holds, less the file
// cache the kernel may drop (usage - total_inactive_file, the working set
// as the kubelet counts it; cgroup v1 or v2). Under gVisor the sandbox's
// memory, the guest's included, is charged to this cgroup too.
func sessionMemory(id string) (int64, bool) {
	usage, stat := "/sys/fs/cgroup/memory/"+testNamespace+"/"+id+"/memory.usage_in_bytes", "total_inactive_file "
	if _, err := os.Stat(usage); err != nil {
		usage, stat = "/sys/fs/cgroup/"+testNamespace+"/"+id+"/memory.current", "inactive_file "
	}
	raw, err := os.ReadFile(usage)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		return 0, false
	}
	st, err := os.ReadFile(filepath.Join(filepath.Dir(usage), "memory.stat"))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(line, stat); ok {
			f, err := strconv.ParseInt(v, 10, 64)
			return n - f, err == nil
		}
	}
	return 0, false
}

// processCPU reads the user and system time of a host process.
func processCPU(pid int) (time.Duration, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name may hold spaces; the fields after it do not.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const ticks = 100 // USER_HZ
	return time.Duration(utime+stime) * time.Second / ticks, true
}

// BenchmarkIdleCPU: idle sessions, nobody watching, per runtime and kind:
// once their start has settled, the CPU each uses over a window, from its
// cgroup, and the gateway's own CPU over the same window.
func BenchmarkIdleCPU(b *testing.B) {
	e := needE2E(b)
	const perRuntime = 3
	const window = 20 * time.Second
	for _, rt := range []string{"runc", "gvisor"} {
		for _, kind := range []string{"browser", "desktop"} {
			b.Run(rt+"/"+kind, func(b *testing.B) {
				if !e.runtimeUsable(b, rt) {
					b.Skipf("%s is not usable here", rt)
				}
				var cores, gwCores, mem []float64
				for i := 0; i < b.N; i++ {
					var ids []string
					for j := 0; j < perRuntime; j++ {
						s := e.createSession(b, e.keyA, map[string]any{"runtime": rt, "kind": kind, "labels": map[string]string{"bench": "idle"}})
						ids = append(ids, s.ID)
					}
					total := func() time.Duration {
						var sum time.Duration
						for _, id := range ids {
							d, ok := sessionCPU(id)
							if !ok {
								b.Fatalf("no CPU accounting for session %s", id)
							}
							sum += d
						}
						return sum
					}
					// Settled: at least 30 s after the last start (a start still
					// busy on two shared cores would look steady too), then a 5 s
					// window used no less than 80% of the one before (start-up
					// work has died down), within 2 minutes.
					time.Sleep(30 * time.Second)
					prev := time.Duration(-1)
					for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
						u0 := total()
						time.Sleep(5 * time.Second)
						u := total() - u0
						if prev >= 0 && u*5 >= prev*4 {
							break
						}
						prev = u
					}
					u0 := total()
					g0, _ := processCPU(e.gw.Process.Pid)
					t0 := time.Now()
					time.Sleep(window)
					u := total() - u0
					g, _ := processCPU(e.gw.Process.Pid)
					took := time.Since(t0)
					cores = append(cores, float64(u)/float64(took)/perRuntime)
					for _, id := range ids {
						m, ok := sessionMemory(id)
						if !ok {
							b.Fatalf("no memory accounting for session %s", id)
						}
						mem = append(mem, float64(m)/(1<<20))
					}
					gwCores = append(gwCores, float64(g-g0)/float64(took))
					for _, id := range ids {
						e.api(b, e.keyA, "DELETE", "/v1/sessions/"+id, nil)
					}
				}
				b.ReportMetric(median(cores), "cores/session")
				b.ReportMetric(100*median(gwCores), "gateway-%core")
				b.ReportMetric(median(mem), "MB/session")
			})
		}
	}
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// BenchmarkIdleTwenty: twenty idle sessions on this machine at once, ten
// claimed from a warm pool and ten pooled behind them, nobody watching:
// the CPU all twenty use together, the gateway's own, and the memory of
// each. SANDGATE_IDLE20_RUNTIME picks the runtime (default runc);
// SANDGATE_POOL_FREEZE=1 freezes the pooled ten.
func BenchmarkIdleTwenty(b *testing.B) {
	e := needE2E(b)
	rt := os.Getenv("SANDGATE_IDLE20_RUNTIME")
	if rt == "" {
		rt = "runc"
	}
	if !e.runtimeUsable(b, rt) {
		b.Skipf("%s is not usable here", rt)
	}
	const claimed, pooled = 10, 10
	freeze := os.Getenv("SANDGATE_POOL_FREEZE") == "1"
	e.withGatewayConfig(b, func(cfg map[string]any) {
		cfg["pools"] = []map[string]any{{"runtime": rt, "size": pooled}}
		cfg["pool_limits"] = map[string]any{"freeze": freeze}
		for _, t := range cfg["tenants"].([]any) {
			if t := t.(map[string]any); t["name"] == "tenant-a" {
				t["max_sessions"] = claimed
			}
		}
	})
	b.Logf("runtime %s, %d claimed and %d pooled, pooled frozen: %v", rt, claimed, pooled, freeze)
	for i := 0; i < b.N; i++ {
		e.waitPools(b, 1)
		var ids []string
		for j := 0; j < claimed; j++ {
			s := e.createSession(b, e.keyA, map[string]any{"runtime": rt, "labels": map[string]string{"bench": "idle20"}})
			ids = append(ids, s.ID)
		}
		e.waitPools(b, 1)
		// Every container of the test namespace is one of the twenty.
		all := func() []string {
			dirs, _ := filepath.Glob("/sys/fs/cgroup/cpuacct/" + testNamespace + "/s-*")
			if len(dirs) == 0 {
				dirs, _ = filepath.Glob("/sys/fs/cgroup/" + testNamespace + "/s-*")
			}
			var out []string
			for _, d := range dirs {
				if _, ok := sessionMemory(filepath.Base(d)); ok {
					out = append(out, filepath.Base(d))
				}
			}
			return out
		}
		total := func(ids []string) time.Duration {
			var sum time.Duration
			for _, id := range ids {
				d, _ := sessionCPU(id)
				sum += d
			}
			return sum
		}
		// Settled as in BenchmarkIdleCPU.
		time.Sleep(30 * time.Second)
		live := all()
		prev := time.Duration(-1)
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
			u0 := total(live)
			time.Sleep(5 * time.Second)
			u := total(live) - u0
			if prev >= 0 && u*5 >= prev*4 {
				break
			}
			prev = u
		}
		live = all()
		var mem []float64
		var working int
		for _, id := range live {
			if m, _ := sessionMemory(id); m > 1<<20 {
				working++
				mem = append(mem, float64(m)/(1<<20))
			}
		}
		if working < claimed+pooled {
			b.Fatalf("%d sessions hold memory, want %d", working, claimed+pooled)
		}
		const window = 30 * time.Second
		u0 := total(live)
		g0, _ := processCPU(e.gw.Process.Pid)
		t0 := time.Now()
		time.Sleep(window)
		u := total(live) - u0
		g, _ := processCPU(e.gw.Process.Pid)
		took := time.Since(t0)
		b.ReportMetric(float64(u)/float64(took), "cores-all")
		b.ReportMetric(float64(u)/float64(took)/float64(working), "cores/session")
		b.ReportMetric(100*float64(g-g0)/float64(took), "gateway-%core")
		b.ReportMetric(median(mem), "MB/session")
		b.Logf("%d sessions with memory; MB each: %.0f", working, mem)
		for _, id := range ids {
			e.api(b, e.keyA, "DELETE", "/v1/sessions/"+id, nil)
		}
	}
}
