package main

import (
	"strings"
	"testing"
)

// A host's scope is its own and lasts: the same state directory gives
// the same scope at each start, another gives another (two hosts, even
// of one name). A cluster's is its namespace's, on any replica.
func TestSessionScope(t *testing.T) {
	a, b := &Config{StateDir: t.TempDir()}, &Config{StateDir: t.TempDir()}
	a.Containerd.Namespace, b.Containerd.Namespace = "sandgate", "sandgate"
	first, err := sessionScope(a, false)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := sessionScope(a, false)
	other, _ := sessionScope(b, false)
	if first != again || first == other || !strings.HasPrefix(first, "containerd/") {
		t.Errorf("scopes %q, again %q, another host's %q: want one that lasts and is the host's own", first, again, other)
	}
	a.Kubernetes.Namespace, b.Kubernetes.Namespace = "sandgate", "sandgate"
	ka, _ := sessionScope(a, true)
	kb, _ := sessionScope(b, true)
	if ka != kb || ka != "kubernetes/sandgate" {
		t.Errorf("two replicas of one namespace: %q and %q, want the namespace's", ka, kb)
	}
}
