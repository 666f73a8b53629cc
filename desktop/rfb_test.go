package desktop

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"image"
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// rfbServer is an in-process fake VNC server: serve runs once per
// connection, after the handshake's opening bytes it writes itself.
func rfbServer(t testing.TB, serve func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// serverInit is what a server sends up to and with ServerInit, for
// security type None.
func serverInit(w, h uint16, nameLen uint32, name string) []byte {
	var b bytes.Buffer
	b.WriteString("RFB 003.008\n")
	b.Write([]byte{1, 1})       // one security type: None
	b.Write([]byte{0, 0, 0, 0}) // security result: OK
	binary.Write(&b, binary.BigEndian, struct {
		W, H uint16
		PF   [16]byte
		NLen uint32
	}{w, h, [16]byte{32, 24, 0, 1}, nameLen})
	b.WriteString(name)
	return b.Bytes()
}

// rawRect is one raw rectangle of an update, filled with c.
func rawRect(x, y, w, h uint16, c [4]byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, struct {
		X, Y, W, H uint16
		Enc        int32
	}{x, y, w, h, encRaw})
	for i := 0; i < int(w)*int(h); i++ {
		b.Write(c[:])
	}
	return b.Bytes()
}

func update(rects ...[]byte) []byte {
	b := []byte{srvFramebufferUpdate, 0, 0, byte(len(rects))}
	for _, r := range rects {
		b = append(b, r...)
	}
	return b
}

// clientRequests reads and discards what the client sends: its version,
// security choice, ClientInit, pixel format and encodings (12+1+1+20+8),
// then one message for each update request it makes, calling onRequest.
func clientRequests(c net.Conn, onRequest func()) {
	if _, err := io.ReadFull(c, make([]byte, 12)); err != nil {
		return
	}
	if _, err := io.ReadFull(c, make([]byte, 2+20+8)); err != nil {
		return
	}
	for {
		if _, err := io.ReadFull(c, make([]byte, 10)); err != nil {
			return
		}
		if onRequest != nil {
			onRequest()
		}
	}
}

// wellBehaved serves a w x h screen in one colour.
func wellBehaved(w, h uint16, c [4]byte) func(net.Conn) {
	return func(conn net.Conn) {
		conn.Write(serverInit(w, h, 4, "good"))
		clientRequests(conn, func() { conn.Write(update(rawRect(0, 0, w, h, c))) })
	}
}

// allocated runs f and returns the bytes it allocated on the heap.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestCaptureWellBehaved(t *testing.T) {
	addr := rfbServer(t, wellBehaved(320, 200, [4]byte{10, 20, 30, 0}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var img *image.RGBA
	var err error
	n := allocated(func() { img, err = Capture(ctx, addr, 1280, 800) })
	if err != nil {
		t.Fatal(err)
	}
	if img.Bounds() != image.Rect(0, 0, 320, 200) {
		t.Fatalf("bounds %v", img.Bounds())
	}
	if got := img.RGBAAt(319, 199); got.R != 10 || got.G != 20 || got.B != 30 || got.A != 255 {
		t.Fatalf("pixel %v", got)
	}
	// The allocation measure sees a screen's worth: the bounds below on
	// hostile servers are not vacuous.
	if n < 320*200*4 {
		t.Fatalf("allocated %d bytes for a 320x200 screen; the measure is broken", n)
	}
}

// TestCaptureHostileServer: a server inside a session announcing more than
// the session's screen, or sending lengths and rectangles past it, is
// refused quickly and costs the gateway almost nothing.
func TestCaptureHostileServer(t *testing.T) {
	const maxW, maxH = 1280, 800
	red := [4]byte{255, 0, 0, 0}
	cases := map[string]func(net.Conn){
		"huge screen": func(c net.Conn) {
			c.Write(serverInit(65535, 65535, 0, ""))
			clientRequests(c, func() {
				// Would it ask, it would get endless rows.
				for {
					if _, err := c.Write(make([]byte, 1<<20)); err != nil {
						return
					}
				}
			})
		},
		"wider than the session": func(c net.Conn) {
			c.Write(serverInit(maxW+1, maxH, 0, ""))
			clientRequests(c, nil)
		},
		"empty screen": func(c net.Conn) {
			c.Write(serverInit(0, 0, 0, ""))
			clientRequests(c, nil)
		},
		"huge name": func(c net.Conn) {
			c.Write(serverInit(320, 200, 0xffffffff, "x"))
			clientRequests(c, nil)
		},
		"huge refusal reason": func(c net.Conn) {
			c.Write([]byte("RFB 003.008\n\x00\x7f\xff\xff\xff"))
			clientRequests(c, nil)
		},
		"rectangle outside": func(c net.Conn) {
			c.Write(serverInit(320, 200, 0, ""))
			clientRequests(c, func() { c.Write(update(rawRect(300, 0, 40, 1, red))) })
		},
		"rectangle past the bottom, no width": func(c net.Conn) {
			c.Write(serverInit(320, 200, 0, ""))
			clientRequests(c, func() { c.Write(update(rawRect(0, 190, 0, 65535, red))) })
		},
		"rectangle at 65535": func(c net.Conn) {
			c.Write(serverInit(320, 200, 0, ""))
			clientRequests(c, func() {
				// Only the header: the pixels would be 16 GiB.
				c.Write(update(rawRect(65535, 65535, 0, 0, red)[:0], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}))
			})
		},
		"huge cut text": func(c net.Conn) {
			c.Write(serverInit(320, 200, 0, ""))
			clientRequests(c, func() { c.Write([]byte{srvServerCutText, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff}) })
		},
		"huge extended cut text": func(c net.Conn) {
			c.Write(serverInit(320, 200, 0, ""))
			clientRequests(c, func() { c.Write([]byte{srvServerCutText, 0, 0, 0, 0x80, 0, 0, 1}) })
		},
		"huge colour map": func(c net.Conn) {
			c.Write(serverInit(320, 200, 0, ""))
			clientRequests(c, func() { c.Write([]byte{srvSetColourMap, 0, 0, 0, 0xff, 0xff}) })
		},
		"too many rectangles": func(c net.Conn) {
			c.Write(serverInit(320, 200, 0, ""))
			clientRequests(c, func() { c.Write([]byte{srvFramebufferUpdate, 0, 0xff, 0xff}) })
		},
		"other encoding": func(c net.Conn) {
			c.Write(serverInit(320, 200, 0, ""))
			clientRequests(c, func() {
				r := rawRect(0, 0, 0, 0, red)
				binary.BigEndian.PutUint32(r[8:], 0xffffff21) // DesktopSize
				c.Write(update(r))
			})
		},
	}
	for name, serve := range cases {
		t.Run(name, func(t *testing.T) {
			addr := rfbServer(t, serve)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			var err error
			n := allocated(func() { _, err = Capture(ctx, addr, maxW, maxH) })
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("err %v, want ErrProtocol", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("refused after %v", d)
			}
			// The read buffer and a 320x200 screen at most; nothing the
			// server named (65535x65535 would be 16 GiB).
			if limit := uint64(2 << 20); n > limit {
				t.Errorf("allocated %d bytes, at most %d", n, limit)
			}
			t.Logf("%v: %d bytes allocated", err, n)
		})
	}
}

