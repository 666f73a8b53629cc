// Package desktop owns the session's display from the gateway's side: the
// RFB (VNC) client that captures the screen, the filter that reads what VNC
// viewers send and drops their input for view-only previews, and the
// computer-use actions that drive the display inside the session.
package desktop

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"io"
	"net"
	"time"
)

// ErrProtocol is a malformed or unsupported RFB message.
var ErrProtocol = errors.New("rfb protocol error")

// RFB message types.
const (
	msgSetPixelFormat   = 0
	msgSetEncodings     = 2
	msgFBUpdateRequest  = 3
	msgKeyEvent         = 4
	msgPointerEvent     = 5
	msgClientCutText    = 6
	msgEnableContinuous = 150
	msgClientFence      = 248
	msgXvp              = 250
	msgSetDesktopSize   = 251
	msgQEMU             = 255

	srvFramebufferUpdate = 0
	srvSetColourMap      = 1
	srvBell              = 2
	srvServerCutText     = 3

	encRaw = 0
)

// Client is a minimal RFB 3.8 client: raw encoding, 32-bit true colour.
// It reads the screen and can send pointer and key events.
type Client struct {
	conn   io.ReadWriteCloser
	r      *bufio.Reader
	Width  int
	Height int
	Name   string
	fb     *image.RGBA
}

