package desktop

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
)

// Limits on what a viewer may send (clipboard text: maxCutText).
const (
	maxEncodings = 256
	maxBuffered  = maxCutText + 16
)

type filterState int

const (
	stVersion filterState = iota
	stSecurity
	stVNCAuth
	stClientInit
	stMessages
)

// Filter sits between a VNC viewer and the session's VNC server.
//
// Feed reads the byte stream the viewer sends and passes on only whole,
// well-formed RFB messages, each bounded in size. With ViewOnly it drops
// every message that acts on the session: pointer, keys, clipboard,
// desktop resizing (SetDesktopSize) and power (xvp) requests. It forces
// the shared flag, so one viewer cannot disconnect the others.
//
// FromServer checks what the session's server sends the viewer, up to and
// including ServerInit: every length is bounded and the screen may be at
// most MaxWidth x MaxHeight, the session's configured screen. Feed and
// FromServer may run in two goroutines, one for each direction.
type Filter struct {
	ViewOnly bool
	// MaxWidth and MaxHeight bound the screen the server may announce.
	MaxWidth, MaxHeight int

	state filterState
	buf   []byte
	// Dropped counts messages withheld from the server.
	Dropped int

	// What the viewer chose, for reading the server's side: the minor
	// protocol version and the security type (0: not chosen yet).
	minor, security atomic.Int32
	srv             serverState
	srvBuf          []byte
	srvW, srvH      int // the screen ServerInit announced
}

// Feed takes the next bytes from the viewer and returns those to forward.
// An error means the stream is malformed; the connection must be closed.
func (f *Filter) Feed(p []byte) ([]byte, error) {
	var out []byte
	// Take the input in pieces, so that no more than one message and one
	// piece is ever held, however large p is.
	for len(p) > 0 {
		n := min(len(p), maxBuffered)
		o, err := f.feed(p[:n])
		if err != nil {
			return nil, err
		}
		out = append(out, o...)
		p = p[n:]
	}
	return out, nil
}

func (f *Filter) feed(p []byte) ([]byte, error) {
	f.buf = append(f.buf, p...)
	var out []byte
	for {
		n, forward, err := f.next()
		if err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
		if forward {
			out = append(out, f.buf[:n]...)
		} else {
			f.Dropped++
		}
		f.buf = f.buf[n:]
	}
	if len(f.buf) > maxBuffered {
		return nil, fmt.Errorf("%w: message too large", ErrProtocol)
	}
	// Keep the backing array from growing without bound.
	f.buf = append([]byte(nil), f.buf...)
	return out, nil
}

