package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/sandgate/sandgate/session"
)

// TestIdleOpen: a spare is handed to a client only while it is open and
// nothing has come on it; one whose peer closed or spoke is not.
func TestIdleOpen(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (net.Conn, net.Conn) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		p, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c, p
	}
	// Control: open and quiet, and still usable after the check.
	c, p := pair()
	br := bufio.NewReader(c)
	if !idleOpen(c, br) {
		t.Fatal("an open, quiet connection was refused")
	}
	p.Write([]byte("x"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := br.ReadByte(); err != nil || b != 'x' {
		t.Fatalf("read after the check: %q %v (the check left a deadline behind)", b, err)
	}
	c.Close()
	p.Close()

	c, p = pair()
	p.Close()
	br = bufio.NewReader(c)
	deadline := time.Now().Add(5 * time.Second)
	for idleOpen(c, br) {
		if time.Now().After(deadline) {
			t.Fatal("a connection whose peer closed was taken as open")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Close()

	c, p = pair()
	p.Write([]byte("unasked"))
	br = bufio.NewReader(c)
	deadline = time.Now().Add(5 * time.Second)
	for idleOpen(c, br) {
		if time.Now().After(deadline) {
			t.Fatal("a connection the peer wrote on was taken as idle")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Close()
	p.Close()
}

// TestWakeBrowser: a wake asks the session's /json/version as the
// gateway's CDP code does, and ends by itself, within its bounds, on an
// answer that never ends; dropSpare cancels one under way and waits for
// it; none is made for a session that no longer runs.
func TestWakeBrowser(t *testing.T) {
	s := &Server{}
	serve := func(handle func(net.Conn)) (session.Endpoint, chan string) {
		t.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		got := make(chan string, 4)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					req, err := http.ReadRequest(bufio.NewReader(c))
					if err != nil {
						return
					}
					got <- req.Host + " " + req.URL.Path
					handle(c)
				}()
			}
		}()
		return session.Endpoint{CDP: netip.MustParseAddrPort(ln.Addr().String())}, got
	}
	waitGone := func(id string, limit time.Duration) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for {
			s.spares.mu.Lock()
			w := s.spares.wakes[id]
			s.spares.mu.Unlock()
			if w == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the wake of %s still runs after %s", id, limit)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	live := func() bool { return true }

	// The control: a browser that answers.
	ep, got := serve(func(c net.Conn) { io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}") })
	s.wakeBrowser("s-a", ep, live)
	select {
	case r := <-got:
		if r != session.CDPHost+" /json/version" {
			t.Fatalf("the wake asked %q", r)
		}
	case <-time.After(time.Minute):
		t.Fatal("the wake never reached the browser")
	}
	waitGone("s-a", time.Minute)

	// An answer without end: read to its bound, then dropped.
	wrote := make(chan int64, 1)
	ep, got = serve(func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n")
		n, _ := io.Copy(c, zeroReader{})
		wrote <- n
	})
	t0 := time.Now()
	s.wakeBrowser("s-b", ep, live)
	<-got
	select {
	case n := <-wrote:
		// Its time bound would end it too, later.
		if took := time.Since(t0); took >= wakeLimit {
			t.Fatalf("the wake read an endless answer for %s", took)
		}
		t.Logf("the session wrote %d bytes before the wake hung up", n)
	case <-time.After(time.Minute):
		t.Fatal("the wake read an endless answer on")
	}
	waitGone("s-b", time.Minute)

	// An answer that never comes: dropSpare ends the wake and waits.
	hold := make(chan struct{})
	defer close(hold)
	ep, got = serve(func(c net.Conn) { <-hold })
	s.wakeBrowser("s-c", ep, live)
	<-got
	t0 = time.Now()
	s.dropSpare("s-c")
	if took := time.Since(t0); took >= wakeLimit {
		t.Fatalf("dropSpare waited %s: the wake was not cancelled", took)
	}
	s.spares.mu.Lock()
	left := len(s.spares.wakes)
	s.spares.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d wakes left", left)
	}

	// A session that no longer runs: nothing is asked.
	ep, got = serve(func(c net.Conn) {})
	s.wakeBrowser("s-d", ep, func() bool { return false })
	s.spares.mu.Lock()
	started := s.spares.wakes["s-d"] != nil
	s.spares.mu.Unlock()
	if started {
		t.Fatal("a wake was started for a session that no longer runs")
	}
	select {
	case r := <-got:
		t.Fatalf("a stopped session was asked %q", r)
	case <-time.After(200 * time.Millisecond):
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
