package gateway

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// WebSocket frames (RFC 6455, section 5), as the CDP proxy reads and
// writes them itself: it relays the browser's frames to the client as
// they come, and reads the client's messages whole to check them.

// Opcodes.
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xa
)

// maxControl bounds the payload of a control frame (ping, pong, close).
const maxControl = 125

var (
	// errProtocol is a frame the proxy refuses: the connection ends.
	errProtocol = errors.New("an invalid websocket frame")
	// errPeerClosed is a close frame from the other side.
	errPeerClosed = errors.New("websocket closed by the peer")
	// errWriteFailed is a write to a connection that failed.
	errWriteFailed = errors.New("websocket write failed")
	// errRelayBroken is a frame's payload cut short on its way, by either
	// side (the copy cannot tell which).
	errRelayBroken = errors.New("websocket frame cut short")
)

func protocolError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errProtocol, fmt.Sprintf(format, args...))
}

// wsHeader is one frame's header.
type wsHeader struct {
	fin    bool
	op     byte
	masked bool
	key    [4]byte
	length int64
}

func (h wsHeader) control() bool { return h.op >= opClose }

// wsReader reads the frames of one direction of a WebSocket and checks
// them as they come, before any payload is read: the bytes are the
// peer's, and a session's Chromium is the session user's to replace.
type wsReader struct {
	r *bufio.Reader
	// raw is the connection under r, read directly for a payload's bytes
	// r does not hold (so that the kernel can splice them); nil reads
	// everything through r.
	raw io.Reader
	// masked tells whether frames must be masked (a client's) or must not
	// be (a server's).
	masked bool
	// limit bounds one message, the sum of its frames' payloads.
	limit int64

	op   byte  // opcode of the data message in progress; 0 when none
	size int64 // bytes announced so far by the message in progress
}

// next reads and checks one frame header; the caller reads its payload
// (length bytes) from f.r before the next call. A message over the limit
// is refused on the header that takes it over, before its payload is read.
func (f *wsReader) next() (wsHeader, error) {
	var h wsHeader
	p, err := f.r.Peek(2)
	if err != nil {
		return h, err
	}
	h.fin = p[0]&0x80 != 0
	h.op = p[0] & 0x0f
	h.masked = p[1]&0x80 != 0
	if p[0]&0x70 != 0 {
		return h, protocolError("reserved bits set (no extension was negotiated)")
	}
	switch h.op {
	case opContinuation, opText, opBinary, opClose, opPing, opPong:
	default:
		return h, protocolError("unknown opcode %#x", h.op)
	}
	if h.masked != f.masked {
		if f.masked {
			return h, protocolError("an unmasked frame from a client")
		}
		return h, protocolError("a masked frame from a server")
	}
	n := 2
	switch p[1] & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if h.masked {
		n += 4
	}
	if p, err = f.r.Peek(n); err != nil {
		return h, unexpected(err)
	}
	switch l := p[1] & 0x7f; l {
	case 126:
		h.length = int64(binary.BigEndian.Uint16(p[2:]))
	case 127:
		u := binary.BigEndian.Uint64(p[2:])
		if u > math.MaxInt64 {
			return h, protocolError("a length with its most significant bit set")
		}
		h.length = int64(u)
	default:
		h.length = int64(l)
	}
	if h.masked {
		copy(h.key[:], p[n-4:])
	}
	f.r.Discard(n)
	if h.control() {
		if !h.fin {
			return h, protocolError("a fragmented control frame")
		}
		if h.length > maxControl {
			return h, protocolError("a control frame of %d bytes", h.length)
		}
		return h, nil
	}
	if h.op == opContinuation {
		if f.op == 0 {
			return h, protocolError("a continuation frame outside a message")
		}
	} else {
		if f.op != 0 {
			return h, protocolError("a new message inside a fragmented one")
		}
		f.op, f.size = h.op, 0
	}
	if h.length > f.limit-f.size {
		return h, fmt.Errorf("%w: over %d bytes", errMessageTooBig, f.limit)
	}
	f.size += h.length
	if h.fin {
		f.op = 0
	}
	return h, nil
}

// unexpected turns the end of the stream inside a frame into an error.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readControl reads the payload of a control frame, unmasked, into buf.
func (f *wsReader) readControl(h wsHeader, buf *[maxControl]byte) ([]byte, error) {
	p := buf[:h.length]
	if _, err := io.ReadFull(f.r, p); err != nil {
		return nil, unexpected(err)
	}
	if h.masked {
		maskBytes(h.key, 0, p)
	}
	return p, nil
}

