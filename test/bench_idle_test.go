package test

import (
	"fmt"
	"os"
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
				var cores, gwCores []float64
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
					gwCores = append(gwCores, float64(g-g0)/float64(took))
					for _, id := range ids {
						e.api(b, e.keyA, "DELETE", "/v1/sessions/"+id, nil)
					}
				}
				b.ReportMetric(median(cores), "cores/session")
				b.ReportMetric(100*median(gwCores), "gateway-%core")
			})
		}
	}
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}