// next returns the length of the next complete message in buf (0 when it
// is not complete yet) and whether to forward it.
func (f *Filter) next() (int, bool, error) {
	b := f.buf
	switch f.state {
	case stVersion:
		if len(b) < 12 {
			return 0, false, nil
		}
		v := string(b[:12])
		if v != "RFB 003.008\n" && v != "RFB 003.007\n" {
			return 0, false, fmt.Errorf("%w: unsupported protocol version %q", ErrProtocol, sanitize(b[:12]))
		}
		f.minor.Store(int32(b[10] - '0'))
		f.state = stSecurity
		return 12, true, nil
	case stSecurity:
		if len(b) < 1 {
			return 0, false, nil
		}
		switch b[0] {
		case 1:
			f.state = stClientInit
		case 2:
			f.state = stVNCAuth
		default:
			return 0, false, fmt.Errorf("%w: unsupported security type %d", ErrProtocol, b[0])
		}
		f.security.Store(int32(b[0]))
		return 1, true, nil
	case stVNCAuth:
		if len(b) < 16 {
			return 0, false, nil
		}
		f.state = stClientInit
		return 16, true, nil
	case stClientInit:
		if len(b) < 1 {
			return 0, false, nil
		}
		b[0] = 1 // shared
		f.state = stMessages
		return 1, true, nil
	}
	if len(b) < 1 {
		return 0, false, nil
	}
	input := false
	var n int
	switch b[0] {
	case msgSetPixelFormat:
		n = 20
	case msgSetEncodings:
		if len(b) < 4 {
			return 0, false, nil
		}
		count := int(binary.BigEndian.Uint16(b[2:]))
		if count > maxEncodings {
			return 0, false, fmt.Errorf("%w: %d encodings, at most %d", ErrProtocol, count, maxEncodings)
		}
		n = 4 + 4*count
	case msgFBUpdateRequest:
		n = 10
	case msgKeyEvent:
		n, input = 8, true
	case msgPointerEvent:
		n, input = 6, true
	case msgClientCutText:
		if len(b) < 8 {
			return 0, false, nil
		}
		l := int32(binary.BigEndian.Uint32(b[4:]))
		if l < 0 { // extended clipboard: the length is negated
			l = -l
		}
		if l > maxCutText {
			return 0, false, fmt.Errorf("%w: clipboard text of %d bytes, at most %d", ErrProtocol, l, maxCutText)
		}
		n, input = 8+int(l), true
	case msgEnableContinuous:
		n = 10
	case msgClientFence:
		if len(b) < 9 {
			return 0, false, nil
		}
		l := int(b[8])
		if l > 64 {
			return 0, false, fmt.Errorf("%w: fence payload of %d bytes", ErrProtocol, l)
		}
		n = 9 + l
	case msgXvp:
		n, input = 4, true
	case msgSetDesktopSize: // never forwarded from a view-only viewer
		if len(b) < 8 {
			return 0, false, nil
		}
		n, input = 8+16*int(b[6]), true // at most 255 screens
	case msgQEMU:
		if len(b) < 2 {
			return 0, false, nil
		}
		if b[1] != 0 {
			return 0, false, fmt.Errorf("%w: unsupported QEMU message %d", ErrProtocol, b[1])
		}
		n, input = 12, true // extended key event
	default:
		return 0, false, fmt.Errorf("%w: unsupported client message type %d", ErrProtocol, b[0])
	}
	if len(b) < n {
		return 0, false, nil
	}
	return n, !(input && f.ViewOnly), nil
}

func sanitize(b []byte) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c >= 0x20 && c < 0x7f {
			out = append(out, c)
		} else {
			out = append(out, '.')
		}
	}
	return string(out)
}

// The server's side, up to ServerInit.
type serverState int

const (
	srvVersion serverState = iota
	srvSecurityTypes
	srvChallenge
	srvSecurityResult
	srvInit
	srvMessages
	srvRefused // the server gave a failure reason and must close
)

// FromServer checks the next bytes the session's VNC server sends the
// viewer; they are forwarded unchanged when it returns nil. An error
// means the server broke the protocol or announced more than the
// session's screen; the connection must be closed. After ServerInit the
// bytes are not held or parsed: the gateway copies them with a buffer of
// its own size, and the viewer sees the screen ServerInit announced.
func (f *Filter) FromServer(p []byte) error {
	if f.srv == srvMessages {
		return nil
	}
	if f.srv == srvRefused {
		return fmt.Errorf("%w: the server sent more after refusing the viewer", ErrProtocol)
	}
	for len(p) > 0 && f.srv != srvMessages {
		// Nothing before ServerInit is longer than maxServerPrelude.
		n := min(len(p), maxServerPrelude)
		f.srvBuf = append(f.srvBuf, p[:n]...)
		p = p[n:]
		for f.srv != srvMessages {
			was := f.srv
			used, err := f.nextServer()
			if err != nil {
				return err
			}
			if used == 0 && f.srv == was {
				break // not complete yet
			}
			f.srvBuf = f.srvBuf[used:]
		}
		if f.srv == srvRefused && len(f.srvBuf) > 0 {
			return fmt.Errorf("%w: the server sent more after refusing the viewer", ErrProtocol)
		}
		if len(f.srvBuf) > maxServerPrelude {
			return fmt.Errorf("%w: server message too large", ErrProtocol)
		}
		f.srvBuf = append([]byte(nil), f.srvBuf...)
	}
	if f.srv == srvMessages {
		f.srvBuf = nil
	}
	return nil
}

