package gateway

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/contrib/websocket"
	"github.com/gofiber/fiber/v2"
	gws "github.com/gorilla/websocket"
)

// TestReadMessageLimit: a message of the limit passes, one byte more
// closes the connection with 1009 and a reason, also when it comes in
// many frames.
func TestReadMessageLimit(t *testing.T) {
	const limit = 64 << 10
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Get("/ws", websocket.New(func(c *websocket.Conn) {
		for {
			mt, data, err := readMessage(c, limit)
			if errors.Is(err, errMessageTooBig) {
				abortWS(c, gws.CloseMessageTooBig, tooBigReason(limit))
				return
			}
			if err != nil {
				return
			}
			c.WriteMessage(mt, []byte{byte(len(data) >> 16), byte(len(data) >> 8), byte(len(data))})
		}
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go app.Listener(l)
	t.Cleanup(func() { app.Shutdown() })
	// A write buffer larger than a message sends it as one frame.
	dial := func(t *testing.T, wbuf int) *gws.Conn {
		d := gws.Dialer{WriteBufferSize: wbuf, HandshakeTimeout: 10 * time.Second}
		c, _, err := d.Dial("ws://"+l.Addr().String()+"/ws", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		return c
	}
	t.Run("at the limit", func(t *testing.T) {
		c := dial(t, 0)
		for _, n := range []int{1, limit} {
			if err := c.WriteMessage(gws.BinaryMessage, bytes.Repeat([]byte{'x'}, n)); err != nil {
				t.Fatal(err)
			}
			_, got, err := c.ReadMessage()
			if err != nil || int(got[0])<<16|int(got[1])<<8|int(got[2]) != n {
				t.Fatalf("message of %d bytes: %v %v", n, got, err)
			}
		}
	})
	for _, tc := range []struct {
		name   string
		frames int
		wbuf   int
	}{{"one frame", 1, 2 * limit}, {"many frames", 64, 1024}} {
		t.Run("over the limit, "+tc.name, func(t *testing.T) {
			c := dial(t, tc.wbuf)
			w, err := c.NextWriter(gws.BinaryMessage)
			if err != nil {
				t.Fatal(err)
			}
			part := bytes.Repeat([]byte{'x'}, (limit+tc.frames)/tc.frames+1)
			for i := 0; i < tc.frames; i++ {
				w.Write(part)
			}
			w.Close()
			_, _, err = c.ReadMessage()
			var ce *gws.CloseError
			if !errors.As(err, &ce) || ce.Code != gws.CloseMessageTooBig || !strings.Contains(ce.Text, "larger than") {
				t.Fatalf("want close 1009 with a reason, got %v", err)
			}
		})
	}
}
