package gateway

import (
	"net"
	"testing"
	"time"
)

// A connection of eofListener's is still a socket to peekNow (whether a
// client waiting for a session hung up), and notes its client's EOF.
// The control: a client that is still there.
func TestEOFConn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	wrapped := eofListener{ln}
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := wrapped.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := peekNow(conn); err == errNoSocket {
		t.Fatal("peekNow cannot see the socket under the wrapper")
	}
	if n, err := peekNow(conn); err == nil {
		t.Fatalf("the control, a client still there: peek %d, %v", n, err)
	}
	if clientEnded(conn) {
		t.Fatal("the control: a client still there has ended")
	}
	client.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if n, err := peekNow(conn); n == 0 && err == nil {
			break // the peer closed
		}
		if time.Now().After(deadline) {
			t.Fatal("peekNow did not see the client close")
		}
		time.Sleep(5 * time.Millisecond)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || !clientEnded(conn) {
		t.Fatalf("the client's EOF was not noted: %v", err)
	}
	if underEOF(conn) == conn {
		t.Error("underEOF did not unwrap")
	}
}
