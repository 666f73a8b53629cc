package egress

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"
)

// TestProbe: Probe passes a proxy that refuses the prober as no
// session's, and fails a port that accepts and says nothing, one that
// refuses connections, another server, and a proxy that takes the
// prober's address for a session's (it waits for a request).
func TestProbe(t *testing.T) {
	probe := func(addr string, wait time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		return Probe(ctx, netip.MustParseAddrPort(addr))
	}
	proxy := startProxy(t, New(Config{}, addrPolicies{}, secretsMap{}))
	if err := probe(proxy, 5*time.Second); err != nil {
		t.Fatalf("a proxy that refuses the prober: %v", err)
	}

	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	start := time.Now()
	if err := probe(silent.Addr().String(), 300*time.Millisecond); err == nil {
		t.Error("a port that accepts and says nothing passed")
	} else if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a silent port took %s to fail, past the probe's deadline", d)
	}

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	if err := probe(closedAddr, time.Second); err == nil {
		t.Error("a closed port passed")
	}

	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "sandgate egress: not a session", http.StatusForbidden)
	}))
	t.Cleanup(other.Close)
	if err := probe(other.Listener.Addr().String(), time.Second); err == nil {
		t.Error("an HTTP server that answers only once asked passed")
	}

	session := startProxy(t, New(Config{}, addrPolicies{srcA: {Session: "a", Tenant: "t"}}, secretsMap{}))
	if err := probe(session, 500*time.Millisecond); err == nil {
		t.Error("a proxy that took the prober for a session passed")
	}
}
