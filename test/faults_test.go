package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// restartContainerd kills containerd as a crash would (SIGKILL: its
// shims, and so the sessions' tasks, live on) and starts it again the
// way deploy/setup.sh did.
func restartContainerd(t *testing.T, down time.Duration) {
	t.Helper()
	if exec.Command("systemctl", "is-system-running").Run() == nil {
		if out, err := exec.Command("systemctl", "kill", "-s", "KILL", "containerd").CombinedOutput(); err != nil {
			t.Fatalf("systemctl kill containerd: %v %s", err, out)
		}
		time.Sleep(down)
		if out, err := exec.Command("systemctl", "start", "containerd").CombinedOutput(); err != nil {
			t.Fatalf("systemctl start containerd: %v %s", err, out)
		}
	} else {
		// The host's containerd, not the trial cluster's (cluster.sh runs
		// its own, with a config of its own), whichever pid is lower.
		out, _ := exec.Command("pgrep", "-x", "containerd").Output()
		pid := 0
		var argv []string
		for _, f := range strings.Fields(string(out)) {
			p, err := strconv.Atoi(f)
			raw, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
			if err != nil || rerr != nil || strings.Contains(string(raw), "sandgate-kube") {
				continue
			}
			pid, argv = p, strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
			break
		}
		if pid == 0 {
			t.Fatalf("no host containerd to restart (pgrep: %q)", out)
		}
		syscall.Kill(pid, syscall.SIGKILL)
		for deadline := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("containerd did not die")
			}
		}
		time.Sleep(down)
		logf, _ := os.OpenFile("/var/log/sandgate/containerd.log", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start containerd: %v", err)
		}
		go cmd.Wait()
		if logf != nil {
			logf.Close()
		}
	}
	for deadline := time.Now().Add(2 * time.Minute); exec.Command("ctr", "version").Run() != nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("containerd did not answer within 2 minutes of its restart")
		}
	}
}

// TestContainerdRestart: containerd dies and comes back while sessions
// run. The sessions stay running (their tasks live on under their shims),
// an open CDP connection keeps working, exec works again once containerd
// answers, a session deleted afterwards leaves nothing behind, and the
// trail records the reconnection.
func TestContainerdRestart(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	c := wsDial(t, browserWS(t, e.preview(t, e.keyA, s.ID, 600).URL))
	defer c.Close()
	cdpPing(t, c, 1)
	if out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"echo", "before"}}); string(out.Stdout) != "before\n" {
		t.Fatalf("exec before: %+v", out)
	}

	restartContainerd(t, 2*time.Second)
	// The gateway takes its waits up again within seconds; the session
	// must not have been failed meanwhile.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, raw := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID+"/events", nil)
		if bytes.Contains(raw, []byte("containerd_reconnected")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no containerd_reconnected event within 2 minutes: %s", raw)
		}
		time.Sleep(200 * time.Millisecond)
	}
	status, raw := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID, nil)
	var got sessionInfo
	json.Unmarshal(raw, &got)
	if status != 200 || got.State != "running" {
		t.Fatalf("after the containerd restart: %d %s", status, raw)
	}
	cdpPing(t, c, 2)
	if out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"echo", "after"}}); string(out.Stdout) != "after\n" {
		t.Fatalf("exec after: %+v", out)
	}
	// A new session starts, and a deleted one goes whole.
	s2 := e.createSession(t, e.keyA, nil)
	if st, body := e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != 200 {
		t.Fatalf("delete: %d %s", st, body)
	}
	if _, err := e.client.LoadContainer(e.ctx(), s.ID); err == nil {
		t.Fatal("the deleted session's container is still there")
	}
	e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s2.ID, nil)
}