// readMessage reads one data message whole, unmasked, appending it to
// buf. Control frames on the way go to control; an error from it ends the
// read. The message grows as its bytes arrive, never by what a header
// announces alone.
func (f *wsReader) readMessage(buf []byte, control func(op byte, payload []byte) error) (byte, []byte, error) {
	var ctl [maxControl]byte
	var op byte
	for {
		h, err := f.next()
		if err != nil {
			return 0, buf, err
		}
		if h.control() {
			p, err := f.readControl(h, &ctl)
			if err != nil {
				return 0, buf, err
			}
			if err := control(h.op, p); err != nil {
				return 0, buf, err
			}
			continue
		}
		if h.op != opContinuation {
			op = h.op
		}
		pos := 0
		for rest := h.length; rest > 0; {
			chunk := int(min(rest, 1<<20))
			start := len(buf)
			buf = growDoubling(buf, chunk, f.limit)[:start+chunk]
			if _, err := io.ReadFull(f.r, buf[start:]); err != nil {
				return 0, buf, unexpected(err)
			}
			if h.masked {
				pos = maskBytes(h.key, pos, buf[start:])
			}
			rest -= int64(chunk)
		}
		if h.fin {
			return op, buf, nil
		}
	}
}

// growDoubling makes room for n more bytes, doubling the capacity (at
// most to limit) rather than append's quarter steps: a message grown to
// the limit leaves at most about its own size behind as garbage, not
// four times it (measured: +140 MiB of RSS for a refused 32 MiB message).
func growDoubling(buf []byte, n int, limit int64) []byte {
	if cap(buf)-len(buf) >= n {
		return buf
	}
	want := max(2*cap(buf), len(buf)+n, 64<<10)
	if limit > 0 && int64(want) > limit {
		want = max(int(limit), len(buf)+n)
	}
	grown := make([]byte, len(buf), want)
	copy(grown, buf)
	return grown
}

// relayTo copies data frames to w as they come, header and payload,
// without holding a message: the payload goes from the read buffer, or
// from the connection under it, to w's connection. A fragmented message
// holds w until its last frame, so nothing else is written inside it.
// Control frames go to control instead; an error from it ends the relay.
func (f *wsReader) relayTo(w *wsWriter, control func(op byte, payload []byte) error) error {
	var ctl [maxControl]byte
	locked := false
	defer func() {
		if locked {
			w.mu.Unlock()
		}
	}()
	for {
		h, err := f.next()
		if err != nil {
			return err
		}
		if h.control() {
			p, err := f.readControl(h, &ctl)
			if err != nil {
				return err
			}
			if err := control(h.op, p); err != nil {
				return err
			}
			continue
		}
		if !locked {
			w.mu.Lock()
			locked = true
		}
		if err := w.copyFrameLocked(h, f); err != nil {
			return err
		}
		if h.fin {
			w.mu.Unlock()
			locked = false
		}
	}
}

// wsWriter writes frames to one connection; its mutex makes each frame
// whole on the wire, whoever writes.
type wsWriter struct {
	mu   sync.Mutex
	conn io.Writer
	// mask, when set, masks every frame (a client's frames must be).
	mask *mrand.ChaCha8
	buf  []byte
}

// maxWriteChunk bounds what one write copies into the writer's buffer.
const maxWriteChunk = 64 << 10

func newMaskedWriter(conn io.Writer) *wsWriter {
	var seed [32]byte
	rand.Read(seed[:])
	return &wsWriter{conn: conn, mask: mrand.NewChaCha8(seed)}
}

func appendHeader(b []byte, fin bool, op byte, length int64, key *[4]byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	var m byte
	if key != nil {
		m = 0x80
	}
	switch {
	case length <= 125:
		b = append(b, b0, m|byte(length))
	case length <= math.MaxUint16:
		b = append(b, b0, m|126)
		b = binary.BigEndian.AppendUint16(b, uint16(length))
	default:
		b = append(b, b0, m|127)
		b = binary.BigEndian.AppendUint64(b, uint64(length))
	}
	if key != nil {
		b = append(b, key[:]...)
	}
	return b
}

// maskBytes masks (or unmasks) b, which starts at pos in its frame's
// payload, and returns the position after it.
func maskBytes(key [4]byte, pos int, b []byte) int {
	for i := range b {
		b[i] ^= key[(pos+i)&3]
	}
	return pos + len(b)
}

// writeFrame writes payload as one final frame of op.
func (w *wsWriter) writeFrame(op byte, payload []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writeFrameLocked(op, payload)
}

