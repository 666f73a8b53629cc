package test

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/session/kube"
)

// A network namespace the NetworkPolicy test makes, standing for any
// destination outside the cluster. The trial cluster forwards Pods'
// traffic only to their bridge and to host veths named sgkt*, so no
// probe leaves the machine even when the policy is not enforced.
const (
	netpolHostIP   = "10.97.201.1"
	netpolTargetIP = "10.97.201.2"
	netpolPort     = "8080"
)

// TestKubeNetworkPolicy: deploy/kubernetes/networkpolicies.yaml, enforced
// on the trial cluster by kube-network-policies, keeps session Pods to
// the gateway's egress port and lets only gateway Pods (and the node)
// reach their CDP and VNC ports. Each refusal has beside it the same
// path taken by a Pod the policy does not select, which gets through,
// and at the end the policy is removed and the refused path opens: what
// refused it was the policy.
func TestKubeNetworkPolicy(t *testing.T) {
	needE2E(t)
	kubeconfig := needKube(t)
	b := kubeNamespace(t, kubeconfig)
	ns, c := b.Namespace(), b.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	target := netpolTarget(t)

	// Four Pods of the session image: two sessions, a Pod labelled as
	// the gateway (it opens the proxy's port 3128 and a port beside it,
	// 3129), and another Pod the policy does not name.
	pods := map[string]kube.Pod{}
	for _, role := range []string{"session", "session2", "gateway", "other"} {
		// Four on this 2-core node: a quarter of a core each.
		s := kubeBrowserSpec("runc")
		s.CPUs, s.MemoryMB = 0.25, 768
		if err := b.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Delete(context.Background(), s.ID, 0) })
		var labels string
		switch role {
		case "gateway":
			labels = `{"app.kubernetes.io/managed-by":null,"app.kubernetes.io/name":"sandgate-gateway"}`
		case "other":
			labels = `{"app.kubernetes.io/managed-by":null}`
		}
		if labels != "" {
			patch := []byte(`{"metadata":{"labels":` + labels + `}}`)
			if _, err := c.CoreV1().Pods(ns).Patch(ctx, "sandgate-"+s.ID, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatalf("relabel the %s Pod: %v", role, err)
			}
		}
		wctx, wcancel := context.WithTimeout(ctx, 3*time.Minute)
		p, err := b.Wait(wctx, s.ID)
		wcancel()
		if err != nil {
			t.Fatalf("the %s Pod: %v", role, err)
		}
		pods[role] = p
	}
	for _, role := range []string{"gateway", "other"} {
		_, stderr, code := kubeRun(t, b, pods[role].ID, kube.Exec{Args: []string{"sh", "-c",
			`printf '0.0.0.0 3128 127.0.0.1 9\n0.0.0.0 3129 127.0.0.1 9\n' >/tmp/probe.conf && ` +
				`(rinetd -f -c /tmp/probe.conf </dev/null >/dev/null 2>&1 &)`}})
		if code != 0 {
			t.Fatalf("rinetd in the %s Pod: exit %d: %s", role, code, stderr)
		}
		waitFor(t, time.Minute, "port 3128 open in the "+role+" Pod", func() bool {
			return netpolProbe(t, b, pods[role], "127.0.0.1", "3128") == reached
		})
	}

	addr := func(role string) string { return pods[role].Addr.String() }
	probe := func(from, ip, port string) probeResult { return netpolProbe(t, b, pods[from], ip, port) }

	if iso, err := b.Isolation(ctx); err != nil || iso.Ingress || iso.Egress {
		t.Fatalf("before the policy, the backend sees session Pods governed: %+v, %v", iso, err)
	}
	// Before the policy, a session reaches the outside namespace: the
	// path is open and the policy is what will close it. (Waited for: on
	// a loaded machine the enforcer, which decides every new connection,
	// may not know a Pod this new yet; a CI run saw one probe time out.)
	waitFor(t, time.Minute, "before the policy, a session Pod to reach "+target+":"+netpolPort+" (else the path itself is broken)", func() bool {
		return probe("session", target, netpolPort) == reached
	})

	applyNetworkPolicies(t, b)
	if iso, err := b.Isolation(ctx); err != nil || !iso.Ingress || !iso.Egress {
		t.Fatalf("with the policy, the backend does not see session Pods governed both ways: %+v, %v", iso, err)
	}
	waitFor(t, time.Minute, "the policy in force", func() bool {
		return probe("session", target, netpolPort) == dropped
	})

	checks := []struct {
		from, to, port string
		want           probeResult
		why            string
	}{
		{"session", "gateway", "3128", reached, "its egress proxy's port"},
		{"session", "gateway", "3129", dropped, "another port of a gateway Pod"},
		{"session", "other", "3128", dropped, "a Pod that is not the gateway"},
		{"other", "gateway", "3128", dropped, "the gateway's egress proxy, from a Pod that is no session"},
		{"other", "gateway", "8080", refused, "(control) the gateway's API port, open to all (nothing listens there in this Pod)"},
		{"session", "session2", "9222", dropped, "another session's CDP"},
		{"session", "", netpolPort, dropped, "a destination outside the cluster"},
		{"other", "", netpolPort, reached, "(control) the same destination, from a Pod the policy does not select"},
		{"other", "session", "9222", dropped, "a session's CDP, from a Pod that is not the gateway"},
		{"other", "session", "5900", dropped, "a session's VNC, from a Pod that is not the gateway"},
		{"gateway", "session", "9222", reached, "a session's CDP, from a gateway Pod"},
		{"gateway", "session", "5900", reached, "a session's VNC, from a gateway Pod"},
	}
	for _, ch := range checks {
		ip := target
		if ch.to != "" {
			ip = addr(ch.to)
		}
		if got := probe(ch.from, ip, ch.port); got != ch.want {
			t.Errorf("%s Pod to %s:%s, %s: %s, want %s", ch.from, ip, ch.port, ch.why, got, ch.want)
		}
	}
	// Every Pod also has an IPv6 link-local address, which no IPv4
	// policy sees: one session must not reach another's by it (VNC
	// takes any client). Reached or refused would mean a packet got there.
	if ll := netpolLinkLocal(t, b, pods["session2"]); ll == "" {
		t.Log("the Pods have no IPv6 link-local address: no IPv6 path to check")
	} else if got := probe("session", ll+"%eth0", "5900"); got == reached || got == refused {
		t.Errorf("session Pod to the other session's VNC at %s%%eth0: %s, want no packet through", ll, got)
	}
	// The node itself (where the trial's gateway runs, as root) reaches
	// a session: the policy governs Pods, not the host.
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(addr("session"), "9222"), 10*time.Second)
	if err != nil {
		t.Errorf("the node to a session's CDP: %v", err)
	} else {
		conn.Close()
	}

	// Without the policy the refused path opens again.
	if err := c.NetworkingV1().NetworkPolicies(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the refused paths open again without the policy", func() bool {
		return probe("session", addr("session2"), "9222") == reached && probe("session", target, netpolPort) == reached
	})
}

