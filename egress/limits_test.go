package egress

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// addrPolicies maps source addresses to sessions: 127.0.0.1 is one
// session, 127.0.0.2 another, anything else no session.
type addrPolicies map[netip.Addr]Policy

func (a addrPolicies) Policy(src netip.Addr) (Policy, bool) {
	p, ok := a[src]
	return p, ok
}

var (
	srcA = netip.MustParseAddr("127.0.0.1")
	srcB = netip.MustParseAddr("127.0.0.2")
	srcX = netip.MustParseAddr("127.0.0.3")
)

// events collects audit events by type.
type events struct {
	mu  sync.Mutex
	evs []string
}

func (e *events) audit(session, typ string, f map[string]any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if typ == "egress_limited" {
		e.evs = append(e.evs, fmt.Sprintf("%s %s refused=%v: %v", session, typ, f["refused"], f["reason"]))
	}
}

func (e *events) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.evs...)
}

// limitedProxy runs a proxy with lim for two sessions allowed to reach
// upstream (on loopback, exempted).
func limitedProxy(t *testing.T, lim Limits, up string) (string, *Proxy, *events) {
	t.Helper()
	host, port, _ := net.SplitHostPort(up)
	allow, err := ParsePattern("up.example.test:" + port)
	if err != nil {
		t.Fatal(err)
	}
	pol := func(id string) Policy { return Policy{Session: id, Tenant: "t", Allow: []Pattern{allow}} }
	ev := &events{}
	p := New(Config{
		Resolver: NewResolver("", map[string][]netip.Addr{"up.example.test": {netip.MustParseAddr(host)}}),
		Exempt:   []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Limits:   lim,
		Audit:    ev.audit,
	}, addrPolicies{srcA: pol("a"), srcB: pol("b")}, secretsMap{})
	p.lim.window = 300 * time.Millisecond
	return startProxy(t, p), p, ev
}

func dialFrom(t *testing.T, src netip.Addr, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// get sends one keep-alive request on c and returns the status.
func get(c net.Conn, br *bufio.Reader, target string) (int, string, error) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: up.example.test\r\n\r\n", target); err != nil {
		// A refused connection may be closed before the request is
		// written; what it answered is still to be read.
		if resp, rerr := http.ReadResponse(br, nil); rerr == nil {
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b), nil
		}
		return 0, "", err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, "", err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), nil
}

func upstream(t *testing.T) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "up")
	}))
	t.Cleanup(up.Close)
	return up
}

type held struct {
	c  net.Conn
	br *bufio.Reader
}

