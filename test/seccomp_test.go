package test

import (
	"context"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
)

// sysProbe is a bash command that makes one raw system call with perl
// (perl-base is in every Debian image) and prints "ok" or the errno
// number. A call that forks returns 0 in the child, which exits at once.
// Strings go in variables: perl hands syscall() no read-only strings.
func sysProbe(call string) string {
	return `perl -e 'my $pid = syscall(39); my $r = ` + call + `; syscall(231, 0) if syscall(39) != $pid; ` +
		`if ($r == -1) { print 0+$!; exit 1 } print "ok"; exit 0'`
}

// seccompProbe is one thing a session must not be able to do, and how
// every runtime handler must refuse it.
type seccompProbe struct {
	name   string
	script string // bash
	// refusal is what the output must hold: an errno number for a
	// sysProbe, text for a command.
	refusal string
	// onHost: the same probe succeeds on the host as an unprivileged
	// user, so the probe itself works where nothing blocks it.
	onHost bool
}

const (
	ePERM  = "1"  // what the seccomp profile answers
	eNOSYS = "38" // what it answers for clone3, so glibc falls back to clone
	// x86-64 flags and numbers the probes use.
	cloneNewUser = "0x10000000"
	sigchld      = "17"
)

// The probes. Each raw call goes through perl's syscall() with x86-64
// numbers: unshare 272, clone 56, clone3 435, mount 165, add_key 248,
// keyctl 250, bpf 321, ptrace 101.
var seccompProbes = []seccompProbe{
	{name: "unshare-r", script: "unshare -r true", refusal: "Operation not permitted", onHost: true},
	{name: "unshare-U", script: "unshare -U true", refusal: "Operation not permitted", onHost: true},
	{name: "unshare-r-mount", script: "unshare -rm mount -t tmpfs none /mnt", refusal: "Operation not permitted", onHost: true},
	{name: "unshare-syscall", script: sysProbe("syscall(272, " + cloneNewUser + ")"), refusal: ePERM, onHost: true},
	{name: "clone-newuser", script: sysProbe("syscall(56, " + cloneNewUser + "|" + sigchld + ", 0, 0, 0, 0)"), refusal: ePERM, onHost: true},
	// struct clone_args, version 0: flags, pidfd, child_tid, parent_tid,
	// exit_signal, stack, stack_size, tls.
	{name: "clone3-newuser", script: sysProbe(`syscall(435, my $args = pack("Q8", ` + cloneNewUser + `, 0, 0, 0, ` + sigchld + `, 0, 0, 0), 64)`), refusal: eNOSYS, onHost: true},
	{name: "mount", script: sysProbe(`syscall(165, my $src = "none", my $dst = "/mnt", my $fs = "tmpfs", 0, 0)`), refusal: ePERM},
	{name: "add_key", script: sysProbe(`syscall(248, my $type = "user", my $desc = "sandgate-probe", my $payload = "x", 1, -2)`), refusal: ePERM, onHost: true},
	{name: "keyctl", script: sysProbe("syscall(250, 0, -4, 1)"), refusal: ePERM, onHost: true},
	{name: "bpf", script: sysProbe(`syscall(321, 0, my $attr = "\0" x 72, 72)`), refusal: ePERM},
	{name: "ptrace-traceme", script: sysProbe("syscall(101, 0, 0, 0, 0)"), refusal: ePERM, onHost: true},
}

// allowedProbes must succeed in a session: the probe mechanism works, and
// plain clone (glibc's fallback from clone3) is allowed.
var allowedProbes = []seccompProbe{
	{name: "getpid", script: sysProbe("syscall(39)")},
	{name: "clone", script: sysProbe("syscall(56, " + sigchld + ", 0, 0, 0, 0)")},
	{name: "echo", script: "echo ok"},
}

// probeOutcome reduces a probe's output to what it says: "ok", an errno
// number, or the command's error text.
func probeOutcome(exit int, stdout, stderr []byte) string {
	if exit == 0 {
		return "ok"
	}
	return strings.TrimSpace(string(stdout) + " " + string(stderr))
}

// TestSeccompEveryRuntime makes the calls containerd's seccomp profile
// refuses, from inside a session under every usable runtime handler, and
// wants the same refusal everywhere. gVisor implements user namespaces,
// keyrings and ptrace in its own kernel; only the profile, installed there
// by runsc's --oci-seccomp, refuses them. The same probes run on the host
// as an unprivileged user first and succeed there.
func TestSeccompEveryRuntime(t *testing.T) {
	e := needE2E(t)
	if runtime.GOARCH != "amd64" {
		t.Skip("the probes use x86-64 system call numbers")
	}
	rts := e.usableRuntimes(t)
	for _, want := range []string{"runc", "gvisor"} {
		if !slices.Contains(rts, want) {
			t.Errorf("%s is not usable on this host, but deploy/setup.sh provides it", want)
		}
	}

	t.Run("host", func(t *testing.T) {
		for _, p := range seccompProbes {
			if !p.onHost {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			cmd := exec.CommandContext(ctx, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", "-c", p.script)
			cmd.Dir = "/"
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			cancel()
			exit := 0
			if err != nil {
				exit = -1
			}
			got := probeOutcome(exit, []byte(stdout.String()), []byte(stderr.String()))
			t.Logf("host %s: %s", p.name, got)
			if got != "ok" {
				t.Errorf("%s fails on the host as an unprivileged user too (%s): the probe proves nothing", p.name, got)
			}
		}
	})

	for _, rt := range rts {
		t.Run(rt, func(t *testing.T) {
			s := e.createSession(t, e.keyA, map[string]any{"runtime": rt})
			run := func(p seccompProbe) string {
				out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"bash", "-c", p.script}, "timeout_seconds": 30})
				got := probeOutcome(out.ExitCode, out.Stdout, out.Stderr)
				t.Logf("%s %s: exit %d: %s", rt, p.name, out.ExitCode, got)
				return got
			}
			for _, p := range allowedProbes {
				if got := run(p); got != "ok" {
					t.Errorf("%s failed under %s (%s): the probes below prove nothing", p.name, rt, got)
				}
			}
			for _, p := range seccompProbes {
				got := run(p)
				switch {
				case got == "ok":
					t.Errorf("%s succeeded under %s", p.name, rt)
				case isErrno(p.refusal) && got != p.refusal:
					t.Errorf("%s under %s: errno %s, want %s (the profile's answer)", p.name, rt, got, p.refusal)
				case !isErrno(p.refusal) && !strings.Contains(got, p.refusal):
					t.Errorf("%s under %s: %q, want %q", p.name, rt, got, p.refusal)
				}
			}

			// Chromium starts threads with clone3, and falls back to clone
			// only on ENOSYS: it must still open a page (a new renderer
			// process and its threads) under the profile.
			pv := e.preview(t, e.keyA, s.ID, 120)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			actx, cancelA := remote.NewAllocator(ctx, browserWS(t, pv.URL))
			defer cancelA()
			cctx, cancelC := chromedp.NewContext(actx)
			defer cancelC()
			if err := chromedp.Do(cctx, chromedp.Navigate("data:text/html,<title>seccomp%20"+rt+"</title>")); err != nil {
				t.Fatalf("Chromium under %s with the profile: %v", rt, err)
			}
			title, err := chromedp.Run(cctx, chromedp.Title())
			if err != nil {
				t.Fatalf("Chromium under %s with the profile: %v", rt, err)
			}
			if title != "seccomp "+rt {
				t.Errorf("Chromium under %s: title %q", rt, title)
			}
		})
	}
}

func isErrno(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}