// maxServerPrelude is the longest message a server sends before and with
// ServerInit: ServerInit with the longest name allowed.
const maxServerPrelude = 24 + maxNameLen

// nextServer consumes the next complete server message from srvBuf and
// returns its length, or 0 when it is not complete yet.
func (f *Filter) nextServer() (int, error) {
	b := f.srvBuf
	switch f.srv {
	case srvVersion:
		if len(b) < 12 {
			return 0, nil
		}
		if !validVersion(b[:12]) {
			return 0, fmt.Errorf("%w: server sent version %q", ErrProtocol, sanitize(b[:12]))
		}
		f.srv = srvSecurityTypes
		return 12, nil
	case srvSecurityTypes:
		if len(b) < 1 {
			return 0, nil
		}
		if b[0] == 0 { // refused, with a reason
			n, err := reasonLen(b[1:])
			if n < 0 || err != nil {
				return 0, err
			}
			f.srv = srvRefused
			return 1 + n, nil
		}
		n := 1 + int(b[0])
		if len(b) < n {
			return 0, nil
		}
		f.srv = srvChallenge
		return n, nil
	case srvChallenge:
		if len(b) == 0 {
			return 0, nil // the server waits for the viewer's choice
		}
		switch f.security.Load() {
		case 0:
			return 0, fmt.Errorf("%w: the server went on before the viewer chose a security type", ErrProtocol)
		case 2: // VNC authentication: a 16-byte challenge
			if len(b) < 16 {
				return 0, nil
			}
			f.srv = srvSecurityResult
			return 16, nil
		}
		f.srv = srvSecurityResult
		if f.minor.Load() < 8 { // RFB 3.7 sends no result for None
			f.srv = srvInit
		}
		return 0, nil
	case srvSecurityResult:
		if len(b) < 4 {
			return 0, nil
		}
		if binary.BigEndian.Uint32(b) == 0 {
			f.srv = srvInit
			return 4, nil
		}
		if f.minor.Load() < 8 {
			f.srv = srvRefused
			return 4, nil
		}
		n, err := reasonLen(b[4:])
		if n < 0 || err != nil {
			return 0, err
		}
		f.srv = srvRefused
		return 4 + n, nil
	case srvInit:
		if len(b) < 24 {
			return 0, nil
		}
		w, h := int(binary.BigEndian.Uint16(b)), int(binary.BigEndian.Uint16(b[2:]))
		if w == 0 || h == 0 || w > f.MaxWidth || h > f.MaxHeight {
			return 0, fmt.Errorf("%w: server announces a %dx%d screen, the session's is at most %dx%d", ErrProtocol, w, h, f.MaxWidth, f.MaxHeight)
		}
		nl := binary.BigEndian.Uint32(b[20:])
		if nl > maxNameLen {
			return 0, fmt.Errorf("%w: desktop name of %d bytes, at most %d", ErrProtocol, nl, maxNameLen)
		}
		if len(b) < 24+int(nl) {
			return 0, nil
		}
		f.srv, f.srvW, f.srvH = srvMessages, w, h
		return 24 + int(nl), nil
	}
	return 0, nil
}

// reasonLen reads a failure reason's length field and returns the length
// of the field and reason together, -1 when not all there yet.
func reasonLen(b []byte) (int, error) {
	if len(b) < 4 {
		return -1, nil
	}
	n := binary.BigEndian.Uint32(b)
	if n > maxReasonLen {
		return 0, fmt.Errorf("%w: failure reason of %d bytes, at most %d", ErrProtocol, n, maxReasonLen)
	}
	if len(b) < 4+int(n) {
		return -1, nil
	}
	return 4 + int(n), nil
}

// validVersion is "RFB xxx.yyy\n" with digits.
func validVersion(b []byte) bool {
	if string(b[:4]) != "RFB " || b[7] != '.' || b[11] != '\n' {
		return false
	}
	for _, i := range []int{4, 5, 6, 8, 9, 10} {
		if b[i] < '0' || b[i] > '9' {
			return false
		}
	}
	return true
}