// TestDiskNearlyFull: the gateway's state directory on a small tmpfs that
// the test fills until less is free than a create needs. A create is
// refused with 503 and says why, /readyz says so, a running session goes
// on, an admin change still takes effect and is written (its file was
// never corrupted), and once space is freed creates work again.
func TestDiskNearlyFull(t *testing.T) {
	e := needE2E(t)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=96m,mode=0700", "sandgate-disktest", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	e.withGatewayConfig(t, func(c map[string]any) {
		c["state_dir"] = dir
		c["capacity"] = map[string]any{"min_free_disk_mb": 48}
	})
	// The control: 96 MB free of 96, more than the 48 a create needs.
	s := e.createSession(t, e.keyA, map[string]any{"runtime": "runc"})
	held := e.usage(t, e.keyA).Sessions
	if st, body := e.api(t, "", "GET", "/readyz", nil); st != 200 {
		t.Fatalf("readyz with room: %d %s", st, body)
	}
	// Fill the disk until 30 MB are free.
	var st syscall.Statfs_t
	syscall.Statfs(dir, &st)
	free := int64(st.Bavail) * st.Bsize
	fill := filepath.Join(dir, "fill")
	if out, err := exec.Command("fallocate", "-l", strconv.FormatInt(free-30<<20, 10), fill).CombinedOutput(); err != nil {
		t.Fatalf("fill the disk: %v %s", err, out)
	}
	st2, _, body := e.rawCreate(t, e.keyA, map[string]any{})
	if st2 != 503 || !bytes.Contains(body, []byte("disk is nearly full")) || !bytes.Contains(body, []byte(dir)) {
		t.Fatalf("a create on a nearly full disk: %d %s", st2, body)
	}
	if st, body := e.api(t, "", "GET", "/readyz", nil); st != 503 || !bytes.Contains(body, []byte("disk")) {
		t.Fatalf("readyz on a nearly full disk: %d %s", st, body)
	}
	if out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"echo", "still here"}}); string(out.Stdout) != "still here\n" {
		t.Fatalf("the running session: %+v", out)
	}
	if u := e.usage(t, e.keyA); u.Sessions != held {
		t.Fatalf("the refused create holds something: %+v", u)
	}
	// The registry's file, written on the nearly full disk, stays whole.
	var k adminKey
	e.admin(t, "POST", "/tenants/tenant-b/keys", map[string]any{"name": "disk"}, 201, &k)
	raw, err := os.ReadFile(filepath.Join(dir, "tenants.json"))
	if err != nil || !json.Valid(raw) || !bytes.Contains(raw, []byte(k.ID)) {
		t.Fatalf("tenants.json on a nearly full disk: %v %.200s", err, raw)
	}
	e.admin(t, "DELETE", "/tenants/tenant-b/keys/"+k.ID, nil, 204, nil)

	os.Remove(fill)
	s2 := e.createSession(t, e.keyA, map[string]any{"runtime": "runc"})
	e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s2.ID, nil)
	e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil)
}

// TestBrowserCrash: Chromium killed inside a session. The open CDP
// connection closes; the exit is in the audit trail (live and, after the
// session, stored) and in /metrics; the session stays running and the
// same preview reaches the new browser the session starts. The control
// for "a browser exited" is that a page closing is not one.
func TestBrowserCrash(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	p := e.preview(t, e.keyA, s.ID, 600)
	before := browserWS(t, p.URL)
	exits := e.metric(t, "sandgate_browser_exits_total")

	// A page target's connection closing: no exit.
	c := wsDial(t, before)
	cdpPing(t, c, 1)
	c.WriteJSON(map[string]any{"id": 2, "method": "Target.createTarget", "params": map[string]any{"url": "about:blank"}})
	var created struct {
		ID     int
		Result struct{ TargetID string }
	}
	for c.ReadJSON(&created) == nil && created.ID != 2 {
	}
	if created.Result.TargetID == "" {
		t.Fatal("Target.createTarget gave no target id")
	}
	page := wsDial(t, before[:strings.LastIndex(before, "/devtools/")]+"/devtools/page/"+created.Result.TargetID)
	defer page.Close()
	c.WriteJSON(map[string]any{"id": 3, "method": "Target.closeTarget", "params": map[string]any{"targetId": created.Result.TargetID}})
	if _, ok := closedAt(page, 30*time.Second); !ok {
		t.Fatal("the page's connection stayed open after its target closed")
	}
	cdpPing(t, c, 4)
	time.Sleep(2 * time.Second) // the check after a browser-side close takes a round trip
	if _, raw := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID+"/events", nil); bytes.Contains(raw, []byte("browser_exited")) {
		t.Fatalf("a page closing was taken for the browser exiting: %s", raw)
	}

	out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"sh", "-c", "pkill -KILL -o -x chromium && echo killed"}})
	if string(out.Stdout) != "killed\n" {
		t.Fatalf("kill chromium: %+v", out)
	}
	if _, ok := closedAt(c, 30*time.Second); !ok {
		t.Fatal("the CDP connection stayed open after Chromium was killed")
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, raw := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID+"/events", nil)
		if n := bytes.Count(raw, []byte(`"browser_exited"`)); n == 1 {
			break
		} else if n > 1 {
			t.Fatalf("the exit was recorded %d times: %s", n, raw)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no browser_exited event within a minute: %s", raw)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := e.metric(t, "sandgate_browser_exits_total"); got != exits+1 {
		t.Fatalf("sandgate_browser_exits_total %v, want %v", got, exits+1)
	}
	var after string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		if ws, err := browserWSErr(p.URL); err == nil && ws != before {
			after = ws
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no new browser behind the preview within 2 minutes")
		}
	}
	c2 := wsDial(t, after)
	cdpPing(t, c2, 1)
	c2.Close()
	if st, raw := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID, nil); st != 200 || !bytes.Contains(raw, []byte(`"state":"running"`)) {
		t.Fatalf("the session after its browser exited: %d %s", st, raw)
	}

	// The trail with the exit is kept with the session's artifacts.
	e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		if a := findKind(e.artifacts(t, e.keyA, s.ID), "log", ""); a != nil {
			if body := e.fetchArtifact(t, e.keyA, a.ID); !bytes.Contains(body, []byte("browser_exited")) {
				t.Fatalf("the stored trail lacks browser_exited:\n%s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no stored trail within 2 minutes")
		}
	}
}
