package gateway

import (
	"errors"
	"fmt"
	"io"
	"time"

	fws "github.com/fasthttp/websocket"
	"github.com/gofiber/contrib/websocket"
)

// Bounds on one WebSocket message from a client. A viewer's RFB messages
// are a few bytes (a clipboard text is the largest), and a terminal's
// keystrokes or a paste are far below the shell's limit.
const (
	maxVNCMessage   = 2 << 20
	maxShellMessage = 1 << 20
)

// errMessageTooBig is what readMessage returns for a message over its
// limit.
var errMessageTooBig = errors.New("websocket message too big")

// readMessage reads one message of at most limit bytes. It never holds
// more than limit+1 bytes of a message, whatever its frames announce: a
// longer message is an error, and the caller closes the connection with
// tooBigReason. (The library's own SetReadLimit closes without a reason.)
func readMessage(c *websocket.Conn, limit int64) (int, []byte, error) {
	mt, r, err := c.NextReader()
	if err != nil {
		return 0, nil, err
	}
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return 0, nil, err
	}
	if int64(len(data)) > limit {
		return 0, nil, errMessageTooBig
	}
	return mt, data, nil
}

// tooBigReason is the close reason for a message over limit bytes.
func tooBigReason(limit int64) string {
	return fmt.Sprintf("message larger than %d bytes", limit)
}

// closeLinger bounds how long a closed connection still reads, waiting for
// the peer's answering close frame.
const closeLinger = 2 * time.Second

// wsWriteTimeout bounds one message written to a viewer or a terminal: a
// client that stops reading is dropped then, rather than holding the
// writer (and with it the connection's close) for as long as its TCP
// connection stays open.
const wsWriteTimeout = 30 * time.Second

// unblockWrites makes a write blocked on a client that does not read
// fail within a second, so that a close can take the writer's lock.
func unblockWrites(c *websocket.Conn) {
	c.NetConn().SetWriteDeadline(time.Now().Add(time.Second))
}

// closeWS sends a close frame with a code and a reason (at most 123 bytes
// on the wire) and starts the closing handshake: nothing more is written,
// and reads go on for at most closeLinger, until the peer answers with its
// own close frame. The connection's reader sees that answer as an error
// and ends; the handler then returns and the socket closes. Closing at
// once would leave the peer's last bytes unread, and Linux answers those
// with a reset that can cost the peer what it had not read yet: the last
// output, the exit code, this close frame itself.
func closeWS(c *websocket.Conn, code int, reason string) {
	c.WriteControl(fws.CloseMessage, fws.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
	c.SetReadDeadline(time.Now().Add(closeLinger))
}

// abortWS sends a close frame and ends reading at once, with no closing
// handshake: for a client that broke the protocol (a message over the
// limit, a malformed stream), which gets no more of the gateway's reading
// time or bandwidth. The socket closes when the handler returns.
func abortWS(c *websocket.Conn, code int, reason string) {
	c.WriteControl(fws.CloseMessage, fws.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
	c.SetReadDeadline(time.Unix(1, 0))
}

// endWS closes with the handshake (closeWS) or, for a client that broke
// the protocol, at once (abortWS).
func endWS(c *websocket.Conn, code int, reason string, abort bool) {
	if abort {
		abortWS(c, code, reason)
	} else {
		closeWS(c, code, reason)
	}
}

// drainWS reads and drops messages until the peer's close frame, an error,
// or the deadline closeWS (or abortWS) set. For handlers that close a
// connection with no reader of their own, and for readers that stopped.
func drainWS(c *websocket.Conn) {
	for {
		if _, _, err := c.NextReader(); err != nil {
			return
		}
	}
}