type probeResult string

const (
	reached probeResult = "reached"
	refused probeResult = "refused"
	dropped probeResult = "dropped"
	// unreachable: an IPv6 link-local address whose owner cannot be
	// found (its neighbour solicitation dropped too).
	unreachable probeResult = "unreachable"
)

// netpolLinkLocal is the IPv6 link-local address of a Pod's eth0, or ""
// when it has none.
func netpolLinkLocal(t *testing.T, b *kube.Backend, p kube.Pod) string {
	t.Helper()
	out, _, code := kubeRun(t, b, p.ID, kube.Exec{Args: []string{"cat", "/proc/net/if_inet6"}})
	if code != 0 {
		return ""
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 6 && f[5] == "eth0" && strings.HasPrefix(f[0], "fe80") && len(f[0]) == 32 {
			var groups []string
			for i := 0; i < 32; i += 4 {
				groups = append(groups, f[0][i:i+4])
			}
			if a, err := netip.ParseAddr(strings.Join(groups, ":")); err == nil {
				return a.String()
			}
		}
	}
	return ""
}

// netpolProbe opens a TCP connection from inside a Pod: reached when it
// is accepted, refused when a reset answers (the packet got there),
// dropped when nothing answers in 5 s; anything else (an unreachable
// network, say) fails the test.
func netpolProbe(t *testing.T, b *kube.Backend, from kube.Pod, ip, port string) probeResult {
	t.Helper()
	_, stderr, code := kubeRun(t, b, from.ID, kube.Exec{Args: []string{"timeout", "5", "bash", "-c",
		`exec 3<>"/dev/tcp/$0/$1"`, ip, port}})
	switch {
	case code == 0:
		return reached
	case code == 1 && strings.Contains(stderr, "Connection refused"):
		return refused
	case code == 124:
		return dropped
	case code == 1 && (strings.Contains(stderr, "No route to host") || strings.Contains(stderr, "Network is unreachable")) && strings.Contains(ip, "%"):
		// A link-local neighbour that never answers its solicitation.
		return unreachable
	}
	t.Fatalf("probe to %s:%s: exit %d: %s", ip, port, code, stderr)
	return ""
}

// netpolTarget makes a network namespace with a listener, reached from
// the host through a veth named sgkt*, and returns the listener's
// address; all of it goes at the test's end.
func netpolTarget(t *testing.T) string {
	t.Helper()
	suffix := strings.ToLower(ids.NewSession()[2:10])
	name, veth := "sgkt-"+suffix, "sgkt"+suffix
	undo := func() {
		exec.Command("ip", "link", "del", veth).Run()
		exec.Command("ip", "netns", "del", name).Run()
	}
	steps := [][]string{
		{"ip", "netns", "add", name},
		{"ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name},
		{"ip", "addr", "add", netpolHostIP + "/30", "dev", veth},
		{"ip", "link", "set", veth, "up"},
		{"ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"},
		{"ip", "netns", "exec", name, "ip", "addr", "add", netpolTargetIP + "/30", "dev", "eth0"},
		{"ip", "netns", "exec", name, "ip", "link", "set", "eth0", "up"},
		{"ip", "netns", "exec", name, "ip", "route", "add", "default", "via", netpolHostIP},
	}
	// What a run that died left (only this test makes sgkt* names): its
	// address would be routed twice.
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "sgkt-") {
				exec.Command("ip", "link", "del", "sgkt"+strings.TrimPrefix(f[0], "sgkt-")).Run()
				exec.Command("ip", "netns", "del", f[0]).Run()
			}
		}
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			undo()
			t.Fatal(err)
		}
	}
	l, _, err := listenInNS(name, "tcp", net.JoinHostPort(netpolTargetIP, netpolPort))
	if err != nil {
		undo()
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		undo()
	})
	// The host itself reaches it (root's own traffic, not forwarded).
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(netpolTargetIP, netpolPort), 5*time.Second)
	if err != nil {
		t.Fatalf("the test's own namespace does not answer the host: %v", err)
	}
	conn.Close()
	return netpolTargetIP
}
