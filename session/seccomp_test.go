package session

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	"github.com/containerd/containerd/contrib/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// sessionProfile is containerd's default profile for a process without
// capabilities, as sessions run, adjusted for the runtime.
func sessionProfile(runtime string) *specs.LinuxSeccomp {
	s := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}, Linux: &specs.Linux{}}
	p := seccomp.DefaultProfile(s)
	if runtime != "" {
		sessionSeccomp(p, runtime)
	}
	return p
}

// rulesFor lists the rules that name a syscall.
func rulesFor(p *specs.LinuxSeccomp, name string) []specs.LinuxSyscall {
	var out []specs.LinuxSyscall
	for _, r := range p.Syscalls {
		if slices.Contains(r.Names, name) {
			out = append(out, r)
		}
	}
	return out
}

func TestSessionSeccomp(t *testing.T) {
	// Control: containerd's profile allows ptrace (kernels from 4.8) and
	// answers clone3 with ENOSYS through errnoRet, which runsc ignores.
	base := sessionProfile("")
	if rs := rulesFor(base, "ptrace"); len(rs) == 0 || rs[0].Action != specs.ActAllow {
		t.Fatalf("containerd's default profile no longer allows ptrace (%v): revisit withSessionSeccomp", rs)
	}
	if rs := rulesFor(base, "clone3"); len(rs) != 1 || rs[0].Action != specs.ActErrno || rs[0].ErrnoRet == nil || *rs[0].ErrnoRet != uint(unix.ENOSYS) {
		t.Fatalf("containerd's clone3 rule changed (%+v): revisit withSessionSeccomp", rs)
	}

	for _, rt := range []string{"runc", "gvisor", "kata"} {
		t.Run(rt, func(t *testing.T) {
			p := sessionProfile(rt)
			if p.DefaultAction != specs.ActErrno {
				t.Fatalf("default action %s, want %s", p.DefaultAction, specs.ActErrno)
			}
			for _, n := range tracerSyscalls {
				for _, r := range rulesFor(p, n) {
					if r.Action == specs.ActAllow {
						t.Errorf("%s is allowed: %+v", n, r)
					}
				}
			}
			clone3 := rulesFor(p, "clone3")
			if len(clone3) != 1 {
				t.Fatalf("clone3 rules: %+v", clone3)
			}
			if rt == "gvisor" {
				if clone3[0].Action != specs.ActTrace {
					t.Errorf("clone3 under gvisor: %s, want %s (ENOSYS without a tracer)", clone3[0].Action, specs.ActTrace)
				}
			} else if clone3[0].Action != specs.ActErrno || *clone3[0].ErrnoRet != uint(unix.ENOSYS) {
				t.Errorf("clone3 under %s: %+v, want ENOSYS", rt, clone3[0])
			}
			// Everything else is as containerd has it: clone without
			// namespace flags, unshare not at all, the rest of the allow
			// list intact.
			if rs := rulesFor(p, "clone"); len(rs) != 1 || rs[0].Action != specs.ActAllow || len(rs[0].Args) != 1 {
				t.Errorf("clone rules: %+v", rs)
			}
			for _, n := range []string{"unshare", "mount", "keyctl", "add_key", "bpf", "setns"} {
				if rs := rulesFor(p, n); len(rs) != 0 {
					t.Errorf("%s has rules: %+v", n, rs)
				}
			}
			for _, n := range []string{"read", "futex", "process_madvise", "socket"} {
				if len(rulesFor(p, n)) != len(rulesFor(base, n)) {
					t.Errorf("the rules for %s changed", n)
				}
			}
			if got, want := len(p.Syscalls), len(base.Syscalls); got != want && got != want-1 {
				t.Errorf("%d rules, containerd has %d", got, want)
			}
		})
	}
}

// The profile printed for a cluster's nodes is the one the containerd
// backend installs, for each runtime.
func TestSeccompProfileJSON(t *testing.T) {
	for _, rt := range []string{"gvisor", "runc"} {
		raw, err := SeccompProfile(rt)
		if err != nil {
			t.Fatal(err)
		}
		var got specs.LinuxSeccomp
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatalf("%s: %v", rt, err)
		}
		want, _ := json.MarshalIndent(sessionProfile(rt), "", "  ")
		if !bytes.Equal(raw, want) {
			t.Errorf("%s: the printed profile is not the session profile", rt)
		}
		clone3 := rulesFor(&got, "clone3")
		if len(clone3) != 1 || (rt == "gvisor") != (clone3[0].Action == specs.ActTrace) {
			t.Errorf("%s: clone3 rules %+v", rt, clone3)
		}
		for _, r := range rulesFor(&got, "ptrace") {
			if r.Action == specs.ActAllow {
				t.Errorf("%s: ptrace allowed by %+v", rt, r)
			}
		}
	}
}