// TestCaptureSilentServer: a server that stops talking costs the caller
// no more than its deadline.
func TestCaptureSilentServer(t *testing.T) {
	addr := rfbServer(t, func(c net.Conn) {
		c.Write(serverInit(320, 200, 0, ""))
		clientRequests(c, func() {})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Capture(ctx, addr, 1280, 800)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("err %v, want a timeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("gave up after %v, the deadline was 300ms", d)
	}
}

// TestReadUpdatePartial: updates covering parts of the screen land where
// they say, with the others untouched.
func TestReadUpdatePartial(t *testing.T) {
	var in bytes.Buffer
	in.Write(serverInit(4, 3, 0, ""))
	in.Write(update(rawRect(1, 1, 2, 2, [4]byte{1, 2, 3, 0}), rawRect(0, 0, 0, 0, [4]byte{})))
	c, err := Handshake(&pipe{r: &in}, 4, 3)
	if err != nil {
		t.Fatal(err)
	}
	rects, n, err := c.ReadUpdate()
	if err != nil || len(rects) != 1 || n != 16 {
		t.Fatalf("rects %v n %d err %v", rects, n, err)
	}
	fb := c.Framebuffer()
	if fb.RGBAAt(2, 2).R != 1 || fb.RGBAAt(0, 0).R != 0 || fb.RGBAAt(3, 2).R != 0 {
		t.Fatalf("framebuffer %v", fb.Pix)
	}
}

// pipe is a connection whose server side is a fixed byte stream.
type pipe struct{ r io.Reader }

func (p *pipe) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p *pipe) Write(b []byte) (int, error) { return len(b), nil }
func (p *pipe) Close() error                { return nil }

// FuzzClient feeds the client what a hostile server might send: it must
// never panic, never accept a screen over its limit, and never report a
// rectangle outside the screen.
func FuzzClient(f *testing.F) {
	f.Add(append(serverInit(8, 6, 4, "good"), update(rawRect(0, 0, 8, 6, [4]byte{1, 2, 3}))...))
	f.Add(append(serverInit(8, 6, 0, ""), update(rawRect(7, 5, 1, 1, [4]byte{1}), rawRect(0, 0, 2, 1, [4]byte{2}))...))
	f.Add(append(serverInit(8, 6, 0, ""), []byte{srvBell, srvServerCutText, 0, 0, 0, 0, 0, 0, 2, 'h', 'i', srvSetColourMap, 0, 0, 0, 0, 1, 1, 2, 3, 4, 5, 6}...))
	f.Add(serverInit(65535, 65535, 0, ""))
	f.Add([]byte("RFB 003.008\n\x00\x00\x00\x00\x03bad"))
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxW, maxH = 16, 12
		c, err := Handshake(&pipe{r: bytes.NewReader(data)}, maxW, maxH)
		if err != nil {
			return
		}
		if c.Width < 1 || c.Height < 1 || c.Width > maxW || c.Height > maxH {
			t.Fatalf("accepted a %dx%d screen over %dx%d", c.Width, c.Height, maxW, maxH)
		}
		if len(c.Name) > maxNameLen {
			t.Fatalf("name of %d bytes", len(c.Name))
		}
		screen := image.Rect(0, 0, c.Width, c.Height)
		for {
			rects, n, err := c.ReadUpdate()
			if err != nil {
				return
			}
			total := 0
			for _, r := range rects {
				if r.Empty() || !r.In(screen) {
					t.Fatalf("rectangle %v outside %v", r, screen)
				}
				total += r.Dx() * r.Dy() * 4
			}
			if n != total {
				t.Fatalf("n %d, rectangles hold %d", n, total)
			}
		}
	})
}
