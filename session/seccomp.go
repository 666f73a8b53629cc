package session

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/contrib/seccomp"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// tracerSyscalls are the calls that make a process the tracer of another
// (or read and write its memory). The session profile refuses them under
// every runtime handler; see withSessionSeccomp.
var tracerSyscalls = []string{"ptrace", "process_vm_readv", "process_vm_writev"}

// withSessionSeccomp adjusts containerd's default seccomp profile, applied
// by seccomp.WithDefaultProfile before it, so that the same calls are
// refused the same way under every runtime handler. runc installs the
// profile in the host kernel; gVisor's runsc installs it in its own kernel
// (the runsc wrapper passes --oci-seccomp), with two differences that this
// opt takes care of:
//
//   - runsc ignores errnoRet and answers EPERM for every SCMP_ACT_ERRNO.
//     The profile answers clone3 with ENOSYS on purpose: glibc (and so
//     Chromium) falls back to clone, whose flags the profile can check,
//     only on ENOSYS; on EPERM no thread starts. Under gvisor, clone3 gets
//     SCMP_ACT_TRACE, which gVisor's kernel answers with ENOSYS when no
//     tracer asks for seccomp stops. Allowing clone3 instead would let
//     clone3(CLONE_NEWUSER) make a user namespace, which the clone rule
//     refuses.
//   - A tracer that asks for seccomp stops can resume a traced call with
//     another syscall number, and gVisor does not run the filter again.
//     So nothing in a session may become a tracer: ptrace (and the
//     process_vm calls that go with it) are refused under every handler,
//     which also makes the "ptrace a neighbour process" probe answer the
//     same everywhere. Sessions run without CAP_SYS_PTRACE, so the
//     profile's capability rule never adds them back.
func withSessionSeccomp(runtime string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		if s.Linux == nil || s.Linux.Seccomp == nil {
			return nil
		}
		sessionSeccomp(s.Linux.Seccomp, runtime)
		return nil
	}
}

// sessionSeccomp edits a profile in place; see withSessionSeccomp.
func sessionSeccomp(p *specs.LinuxSeccomp, runtime string) {
	rules := p.Syscalls[:0]
	for _, r := range p.Syscalls {
		if r.Action == specs.ActAllow {
			r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool { return slices.Contains(tracerSyscalls, n) })
			if len(r.Names) == 0 {
				continue
			}
		}
		if runtime == "gvisor" && r.Action == specs.ActErrno && slices.Equal(r.Names, []string{"clone3"}) {
			r.Action, r.ErrnoRet = specs.ActTrace, nil
		}
		rules = append(rules, r)
	}
	p.Syscalls = rules
}

// SeccompProfile is the session profile of a runtime handler as an OCI
// seccomp profile (JSON): containerd's default profile for a process
// without capabilities, adjusted as withSessionSeccomp does. Clusters
// install it on their nodes for the Kubernetes backend (a Localhost
// profile): under gVisor through the runc shim, RuntimeDefault answers
// clone3 with EPERM, and Chromium cannot start its helpers.
func SeccompProfile(runtime string) ([]byte, error) {
	p := seccomp.DefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}})
	sessionSeccomp(p, runtime)
	return json.MarshalIndent(p, "", "  ")
}