// Dial connects to a VNC server at addr and completes the handshake.
func Dial(ctx context.Context, addr string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	c, err := Handshake(conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return c, nil
}

// Handshake runs the RFB handshake over conn (security type None, shared
// session) and sets a 32-bit pixel format and the raw encoding.
func Handshake(conn io.ReadWriteCloser) (*Client, error) {
	c := &Client{conn: conn, r: bufio.NewReaderSize(conn, 1<<20)}
	var ver [12]byte
	if _, err := io.ReadFull(c.r, ver[:]); err != nil {
		return nil, fmt.Errorf("read server version: %w", err)
	}
	if string(ver[:4]) != "RFB " {
		return nil, fmt.Errorf("%w: not an RFB server", ErrProtocol)
	}
	if _, err := conn.Write([]byte("RFB 003.008\n")); err != nil {
		return nil, err
	}
	n, err := c.r.ReadByte()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: server refused: %s", ErrProtocol, c.readReason())
	}
	types := make([]byte, n)
	if _, err := io.ReadFull(c.r, types); err != nil {
		return nil, err
	}
	none := false
	for _, t := range types {
		none = none || t == 1
	}
	if !none {
		return nil, fmt.Errorf("%w: server offers no security type None", ErrProtocol)
	}
	if _, err := conn.Write([]byte{1}); err != nil {
		return nil, err
	}
	var result uint32
	if err := binary.Read(c.r, binary.BigEndian, &result); err != nil {
		return nil, err
	}
	if result != 0 {
		return nil, fmt.Errorf("%w: security failed: %s", ErrProtocol, c.readReason())
	}
	if _, err := conn.Write([]byte{1}); err != nil { // ClientInit: shared
		return nil, err
	}
	var init struct {
		W, H uint16
		PF   [16]byte
		NLen uint32
	}
	if err := binary.Read(c.r, binary.BigEndian, &init); err != nil {
		return nil, fmt.Errorf("read server init: %w", err)
	}
	if init.NLen > 1<<16 {
		return nil, fmt.Errorf("%w: desktop name too long", ErrProtocol)
	}
	name := make([]byte, init.NLen)
	if _, err := io.ReadFull(c.r, name); err != nil {
		return nil, err
	}
	c.Width, c.Height, c.Name = int(init.W), int(init.H), string(name)
	c.fb = image.NewRGBA(image.Rect(0, 0, c.Width, c.Height))

	// 32 bpp, depth 24, little endian, true colour, 8 bits each, shifts
	// red 0, green 8, blue 16: bytes arrive as R, G, B, X.
	pf := []byte{msgSetPixelFormat, 0, 0, 0, 32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 0, 8, 16, 0, 0, 0}
	enc := []byte{msgSetEncodings, 0, 0, 1, 0, 0, 0, encRaw}
	if _, err := conn.Write(append(pf, enc...)); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Client) readReason() string {
	var n uint32
	if binary.Read(c.r, binary.BigEndian, &n) != nil || n > 4096 {
		return "(no reason)"
	}
	b := make([]byte, n)
	io.ReadFull(c.r, b)
	return string(b)
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// RequestUpdate asks for the whole screen, or only what changed.
func (c *Client) RequestUpdate(incremental bool) error {
	msg := make([]byte, 10)
	msg[0] = msgFBUpdateRequest
	if incremental {
		msg[1] = 1
	}
	binary.BigEndian.PutUint16(msg[6:], uint16(c.Width))
	binary.BigEndian.PutUint16(msg[8:], uint16(c.Height))
	_, err := c.conn.Write(msg)
	return err
}

// ReadUpdate reads server messages until a framebuffer update has been
// applied, and returns the rectangles it changed and their bytes.
func (c *Client) ReadUpdate() (rects []image.Rectangle, n int, err error) {
	for {
		t, err := c.r.ReadByte()
		if err != nil {
			return nil, 0, err
		}
		switch t {
		case srvFramebufferUpdate:
			var h struct {
				Pad   byte
				Count uint16
			}
			if err := binary.Read(c.r, binary.BigEndian, &h); err != nil {
				return nil, 0, err
			}
			for i := 0; i < int(h.Count); i++ {
				var r struct {
					X, Y, W, H uint16
					Enc        int32
				}
				if err := binary.Read(c.r, binary.BigEndian, &r); err != nil {
					return nil, 0, err
				}
				if r.Enc != encRaw {
					return nil, 0, fmt.Errorf("%w: unexpected encoding %d", ErrProtocol, r.Enc)
				}
				rect := image.Rect(int(r.X), int(r.Y), int(r.X)+int(r.W), int(r.Y)+int(r.H))
				if !rect.In(c.fb.Bounds()) {
					return nil, 0, fmt.Errorf("%w: rectangle %v outside the screen", ErrProtocol, rect)
				}
				row := make([]byte, int(r.W)*4)
				for y := rect.Min.Y; y < rect.Max.Y; y++ {
					if _, err := io.ReadFull(c.r, row); err != nil {
						return nil, 0, err
					}
					off := c.fb.PixOffset(rect.Min.X, y)
					copy(c.fb.Pix[off:off+len(row)], row)
					for x := 0; x < int(r.W); x++ {
						c.fb.Pix[off+x*4+3] = 255
					}
				}
				n += len(row) * int(r.H)
				rects = append(rects, rect)
			}
			return rects, n, nil
		case srvSetColourMap:
			var h struct {
				Pad         byte
				First, Nums uint16
			}
			if err := binary.Read(c.r, binary.BigEndian, &h); err != nil {
				return nil, 0, err
			}
			if _, err := c.r.Discard(int(h.Nums) * 6); err != nil {
				return nil, 0, err
			}
		case srvBell:
		case srvServerCutText:
			var h struct {
				Pad [3]byte
				Len uint32
			}
			if err := binary.Read(c.r, binary.BigEndian, &h); err != nil {
				return nil, 0, err
			}
			if h.Len > 16<<20 {
				return nil, 0, fmt.Errorf("%w: cut text too long", ErrProtocol)
			}
			if _, err := c.r.Discard(int(h.Len)); err != nil {
				return nil, 0, err
			}
		default:
			return nil, 0, fmt.Errorf("%w: unknown server message %d", ErrProtocol, t)
		}
	}
}

// Framebuffer is the client's copy of the screen, which ReadUpdate
// changes: read it only between calls to ReadUpdate.
func (c *Client) Framebuffer() *image.RGBA { return c.fb }

// Capture returns the whole screen as it is now.
func (c *Client) Capture() (*image.RGBA, error) {
	if err := c.RequestUpdate(false); err != nil {
		return nil, err
	}
	covered := image.Rectangle{}
	for covered != c.fb.Bounds() {
		rects, _, err := c.ReadUpdate()
		if err != nil {
			return nil, err
		}
		for _, r := range rects {
			covered = covered.Union(r)
		}
		if covered != c.fb.Bounds() {
			if err := c.RequestUpdate(false); err != nil {
				return nil, err
			}
		}
	}
	out := image.NewRGBA(c.fb.Bounds())
	copy(out.Pix, c.fb.Pix)
	return out, nil
}

// Pointer moves the pointer to x, y with the buttons in mask pressed.
func (c *Client) Pointer(x, y int, mask byte) error {
	msg := []byte{msgPointerEvent, mask, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(msg[2:], uint16(x))
	binary.BigEndian.PutUint16(msg[4:], uint16(y))
	_, err := c.conn.Write(msg)
	return err
}

// Key presses or releases the key with the X keysym.
func (c *Client) Key(down bool, keysym uint32) error {
	msg := []byte{msgKeyEvent, 0, 0, 0, 0, 0, 0, 0}
	if down {
		msg[1] = 1
	}
	binary.BigEndian.PutUint32(msg[4:], keysym)
	_, err := c.conn.Write(msg)
	return err
}

// Capture connects to the VNC server at addr and returns the screen.
func Capture(ctx context.Context, addr string) (*image.RGBA, error) {
	c, err := Dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("vnc: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		if nc, ok := c.conn.(net.Conn); ok {
			nc.SetDeadline(dl)
		}
	}
	return c.Capture()
}
