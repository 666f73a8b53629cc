package test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkGVisorFloor: what gVisor alone costs a browser's start here,
// with no Sandgate in the way. The host's own Xvfb and Chromium, with the
// session's flags, start natively and then inside a bare gVisor sandbox
// (`runsc do`, systrap, the host's root filesystem, host networking),
// in the same iteration. Each is timed until Chromium prints that DevTools
// listens, which comes before any CDP answer; the host run is also timed
// until CDP answers, the baseline of the cold-start goal (3x under
// gVisor). floor-ratio is the bare sandbox's listen time against that
// baseline: the least any gVisor session's cold start can measure here.
func BenchmarkGVisorFloor(b *testing.B) {
	needE2E(b)
	wrapper, err := filepath.EvalSymlinks(filepath.Join(cacheDir(), "runsc"))
	if err != nil {
		b.Skipf("no runsc here: %v", err)
	}
	runsc := filepath.Join(filepath.Dir(wrapper), "runsc") // the binary the wrapper runs
	dir := b.TempDir()
	script := filepath.Join(dir, "browser.sh")
	var quoted []string
	for _, f := range chromiumFlags(b) {
		quoted = append(quoted, "'"+strings.ReplaceAll(f, "'", `'\''`)+"'")
	}
	// $1: display, $2: CDP port, $3: profile directory.
	os.WriteFile(script, []byte(`#!/bin/sh
rm -f /tmp/.X$1-lock /tmp/.X11-unix/X$1
Xvfb :$1 -screen 0 1280x800x24 -nolisten tcp &
while [ ! -e /tmp/.X11-unix/X$1 ]; do sleep 0.005; done
DISPLAY=:$1 exec /usr/lib/chromium/chromium `+strings.Join(quoted, " ")+` --remote-debugging-port=$2 --user-data-dir=$3 about:blank
`), 0o755)

	// start runs the script, natively or in a bare sandbox, until
	// DevTools listens (and, natively, until CDP answers), and stops it.
	start := func(sandboxed bool, display int) (listen, answer time.Duration) {
		b.Helper()
		port, _ := freePort()
		profile, _ := os.MkdirTemp(dir, "profile")
		args := []string{script, fmt.Sprint(display), fmt.Sprint(port), profile}
		if sandboxed {
			root, _ := os.MkdirTemp(dir, "runsc")
			args = append([]string{"--root=" + root, "--platform=systrap", "--network=host", "--ignore-cgroups", "do"}, args...)
		}
		name := args[0]
		if sandboxed {
			name = runsc
		} else {
			args = args[1:]
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		stderr, _ := cmd.StderrPipe()
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() {
			// runsc do ends its sandbox on SIGTERM; the group's kill is
			// for what is left after 10 s.
			syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-done
			}
		}()
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "DevTools listening on") {
				listen = time.Since(t0)
				break
			}
		}
		if listen == 0 {
			b.Fatalf("chromium (sandboxed %v) never listened: %v", sandboxed, sc.Err())
		}
		go func() {
			for sc.Scan() {
			}
		}()
		if !sandboxed {
			if err := waitJSONVersion(fmt.Sprintf("http://127.0.0.1:%d/json/version", port), time.Minute); err != nil {
				b.Fatal(err)
			}
			answer = time.Since(t0)
		}
		return listen, answer
	}
	// Once each, untimed: the first reads of the host's files through
	// the sandbox's gofer took 47 s and more here.
	start(false, 70)
	start(true, 71)
	var hostListen, hostAnswer, floor []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l, a := start(false, 72+i%4)
		hostListen, hostAnswer = append(hostListen, l), append(hostAnswer, a)
		l, _ = start(true, 76+i%4)
		floor = append(floor, l)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(percentile(hostListen, 0.5)), "host-listen-p50-ms")
	b.ReportMetric(ms(percentile(hostAnswer, 0.5)), "host-answer-p50-ms")
	b.ReportMetric(ms(percentile(floor, 0.5)), "gvisor-listen-p50-ms")
	b.ReportMetric(float64(percentile(floor, 0.5))/float64(percentile(hostAnswer, 0.5)), "floor-ratio")
}