func portOf(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

// TestProxySessionConnLimit: a session holding its maximum of
// connections gets 429s for more, once audited per burst; another
// session is not affected, and the first gets connections again once it
// lets some go.
func TestProxySessionConnLimit(t *testing.T) {
	up := upstream(t)
	addr, _, ev := limitedProxy(t, Limits{SessionConns: 8, SessionConnRate: 1000, MaxConns: 1000}, up.Listener.Addr().String())
	target := "http://up.example.test:" + portOf(up.Listener.Addr().String()) + "/"
	open := func(src netip.Addr, n int) (admitted []held, refused int) {
		for i := 0; i < n; i++ {
			c := dialFrom(t, src, addr)
			h := held{c, bufio.NewReader(c)}
			admitted = append(admitted, h)
		}
		var ok []held
		for _, h := range admitted {
			st, body, err := get(h.c, h.br, target)
			switch {
			case err == nil && st == 200:
				ok = append(ok, h)
			case err == nil && st == http.StatusTooManyRequests:
				refused++
			default:
				t.Fatalf("answer %d %q %v", st, body, err)
			}
		}
		return ok, refused
	}
	a, refused := open(srcA, 20)
	if len(a) != 8 || refused != 12 {
		t.Fatalf("session a: %d admitted, %d refused; want 8 and 12", len(a), refused)
	}
	if b, refused := open(srcB, 3); len(b) != 3 || refused != 0 {
		t.Fatalf("session b while a is at its limit: %d admitted, %d refused", len(b), refused)
	}
	// A stranger is refused at once.
	c := dialFrom(t, srcX, addr)
	if st, _, err := get(c, bufio.NewReader(c), target); err != nil || st != http.StatusForbidden {
		t.Errorf("a source that is no session: %d %v, want 403", st, err)
	}
	// Letting connections go makes room again.
	for _, h := range a[:4] {
		h.c.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		again, r := open(srcA, 1)
		refused += r
		if len(again) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("session a gets no connection after closing four")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// One event at the start of the burst, the rest counted in a few
	// more (one per window), never one per refusal.
	sum := func(evs []string) (n int) {
		for _, e := range evs {
			var k int
			fmt.Sscanf(e[strings.Index(e, "refused=")+len("refused="):], "%d", &k)
			n += k
		}
		return n
	}
	var evs []string
	waitFor(t, func() bool { evs = ev.list(); return sum(evs) == refused })
	if !strings.HasPrefix(evs[0], "a egress_limited refused=1: too many connections at once") || len(evs) > refused/2 {
		t.Errorf("audit for %d refusals: %q; want the first at once and the rest counted", refused, evs)
	}
}

// TestProxyNewConnRate: past its burst, a session's new connections are
// refused until the bucket refills, while it holds none.
func TestProxyNewConnRate(t *testing.T) {
	up := upstream(t)
	addr, _, ev := limitedProxy(t, Limits{SessionConns: 5, SessionConnRate: 0.01, MaxConns: 1000}, up.Listener.Addr().String())
	target := "http://up.example.test:" + portOf(up.Listener.Addr().String()) + "/"
	for i := 0; i < 5; i++ {
		c := dialFrom(t, srcA, addr)
		if st, _, err := get(c, bufio.NewReader(c), target); err != nil || st != 200 {
			t.Fatalf("connection %d within the burst: %d %v", i, st, err)
		}
		c.Close()
	}
	c := dialFrom(t, srcA, addr)
	if st, _, err := get(c, bufio.NewReader(c), target); err != nil || st != http.StatusTooManyRequests {
		t.Fatalf("a sixth new connection at once: %d %v, want 429", st, err)
	}
	c = dialFrom(t, srcB, addr)
	if st, _, err := get(c, bufio.NewReader(c), target); err != nil || st != 200 {
		t.Fatalf("control: another session: %d %v", st, err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if evs := ev.list(); len(evs) > 0 {
			if !strings.Contains(evs[0], "new connections per second") {
				t.Errorf("audit: %q", evs)
			}
			return
		}
	}
	t.Error("no egress_limited event")
}

// TestProxyGlobalCap: all sessions' connections, the upstream ones
// included, stay under MaxConns; a session's request is refused with 503
// when its upstream connection would pass it.
func TestProxyGlobalCap(t *testing.T) {
	up := upstream(t)
	addr, p, _ := limitedProxy(t, Limits{SessionConns: 10, SessionConnRate: 1000, MaxConns: 4}, up.Listener.Addr().String())
	target := "http://up.example.test:" + portOf(up.Listener.Addr().String()) + "/"
	// Three of a's connections and one upstream connection: at the cap.
	var a []net.Conn
	for i := 0; i < 3; i++ {
		a = append(a, dialFrom(t, srcA, addr))
	}
	if st, body, err := get(a[0], bufio.NewReader(a[0]), target); err != nil || st != 200 {
		t.Fatalf("a request at three connections: %d %q %v", st, body, err)
	}
	// Each connection is admitted beside the accepting: a's last two
	// may still be on their way (a busy machine), and b's must come
	// after them.
	waitFor(t, func() bool { p.lim.mu.Lock(); defer p.lim.mu.Unlock(); return p.lim.total == 4 })
	c := dialFrom(t, srcB, addr)
	if st, body, err := get(c, bufio.NewReader(c), target); err != nil || st != http.StatusTooManyRequests {
		t.Fatalf("session b past the cap: %d %q %v, want 429", st, body, err)
	}
	// The upstream connection idles in a's pool; drop it: a's fourth
	// connection is admitted, and its request needs a fifth file.
	p.mu.Lock()
	for _, st := range p.sessions {
		st.transport.CloseIdleConnections()
	}
	p.mu.Unlock()
	waitFor(t, func() bool { p.lim.mu.Lock(); defer p.lim.mu.Unlock(); return p.lim.total == 3 })
	a = append(a, dialFrom(t, srcA, addr))
	if st, body, err := get(a[3], bufio.NewReader(a[3]), target); err != nil || st != http.StatusServiceUnavailable {
		t.Fatalf("a request whose upstream connection passes the cap: %d %q %v, want 503", st, body, err)
	}
	a[3].Close()
	a[2].Close()
	waitFor(t, func() bool { p.lim.mu.Lock(); defer p.lim.mu.Unlock(); return p.lim.total == 2 })
	c = dialFrom(t, srcB, addr)
	if st, body, err := get(c, bufio.NewReader(c), target); err != nil || st != 200 {
		t.Fatalf("session b under the cap again: %d %q %v", st, body, err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
	}
}

// echoServer echoes TCP bytes, for tunnels.
func echoServer(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return l.Addr().String()
}

// tunnel opens a CONNECT tunnel from src through the proxy to port.
func tunnel(t *testing.T, src netip.Addr, addr, port string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c := dialFrom(t, src, addr)
	fmt.Fprintf(c, "CONNECT up.example.test:%s HTTP/1.1\r\nHost: up.example.test:%s\r\n\r\n", port, port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	return c, br
}

// TestProxyIdleTimeout: a tunnel and a keep-alive connection that move
// nothing are closed after the idle timeout; a tunnel in use is not.
func TestProxyIdleTimeout(t *testing.T) {
	echo := echoServer(t)
	idle := 300 * time.Millisecond
	addr, _, _ := limitedProxy(t, Limits{IdleTimeout: idle}, echo)
	port := portOf(echo)

	busy, busyR := tunnel(t, srcA, addr, port)
	// The quiet tunnel's last traffic is its CONNECT exchange, which
	// starts after this; measuring from after the reply would count
	// the exchange's own time as idle.
	start := time.Now()
	quiet, quietR := tunnel(t, srcA, addr, port)
	closed := make(chan time.Duration, 1)
	go func() {
		quiet.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err := quietR.ReadByte()
		if err != nil && !isTimeout(err) {
			closed <- time.Since(start)
		}
		close(closed)
	}()
	// The busy tunnel echoes a byte every idle/3 for four idle timeouts.
	for i := 0; time.Since(start) < 4*idle; i++ {
		busy.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := busy.Write([]byte{byte(i)}); err != nil {
			t.Fatalf("busy tunnel write after %v: %v", time.Since(start), err)
		}
		if b, err := busyR.ReadByte(); err != nil || b != byte(i) {
			t.Fatalf("busy tunnel echo after %v: %v %v", time.Since(start), b, err)
		}
		time.Sleep(idle / 3)
	}
	d, ok := <-closed
	if !ok {
		t.Fatal("the quiet tunnel was not closed")
	}
	if d < idle {
		t.Errorf("the quiet tunnel closed after %v, before the idle timeout %v", d, idle)
	}

	// A keep-alive connection to the proxy, quiet after one request.
	up := upstream(t)
	addr2, _, _ := limitedProxy(t, Limits{IdleTimeout: idle}, up.Listener.Addr().String())
	c := dialFrom(t, srcA, addr2)
	br := bufio.NewReader(c)
	if st, _, err := get(c, br, "http://up.example.test:"+portOf(up.Listener.Addr().String())+"/"); err != nil || st != 200 {
		t.Fatalf("request: %d %v", st, err)
	}
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := br.ReadByte(); err == nil || isTimeout(err) {
		t.Errorf("the keep-alive connection was not closed: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestProxyByteRate: a session's bytes through the proxy, both ways, are
// paced at its rate; they arrive whole.
func TestProxyByteRate(t *testing.T) {
	echo := echoServer(t)
	const rate = 1 << 20
	addr, _, _ := limitedProxy(t, Limits{SessionBytesPerSecond: rate}, echo)
	c, br := tunnel(t, srcA, addr, portOf(echo))
	payload := bytes.Repeat([]byte("0123456789abcdef"), (2<<20)/16)
	start := time.Now()
	go func() { c.Write(payload) }()
	got := make([]byte, len(payload))
	c.SetReadDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.ReadFull(br, got); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if !bytes.Equal(got, payload) {
		t.Fatal("the echo differs")
	}
	// Both directions pace 2 MiB at 1 MiB/s after a burst of 1/8 s.
	if min := time.Duration(float64(len(payload)-rate/8) / rate * float64(time.Second)); took < min {
		t.Errorf("2 MiB each way took %v at %d bytes/s; want at least %v", took, rate, min)
	}
	t.Logf("2 MiB each way at 1 MiB/s: %v", took)
}

// slowPolicies answers srcB only once released (a replica reading a
// session's Pod from an API server that is slow), srcA at once.
type slowPolicies struct {
	addrPolicies
	release chan struct{}
}

func (s slowPolicies) Policy(src netip.Addr) (Policy, bool) {
	if src == srcB {
		<-s.release
	}
	return s.addrPolicies.Policy(src)
}

// TestProxySlowPolicy: a connection whose session takes a while to find
// does not hold up another session's; it is served once found. (With
// the policy asked in the accept loop, session A's request waited
// behind B's.)
func TestProxySlowPolicy(t *testing.T) {
	up := upstream(t)
	host, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	allow, err := ParsePattern("up.example.test:" + port)
	if err != nil {
		t.Fatal(err)
	}
	pol := func(id string) Policy { return Policy{Session: id, Tenant: "t", Allow: []Pattern{allow}} }
	release := make(chan struct{})
	var once sync.Once
	p := New(Config{
		Resolver: NewResolver("", map[string][]netip.Addr{"up.example.test": {netip.MustParseAddr(host)}}),
		Exempt:   []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Limits:   Limits{SessionConns: 8, SessionConnRate: 1000, MaxConns: 1000},
	}, slowPolicies{addrPolicies{srcA: pol("a"), srcB: pol("b")}, release}, secretsMap{})
	addr := startProxy(t, p)
	// (Before the proxy's close, which waits for B's admission.)
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	target := "http://up.example.test:" + port + "/"

	cb := dialFrom(t, srcB, addr)
	brB := bufio.NewReader(cb)
	time.Sleep(50 * time.Millisecond) // B's admission under way first
	done := make(chan error, 1)
	go func() {
		ca := dialFrom(t, srcA, addr)
		st, body, err := get(ca, bufio.NewReader(ca), target)
		if err == nil && (st != 200 || body != "up") {
			err = fmt.Errorf("%d %q", st, body)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("session A, while B's session is looked up: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("session A's request waited for B's session to be found")
	}
	once.Do(func() { close(release) })
	if st, body, err := get(cb, brB, target); err != nil || st != 200 || body != "up" {
		t.Errorf("session B, once found: %d %q %v", st, body, err)
	}
}

// TestProxyCloseEndsTunnels: a CONNECT tunnel, taken from the HTTP
// server, carries bytes both ways and stays open while the proxy runs
// (the control), and ends once the proxy closes: none goes on under
// settings the proxy no longer runs with.
func TestProxyCloseEndsTunnels(t *testing.T) {
	echo := echoServer(t)
	addr, p, _ := limitedProxy(t, Limits{}, echo)
	c, br := tunnel(t, srcA, addr, portOf(echo))
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("through the tunnel: %q %v", line, err)
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := br.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the tunnel, while the proxy runs: %v, want it open (a read that times out)", err)
	}
	p.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the tunnel after the proxy closed: %v, want it ended", err)
	}
}
