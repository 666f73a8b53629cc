package desktop

import (
	"encoding/binary"
	"fmt"
)

// Limits on what a viewer may send.
const (
	maxCutText   = 1 << 20
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

// Filter reads the byte stream a VNC viewer sends to the server and passes
// on only whole, well-formed RFB messages. With ViewOnly it drops every
// message that acts on the session: pointer, keys, clipboard, desktop
// resizing and power (xvp) requests. It forces the shared flag, so one
// viewer cannot disconnect the others.
type Filter struct {
	ViewOnly bool
	state    filterState
	buf      []byte
	// Dropped counts messages withheld from the server.
	Dropped int
}

// Feed takes the next bytes from the viewer and returns those to forward.
// An error means the stream is malformed; the connection must be closed.
func (f *Filter) Feed(p []byte) ([]byte, error) {
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
	case msgSetDesktopSize:
		if len(b) < 8 {
			return 0, false, nil
		}
		n, input = 8+16*int(b[6]), true
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
