package gateway

import (
	"bufio"
	"net"
	"testing"
	"time"
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
