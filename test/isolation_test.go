package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// usableRuntimes lists the handlers the gateway can run here; the others
// are reported with the gateway's reason.
func (e *testEnv) usableRuntimes(t *testing.T) []string {
	t.Helper()
	_, body := e.api(t, e.keyA, "GET", "/v1/runtimes", nil)
	var rts struct {
		Runtimes []struct {
			Name, Reason string
			Usable       bool
		}
	}
	json.Unmarshal(body, &rts)
	var out []string
	for _, rt := range rts.Runtimes {
		if rt.Usable {
			out = append(out, rt.Name)
		} else {
			t.Logf("%s was not tested: %s", rt.Name, rt.Reason)
		}
	}
	return out
}

// TestIsolation tries to break out of a session, under every usable
// runtime handler, and to starve the gateway and a neighbour session.
func TestIsolation(t *testing.T) {
	e := needE2E(t)
	for _, rt := range e.usableRuntimes(t) {
		t.Run(rt, func(t *testing.T) {
			s := e.createSession(t, e.keyA, map[string]any{"runtime": rt, "resources": map[string]any{"memory_mb": 2048, "pids": 256}})
			neighbour := e.createSession(t, e.keyA, map[string]any{"runtime": rt})
			e.api(t, e.keyA, "PUT", "/v1/sessions/"+neighbour.ID+"/files?path=/home/sandgate/workspace/neighbour-canary-file", "secret of the neighbour")
			sh := func(script string, timeout int) execOut {
				return e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"bash", "-c", script}, "timeout_seconds": timeout})
			}
			healthy := func(what string) {
				t.Helper()
				resp, err := http.Get(e.gwURL + "/healthz")
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("after %s the gateway is unwell: %v", what, err)
				}
				resp.Body.Close()
				if out := e.execIn(t, e.keyA, neighbour.ID, map[string]any{"cmd": []string{"echo", "fine"}}); string(out.Stdout) != "fine\n" {
					t.Fatalf("after %s the neighbour session is unwell: %q", what, out.Stdout)
				}
			}

			t.Run("escape-attempts", func(t *testing.T) {
				gwPort := e.gwAddr[strings.LastIndex(e.gwAddr, ":")+1:]
				for name, script := range map[string]string{
					"mount":                "mount -t tmpfs none /mnt",
					"kernel-module":        `perl -e 'my $p = ""; syscall(175, 0, 0, $p); exit($!{EPERM} || $!{ENOSYS} ? 1 : 0)'`,
					"write-proc-sys":       "echo 1 > /proc/sys/vm/drop_caches",
					"read-shadow":          "cat /etc/shadow",
					"write-rootfs":         "touch /usr/bin/planted",
					"raw-socket":           `perl -MSocket -e 'socket(my $s, PF_INET, SOCK_RAW, 1) or exit 1; exit 0'`,
					"unshare-write-rootfs": "unshare -r touch /usr/bin/planted",
					"ptrace-gateway":       fmt.Sprintf(`perl -e 'exit(syscall(101, 16, %d, 0, 0) == -1 ? 1 : 0)'`, e.gw.Process.Pid),
					"containerd-sock":      "test -e /run/containerd/containerd.sock",
					"gateway-port":         fmt.Sprintf(`perl -MIO::Socket::INET -e 'IO::Socket::INET->new(PeerAddr => "%s:%s", Timeout => 3) or exit 1; exit 0'`, bridgeIP, gwPort),
					"neighbour-files":      "find / -xdev -name neighbour-canary-file 2>/dev/null | grep -q . || find /home /tmp -name neighbour-canary-file 2>/dev/null | grep -q .",
					"host-processes":       "ps -e | grep -q -E 'containerd|sandgate serve|minio'",
					"setuid-to-root":       "su -c true root </dev/null",
				} {
					out := sh(script, 60)
					t.Logf("%s: exit %d stdout %q stderr %q records %d", name, out.ExitCode, out.Stdout, out.Stderr, len(out.Records))
					if out.ExitCode == 0 {
						t.Errorf("%s succeeded inside the session: %q %q", name, out.Stdout, out.Stderr)
					}
				}
				// User namespaces: refused by the container's seccomp
				// profile under every runtime (gVisor applies it inside the
				// sandbox too: --oci-seccomp). The positive control is in
				// TestSeccompEveryRuntime, which runs the same probe on the
				// host.
				if out := sh("unshare -r true", 30); out.ExitCode == 0 {
					t.Errorf("unshare -r succeeded under %s", rt)
				}
				if rt == "gvisor" {
					// dmesg (syslog(2)) is refused by the seccomp profile
					// now, as under runc; uname is enough to tell.
					out := sh("uname -r", 30)
					if !strings.Contains(string(out.Stdout), "gvisor") {
						t.Errorf("under gVisor, uname -r should show gVisor's kernel: %q", out.Stdout)
					}
				}
			})

			t.Run("disk-fill", func(t *testing.T) {
				out := sh("dd if=/dev/zero of=/home/sandgate/workspace/fill bs=1M count=3000 2>&1; stat -c %s /home/sandgate/workspace/fill; rm -f /home/sandgate/workspace/fill", 120)
				if !strings.Contains(string(out.Stdout), "No space left") {
					t.Fatalf("filling the workspace did not stop at its limit: %s", out.Stdout)
				}
				healthy("filling the disk")
			})

			t.Run("fork-bomb", func(t *testing.T) {
				start := time.Now()
				out := sh(`f() { f | f & }; f; sleep 5`, 15)
				t.Logf("fork bomb ended after %v, exit %d, timed out %v", time.Since(start).Round(time.Second), out.ExitCode, out.TimedOut)
				healthy("a fork bomb")
				// The bomb is gone and the session takes commands again, or
				// the session ended and says so (gVisor's kernel cannot
				// start threads at the pids limit and stops).
				deadline := time.Now().Add(30 * time.Second)
				for {
					if st, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID, nil); st == 200 && jsonField(body, "state") == "failed" {
						if jsonField(body, "failure") == "" {
							t.Fatalf("the session failed without saying why: %s", body)
						}
						t.Logf("the fork bomb ended the session, which says: %s", jsonField(body, "failure"))
						return
					}
					st, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"cmd": []string{"echo", "back"}, "timeout_seconds": 10})
					if st == 200 && strings.Contains(string(body), `"data":"YmFjawo="`) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the session did not recover from the fork bomb: %d %s", st, body)
					}
					time.Sleep(time.Second)
				}
			})

			t.Run("memory-hog", func(t *testing.T) {
				// A session of its own: under gVisor the fork bomb above
				// ends the first one.
				hog := e.createSession(t, e.keyA, map[string]any{"runtime": rt, "resources": map[string]any{"memory_mb": 2048}})
				out := e.execIn(t, e.keyA, hog.ID, map[string]any{"cmd": []string{"perl", "-e", `$x = "a" x (3 * 1024**3); print "survived\n"`}, "timeout_seconds": 120})
				if out.ExitCode == 0 || strings.Contains(string(out.Stdout), "survived") {
					t.Fatalf("a 3 GiB allocation in a 2 GiB session succeeded")
				}
				healthy("a memory hog")
				// Either the hog alone died and the session works, or the
				// session died and says so (within the health probe's
				// reach); never a dead session that claims to run.
				deadline := time.Now().Add(60 * time.Second)
				for {
					_, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+hog.ID, nil)
					state := jsonField(body, "state")
					if state == "failed" {
						if jsonField(body, "failure") == "" {
							t.Fatalf("the session failed without saying why: %s", body)
						}
						t.Logf("after the memory hog (exit %d) the session failed: %s", out.ExitCode, jsonField(body, "failure"))
						break
					}
					if state == "stopping" && time.Now().Before(deadline) {
						// On its way to failed: teardown runs apart.
						time.Sleep(time.Second)
						continue
					}
					if state != "running" {
						t.Fatalf("after the memory hog the session is %s", state)
					}
					st, eb := e.api(t, e.keyA, "POST", "/v1/sessions/"+hog.ID+"/exec", map[string]any{"cmd": []string{"echo", "back"}, "timeout_seconds": 5})
					if st == 200 && strings.Contains(string(eb), `"data":"YmFjawo="`) {
						t.Logf("after the memory hog (exit %d) the session runs and answers", out.ExitCode)
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("after the memory hog the session says running but does not answer: %d %s", st, eb)
					}
					time.Sleep(time.Second)
				}
			})
		})
	}
}
