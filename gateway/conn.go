package gateway

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
)

// eofListener's connections note when their client's stream has ended.
// fasthttp reads a chunked body that stops at a chunk's end, the client
// gone, as one that ended whole (its last chunk never came): the EOF
// of the connection is the only sign of it (see requestBody).
type eofListener struct{ net.Listener }

func (l eofListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &eofConn{Conn: c}, nil
}

type eofConn struct {
	net.Conn
	eof atomic.Bool // a read found the client's stream ended
}

func (c *eofConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err == io.EOF {
		c.eof.Store(true)
	}
	return n, err
}

// ReadFrom lets a copy into the connection splice, as it would into the
// connection under it.
func (c *eofConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// SyscallConn is the socket of the connection under it: what looks at
// the socket itself (peekNow, whether a waiting client hung up) sees
// through the wrapper.
func (c *eofConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// clientEnded says whether conn is one of eofListener's whose client's
// stream has ended.
func clientEnded(conn net.Conn) bool {
	c, ok := conn.(*eofConn)
	return ok && c.eof.Load()
}

// underEOF is the connection under one of eofListener's, for what
// wants the kernel's own (a splice).
func underEOF(conn net.Conn) net.Conn {
	if c, ok := conn.(*eofConn); ok {
		return c.Conn
	}
	return conn
}