func (w *wsWriter) writeFrameLocked(op byte, payload []byte) error {
	var key *[4]byte
	if w.mask != nil {
		key = new([4]byte)
		binary.LittleEndian.PutUint32(key[:], uint32(w.mask.Uint64()))
	}
	w.buf = appendHeader(w.buf[:0], true, op, int64(len(payload)), key)
	pos := 0
	for {
		chunk := payload[:min(len(payload), maxWriteChunk)]
		payload = payload[len(chunk):]
		start := len(w.buf)
		w.buf = append(w.buf, chunk...)
		if key != nil {
			pos = maskBytes(*key, pos, w.buf[start:])
		}
		if _, err := w.conn.Write(w.buf); err != nil {
			return fmt.Errorf("%w: %v", errWriteFailed, err)
		}
		if len(payload) == 0 {
			return nil
		}
		w.buf = w.buf[:0]
	}
}

// closeFrame writes a close frame with code and reason, unless a relayed
// message holds the writer: the close frame is a courtesy, not worth
// waiting for a peer that may never finish.
func (w *wsWriter) closeFrame(code int, reason string) {
	if !w.mu.TryLock() {
		return
	}
	defer w.mu.Unlock()
	p := binary.BigEndian.AppendUint16(nil, uint16(code))
	p = append(p, reason[:min(len(reason), maxControl-2)]...)
	w.writeFrameLocked(opClose, p)
}

// copyFrameLocked writes h and copies its payload from f: what f's buffer
// holds with the header in one write, the rest straight from f.raw.
func (w *wsWriter) copyFrameLocked(h wsHeader, f *wsReader) error {
	w.buf = appendHeader(w.buf[:0], h.fin, h.op, h.length, nil)
	held := int(min(h.length, int64(f.r.Buffered())))
	p, _ := f.r.Peek(held)
	w.buf = append(w.buf, p...)
	f.r.Discard(held)
	if _, err := w.conn.Write(w.buf); err != nil {
		return fmt.Errorf("%w: %v", errWriteFailed, err)
	}
	rest := h.length - int64(held)
	if rest == 0 {
		return nil
	}
	// f's buffer is empty now, so the connection under it is next.
	src := f.raw
	if src == nil {
		src = f.r
	}
	if _, err := io.CopyN(w.conn, src, rest); err != nil {
		return fmt.Errorf("%w: %v", errRelayBroken, err)
	}
	return nil
}

// maxHandshake bounds the browser's answer to the WebSocket handshake.
const maxHandshake = 16 << 10

// dialBrowser opens a WebSocket to target (ws://host:port/path) with no
// extension, and returns the connection with the reader that read the
// handshake: frames the browser sent after it may be in its buffer.
func dialBrowser(ctx context.Context, target string) (net.Conn, *bufio.Reader, error) {
	u, err := url.Parse(target)
	if err != nil || u.Scheme != "ws" {
		return nil, nil, fmt.Errorf("bad browser url %q", target)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, nil, err
	}
	// A cancel ends the handshake too, not only its deadline.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	br, err := handshake(ctx, conn, u)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, br, nil
}

const websocketGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

func acceptKey(key string) string {
	h := sha1.Sum([]byte(key + websocketGUID))
	return base64.StdEncoding.EncodeToString(h[:])
}

func handshake(ctx context.Context, conn net.Conn, u *url.URL) (*bufio.Reader, error) {
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
		defer conn.SetDeadline(time.Time{})
	}
	var nonce [16]byte
	rand.Read(nonce[:])
	key := base64.StdEncoding.EncodeToString(nonce[:])
	req := "GET " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host +
		"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: " + key +
		"\r\nSec-WebSocket-Version: 13\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return nil, err
	}
	// The answer is bounded; once read, the reader is the frames' source.
	lim := &io.LimitedReader{R: conn, N: maxHandshake}
	br := bufio.NewReaderSize(lim, 64<<10)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, fmt.Errorf("browser handshake: %w", err)
	}
	switch {
	case resp.StatusCode != http.StatusSwitchingProtocols:
		return nil, fmt.Errorf("browser handshake: status %d", resp.StatusCode)
	case !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket"):
		return nil, errors.New("browser handshake: no upgrade to websocket")
	case resp.Header.Get("Sec-WebSocket-Accept") != acceptKey(key):
		return nil, errors.New("browser handshake: wrong Sec-WebSocket-Accept")
	case resp.Header.Get("Sec-WebSocket-Extensions") != "":
		return nil, errors.New("browser handshake: an extension nobody asked for")
	}
	lim.N = math.MaxInt64
	return br, nil
}
