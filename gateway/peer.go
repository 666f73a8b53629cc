package gateway

import (
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v2"
	"golang.org/x/sys/unix"
)

// Fiber gives a handler no sign that its client went away (its user
// context never ends), so a long request (a create waiting for quota or
// for its session to start) watches the connection itself.

// watchPeer calls cancel when the client closes its connection while the
// handler runs (a half-close counts: the client can no longer be told it
// has to retry); gone says whether it did. The returned func stops the
// watch, and returns once it has stopped: a look at the socket made
// after the handler returned would wait behind the server's read of the
// connection's next request.
func watchPeer(c *fiber.Ctx, cancel func()) (stop func(), gone func() bool) {
	conn := c.Context().Conn()
	done, exited := make(chan struct{}), make(chan struct{})
	var left atomic.Bool
	go func() {
		defer close(exited)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if peerGone(conn) {
					left.Store(true)
					cancel()
					return
				}
			}
		}
	}()
	return func() { close(done); <-exited }, left.Load
}

// peerGone reports whether the other end closed conn, by peeking at it:
// nothing is read, so a pipelined request stays where it is.
func peerGone(conn net.Conn) bool {
	n, err := peekNow(conn)
	return n == 0 && err == nil
}

// errNoSocket: a connection with no socket to peek at.
var errNoSocket = errors.New("no socket to peek at")

// peekNow peeks at one byte of conn's socket without waiting and without
// reading it (a read deadline in the past fails before it looks): n 1 and
// no error, something came; n 0 and no error, the peer closed; EAGAIN,
// nothing yet.
func peekNow(conn net.Conn) (n int, err error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return 0, errNoSocket
	}
	rc, rerr := sc.SyscallConn()
	if rerr != nil {
		return 0, errNoSocket
	}
	if rerr = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return true // done, whatever it found
	}); rerr != nil {
		return 0, errNoSocket
	}
	return n, err
}
