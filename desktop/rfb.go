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

// Limits on what an RFB server may send the client, besides the screen
// size the caller configured.
const (
	maxNameLen   = 4096    // desktop name in ServerInit
	maxReasonLen = 4096    // failure reasons
	maxCutText   = 1 << 20 // clipboard text either way
	maxRects     = 1 << 14 // rectangles in one framebuffer update
)

// Client is a minimal RFB 3.8 client: raw encoding, 32-bit true colour.
// It reads the screen and can send pointer and key events.
//
// Everything the server sends is bounded by what the caller configured:
// the screen may be at most maxW x maxH (the session's configured
// screen), every rectangle must lie inside it, and every length field is
// checked before anything is read or allocated. A violation is an
// ErrProtocol and the connection is of no further use.
type Client struct {
	conn   io.ReadWriteCloser
	r      *bufio.Reader
	Width  int
	Height int
	Name   string
	fb     *image.RGBA
}

// Dial connects to a VNC server at addr and completes the handshake,
// refusing a screen larger than maxW x maxH.
func Dial(ctx context.Context, addr string, maxW, maxH int) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	c, err := Handshake(conn, maxW, maxH)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return c, nil
}

// Handshake runs the RFB handshake over conn (security type None, shared
// session) and sets a 32-bit pixel format and the raw encoding. A server
// announcing a screen larger than maxW x maxH is refused before anything
// is allocated for it.
func Handshake(conn io.ReadWriteCloser, maxW, maxH int) (*Client, error) {
	if maxW <= 0 || maxH <= 0 || maxW > 0xffff || maxH > 0xffff {
		return nil, fmt.Errorf("rfb: screen limit %dx%d is not a valid size", maxW, maxH)
	}
	c := &Client{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
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
	types := make([]byte, n) // at most 255
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
	if init.W == 0 || init.H == 0 || int(init.W) > maxW || int(init.H) > maxH {
		return nil, fmt.Errorf("%w: server announces a %dx%d screen, the session's is at most %dx%d", ErrProtocol, init.W, init.H, maxW, maxH)
	}
	if init.NLen > maxNameLen {
		return nil, fmt.Errorf("%w: desktop name of %d bytes, at most %d", ErrProtocol, init.NLen, maxNameLen)
	}
	name := make([]byte, init.NLen)
	if _, err := io.ReadFull(c.r, name); err != nil {
		return nil, err
	}
	c.Width, c.Height, c.Name = int(init.W), int(init.H), sanitize(name)
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
	if binary.Read(c.r, binary.BigEndian, &n) != nil || n > maxReasonLen {
		return "(no reason)"
	}
	b := make([]byte, n)
	io.ReadFull(c.r, b)
	return sanitize(b)
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
			if h.Count > maxRects {
				return nil, 0, fmt.Errorf("%w: %d rectangles in one update, at most %d", ErrProtocol, h.Count, maxRects)
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
				x, y, w, hh := int(r.X), int(r.Y), int(r.W), int(r.H)
				if x+w > c.Width || y+hh > c.Height {
					return nil, 0, fmt.Errorf("%w: rectangle %dx%d at (%d,%d) outside the %dx%d screen", ErrProtocol, w, hh, x, y, c.Width, c.Height)
				}
				if w == 0 || hh == 0 {
					continue
				}
				rect := image.Rect(x, y, x+w, y+hh)
				for row := rect.Min.Y; row < rect.Max.Y; row++ {
					off := c.fb.PixOffset(rect.Min.X, row)
					line := c.fb.Pix[off : off+w*4]
					if _, err := io.ReadFull(c.r, line); err != nil {
						return nil, 0, err
					}
					for i := 3; i < len(line); i += 4 {
						line[i] = 255
					}
				}
				n += w * 4 * hh
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
			if int(h.First)+int(h.Nums) > 256 {
				return nil, 0, fmt.Errorf("%w: colour map of %d entries from %d, at most 256", ErrProtocol, h.Nums, h.First)
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
			l := int64(int32(h.Len))
			if l < 0 { // extended clipboard: the length is negated
				l = -l
			}
			if l > maxCutText {
				return nil, 0, fmt.Errorf("%w: clipboard text of %d bytes, at most %d", ErrProtocol, l, maxCutText)
			}
			if _, err := c.r.Discard(int(l)); err != nil {
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

// Capture connects to the VNC server at addr and returns the screen, which
// may be at most maxW x maxH.
func Capture(ctx context.Context, addr string, maxW, maxH int) (*image.RGBA, error) {
	c, err := Dial(ctx, addr, maxW, maxH)
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
