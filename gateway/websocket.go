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

// closeWS sends a close frame with a code and a reason (at most 123 bytes
// on the wire), and ends the connection.
func closeWS(c *websocket.Conn, code int, reason string) {
	c.WriteControl(fws.CloseMessage, fws.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
	c.SetReadDeadline(time.Unix(1, 0))
	c.Close()
}
