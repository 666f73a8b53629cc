package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gws "github.com/gorilla/websocket"
)

// frame encodes one frame: b0 is the first byte as is (FIN, RSV, opcode),
// key masks the payload when set.
func wsFrame(b0 byte, payload []byte, key *[4]byte) []byte {
	b := []byte{b0}
	var m byte
	if key != nil {
		m = 0x80
	}
	switch n := len(payload); {
	case n <= 125:
		b = append(b, m|byte(n))
	case n <= 0xffff:
		b = append(b, m|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, m|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if key == nil {
		return append(b, payload...)
	}
	b = append(b, key[:]...)
	p := append([]byte(nil), payload...)
	maskBytes(*key, 0, p)
	return append(b, p...)
}

// header encodes a frame header announcing length bytes, with no payload.
func wsLen(b0 byte, length uint64) []byte {
	b := []byte{b0, 127}
	return binary.BigEndian.AppendUint64(b, length)
}

func cat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

const (
	fin  = 0x80
	text = fin | opText
)

// relay runs a browser-side reader over in and returns what it wrote to
// the client, the pings it saw and the error that ended it.
func relay(in []byte, limit int64) (out []byte, pings []string, err error) {
	f := &wsReader{r: bufio.NewReaderSize(bytes.NewReader(in), 64), limit: limit}
	var buf bytes.Buffer
	w := &wsWriter{conn: &buf}
	err = f.relayTo(w, func(op byte, p []byte) error {
		switch op {
		case opPing:
			pings = append(pings, string(p))
		case opClose:
			return errPeerClosed
		}
		return nil
	})
	return buf.Bytes(), pings, err
}

// TestRelayValid: data frames reach the client byte for byte (small,
// 16-bit and 64-bit lengths, fragmented), control frames do not.
func TestRelayValid(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 70000)
	mid := bytes.Repeat([]byte("y"), 300)
	for _, tc := range []struct {
		name  string
		in    []byte
		want  []byte
		pings []string
	}{
		{"single frame", wsFrame(text, []byte(`{"id":1}`), nil), wsFrame(text, []byte(`{"id":1}`), nil), nil},
		{"16-bit length", wsFrame(fin|opBinary, mid, nil), wsFrame(fin|opBinary, mid, nil), nil},
		{"64-bit length", wsFrame(text, big, nil), wsFrame(text, big, nil), nil},
		{"empty frame", wsFrame(text, nil, nil), wsFrame(text, nil, nil), nil},
		{"fragmented", cat(wsFrame(opText, []byte("ab"), nil), wsFrame(opContinuation, []byte("cd"), nil), wsFrame(fin, []byte("ef"), nil)),
			cat(wsFrame(opText, []byte("ab"), nil), wsFrame(opContinuation, []byte("cd"), nil), wsFrame(fin, []byte("ef"), nil)), nil},
		{"ping inside a fragmented message", cat(wsFrame(opText, []byte("ab"), nil), wsFrame(fin|opPing, []byte("p1"), nil), wsFrame(fin, []byte("cd"), nil)),
			cat(wsFrame(opText, []byte("ab"), nil), wsFrame(fin, []byte("cd"), nil)), []string{"p1"}},
		{"pong dropped", cat(wsFrame(fin|opPong, []byte("x"), nil), wsFrame(text, []byte("a"), nil)), wsFrame(text, []byte("a"), nil), nil},
		{"two messages", cat(wsFrame(text, []byte("a"), nil), wsFrame(text, []byte("b"), nil)), cat(wsFrame(text, []byte("a"), nil), wsFrame(text, []byte("b"), nil)), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, pings, err := relay(tc.in, 1<<20)
			if err != io.EOF {
				t.Fatalf("ended with %v, want EOF", err)
			}
			if !bytes.Equal(out, tc.want) {
				t.Errorf("relayed %q, want %q", trim(out), trim(tc.want))
			}
			if fmt.Sprint(pings) != fmt.Sprint(tc.pings) {
				t.Errorf("pings %q, want %q", pings, tc.pings)
			}
		})
	}
}

func trim(b []byte) []byte { return b[:min(len(b), 40)] }

// TestRelayRefusals: each malformed stream is refused with its reason,
// beside the same stream made valid by one change (its control).
func TestRelayRefusals(t *testing.T) {
	key := &[4]byte{1, 2, 3, 4}
	start := wsFrame(opText, []byte("ab"), nil)
	for _, tc := range []struct {
		name    string
		bad, ok []byte
		want    error
		reason  string
	}{
		{"rsv1", wsFrame(text|0x40, []byte("a"), nil), wsFrame(text, []byte("a"), nil), errProtocol, "reserved bits"},
		{"rsv3", wsFrame(text|0x10, []byte("a"), nil), wsFrame(text, []byte("a"), nil), errProtocol, "reserved bits"},
		{"masked server frame", wsFrame(text, []byte("a"), key), wsFrame(text, []byte("a"), nil), errProtocol, "masked frame from a server"},
		{"unknown data opcode", wsFrame(fin|0x3, []byte("a"), nil), wsFrame(fin|opBinary, []byte("a"), nil), errProtocol, "unknown opcode"},
		{"unknown control opcode", wsFrame(fin|0xb, []byte("a"), nil), wsFrame(fin|opPong, []byte("a"), nil), errProtocol, "unknown opcode"},
		{"control over 125 bytes", wsFrame(fin|opPing, bytes.Repeat([]byte("p"), 126), nil), wsFrame(fin|opPing, bytes.Repeat([]byte("p"), 125), nil), errProtocol, "control frame of 126"},
		{"fragmented control", wsFrame(opPing, []byte("p"), nil), wsFrame(fin|opPing, []byte("p"), nil), errProtocol, "fragmented control"},
		{"continuation without a message", wsFrame(fin|opContinuation, []byte("a"), nil), cat(start, wsFrame(fin|opContinuation, []byte("a"), nil)), errProtocol, "continuation frame outside"},
		{"continuation after the last frame", cat(wsFrame(text, []byte("a"), nil), wsFrame(fin, []byte("b"), nil)), cat(wsFrame(opText, []byte("a"), nil), wsFrame(fin, []byte("b"), nil)), errProtocol, "continuation frame outside"},
		{"new message inside a fragmented one", cat(start, wsFrame(text, []byte("c"), nil)), cat(start, wsFrame(fin, []byte("c"), nil)), errProtocol, "new message inside"},
		{"length with the top bit", wsLen(text, 1<<63), wsLen(text, 0), errProtocol, "most significant bit"},
		{"one frame over the limit", wsFrame(text, bytes.Repeat([]byte("a"), 1025), nil), wsFrame(text, bytes.Repeat([]byte("a"), 1024), nil), errMessageTooBig, "over 1024 bytes"},
		{"fragments over the limit", cat(wsFrame(opText, bytes.Repeat([]byte("a"), 1000), nil), wsFrame(fin, bytes.Repeat([]byte("a"), 25), nil)),
			cat(wsFrame(opText, bytes.Repeat([]byte("a"), 1000), nil), wsFrame(fin, bytes.Repeat([]byte("a"), 24), nil)), errMessageTooBig, "over 1024 bytes"},
		{"limit per message, not per connection", nil, cat(wsFrame(text, bytes.Repeat([]byte("a"), 1024), nil), wsFrame(text, bytes.Repeat([]byte("a"), 1024), nil)), nil, ""},
		{"truncated header", wsFrame(text, []byte("a"), nil)[:1], wsFrame(text, []byte("a"), nil), io.EOF, ""},
		{"truncated extended length", wsLen(text, 5)[:4], cat(wsLen(text, 5), []byte("hello")), io.ErrUnexpectedEOF, ""},
		{"truncated payload", wsFrame(text, []byte("hello"), nil)[:4], wsFrame(text, []byte("hello"), nil), errRelayBroken, "EOF"},
		{"close frame", cat(wsFrame(text, []byte("a"), nil), wsFrame(fin|opClose, []byte{3, 232}, nil)), wsFrame(text, []byte("a"), nil), errPeerClosed, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := relay(tc.ok, 1024); err != io.EOF {
				t.Fatalf("control: ended with %v, want EOF", err)
			}
			if tc.bad == nil {
				return
			}
			_, _, err := relay(tc.bad, 1024)
			if !errors.Is(err, tc.want) || !strings.Contains(fmt.Sprint(err), tc.reason) {
				t.Fatalf("ended with %v, want %v with %q", err, tc.want, tc.reason)
			}
		})
	}
}

// tripwire counts the reads that reach it.
type tripwire struct{ reads atomic.Int32 }

func (w *tripwire) Read(p []byte) (int, error) {
	w.reads.Add(1)
	for i := range p {
		p[i] = 'z'
	}
	return len(p), nil
}

// TestOversizeNotRead: a header announcing more than the limit fails
// before one byte of its payload is read (the bytes after the header are
// a tripwire); the control, a header of the limit itself, reads into it.
func TestOversizeNotRead(t *testing.T) {
	const limit = 1 << 20
	for _, tc := range []struct {
		name     string
		announce uint64
		tripped  bool
	}{
		{"at the limit (control)", limit, true},
		{"one byte over", limit + 1, false},
		{"a gigabyte", 1 << 30, false},
		{"the largest length", 1<<63 - 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Browser side: the relay.
			var trip tripwire
			f := &wsReader{r: bufio.NewReaderSize(io.MultiReader(bytes.NewReader(wsLen(text, tc.announce)), &trip), 16), limit: limit}
			var out bytes.Buffer
			err := f.relayTo(&wsWriter{conn: &out}, func(byte, []byte) error { return nil })
			if tripped := trip.reads.Load() > 0; tripped != tc.tripped {
				t.Fatalf("relay: payload read %v, want %v (err %v)", tripped, tc.tripped, err)
			}
			if !tc.tripped && (!errors.Is(err, errMessageTooBig) || out.Len() != 0) {
				t.Fatalf("relay: %v, %d bytes to the client; want message too big, nothing", err, out.Len())
			}

			// Client side: nothing is allocated for it either.
			var trip2 tripwire
			key := [4]byte{9, 9, 9, 9}
			h := append(wsLen(text|0, tc.announce), key[:]...)
			h[1] |= 0x80
			c := &wsReader{r: bufio.NewReaderSize(io.MultiReader(bytes.NewReader(h), &trip2), 16), masked: true, limit: limit}
			// Ends at the first frame (the tripwire is no frame).
			_, msg, err := c.readMessage(nil, func(byte, []byte) error { return nil })
			if tripped := trip2.reads.Load() > 0; tripped != tc.tripped {
				t.Fatalf("client: payload read %v, want %v (err %v)", tripped, tc.tripped, err)
			}
			if !tc.tripped && (!errors.Is(err, errMessageTooBig) || cap(msg) != 0) {
				t.Fatalf("client: %v, %d bytes allocated; want message too big, nothing", err, cap(msg))
			}
		})
	}
}

// TestClientMessages: masked frames are read as whole messages, unmasked;
// pings inside are handed over; an unmasked client frame is refused.
func TestClientMessages(t *testing.T) {
	k1, k2, k3 := &[4]byte{1, 2, 3, 4}, &[4]byte{0xff, 0, 0x80, 7}, &[4]byte{5, 6, 7, 8}
	read := func(in []byte) ([]string, []string, error) {
		f := &wsReader{r: bufio.NewReaderSize(bytes.NewReader(in), 32), masked: true, limit: 1 << 20}
		var msgs, pings []string
		for {
			op, msg, err := f.readMessage(nil, func(op byte, p []byte) error {
				pings = append(pings, fmt.Sprintf("%d:%s", op, p))
				return nil
			})
			if err != nil {
				return msgs, pings, err
			}
			msgs = append(msgs, fmt.Sprintf("%d:%s", op, msg))
		}
	}
	big := strings.Repeat("0123456789", 20000)
	msgs, pings, err := read(cat(
		wsFrame(text, []byte("hello"), k1),
		wsFrame(opBinary, []byte("abc"), k1), wsFrame(fin|opPing, []byte("are you there"), k2), wsFrame(opContinuation, []byte("defg"), k2), wsFrame(fin, []byte("h"), k3),
		wsFrame(text, []byte(big), k3),
	))
	if err != io.EOF {
		t.Fatalf("ended with %v", err)
	}
	if want := []string{"1:hello", "2:abcdefgh", "1:" + big}; fmt.Sprint(msgs) != fmt.Sprint(want) {
		t.Errorf("messages %.60q, want %.60q", msgs, want)
	}
	if want := []string{"9:are you there"}; fmt.Sprint(pings) != fmt.Sprint(want) {
		t.Errorf("pings %q, want %q", pings, want)
	}
	if _, _, err := read(wsFrame(text, []byte("hello"), nil)); !errors.Is(err, errProtocol) || !strings.Contains(err.Error(), "unmasked") {
		t.Errorf("an unmasked client frame: %v, want refused", err)
	}
}

// TestWriterFrames: what the writers write reads back (masked in chunks
// for the browser, plain for the client), and a masked frame is not the
// payload in clear.
func TestWriterFrames(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 10000) // over one write chunk
	for _, masked := range []bool{false, true} {
		for _, p := range [][]byte{nil, []byte("hi"), big} {
			var out bytes.Buffer
			w := &wsWriter{conn: &out}
			if masked {
				w = newMaskedWriter(&out)
			}
			if err := w.writeFrame(opText, p); err != nil {
				t.Fatal(err)
			}
			if masked && len(p) > 0 && bytes.Contains(out.Bytes(), p) {
				t.Errorf("masked frame of %d bytes carries the payload in clear", len(p))
			}
			f := &wsReader{r: bufio.NewReader(&out), masked: masked, limit: 1 << 20}
			op, msg, err := f.readMessage(nil, func(byte, []byte) error { return nil })
			if err != nil || op != opText || !bytes.Equal(msg, p) {
				t.Errorf("masked %v, %d bytes: read back op %d, %d bytes, %v", masked, len(p), op, len(msg), err)
			}
		}
	}
	var out bytes.Buffer
	w := &wsWriter{conn: &out}
	w.closeFrame(1009, strings.Repeat("r", 200))
	// 1009, and the reason cut to fit in 125 bytes.
	if want := append([]byte{fin | opClose, 125, 0x03, 0xf1}, strings.Repeat("r", 123)...); !bytes.Equal(out.Bytes(), want) {
		t.Errorf("close frame %q, want %q", trim(out.Bytes()), trim(want))
	}
}

// TestDialBrowser: the handshake against a real WebSocket server (gorilla),
// then messages both ways; the browser's frames, a large one spliced from
// the connection, reach a client connection whole.
func TestDialBrowser(t *testing.T) {
	big := bytes.Repeat([]byte("s"), 3<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Sec-WebSocket-Extensions") != "" {
			http.Error(w, "no extensions here", 400)
			return
		}
		c, err := (&gws.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		// Sent before the client speaks: it lands in the handshake's buffer.
		c.WriteMessage(gws.TextMessage, []byte("hello"))
		for {
			mt, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			c.WriteMessage(mt, append([]byte("echo:"), msg...))
			c.WriteMessage(gws.BinaryMessage, big)
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	up, upr, err := dialBrowser(ctx, "ws://"+strings.TrimPrefix(srv.URL, "http://")+"/devtools/page/X")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()

	// A TCP pair stands for the client, so that the relay can splice.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		f := &wsReader{r: upr, raw: up, limit: 8 << 20}
		f.relayTo(&wsWriter{conn: c}, func(byte, []byte) error { return nil })
	}()
	cl, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cl.SetDeadline(time.Now().Add(20 * time.Second))
	toBrowser := newMaskedWriter(up)
	if err := toBrowser.writeFrame(opText, []byte(`{"id":1}`)); err != nil {
		t.Fatal(err)
	}
	fc := &wsReader{r: bufio.NewReader(cl), limit: 8 << 20}
	var got []string
	for len(got) < 3 {
		op, msg, err := fc.readMessage(nil, func(byte, []byte) error { return nil })
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		if op == opBinary && bytes.Equal(msg, big) {
			got = append(got, "big")
			continue
		}
		got = append(got, string(msg))
	}
	if want := []string{"hello", `echo:{"id":1}`, "big"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("client read %q, want %q", got, want)
	}
}

// TestHandshakeRefusals: an answer that is not exactly an upgrade without
// extensions is refused; the control, the right answer, is accepted.
func TestHandshakeRefusals(t *testing.T) {
	answer := func(extra func(key string) string) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer l.Close()
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			req, err := http.ReadRequest(bufio.NewReader(c))
			if err != nil {
				return
			}
			io.WriteString(c, extra(req.Header.Get("Sec-WebSocket-Key")))
			time.Sleep(100 * time.Millisecond)
		}()
		return "ws://" + l.Addr().String() + "/devtools/browser/B"
	}
	ok := func(key string) string {
		return "HTTP/1.1 101 WebSocket Protocol Handshake\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acceptKey(key) + "\r\n"
	}
	for _, tc := range []struct {
		name string
		resp func(key string) string
		want string
	}{
		{"right answer (control)", func(k string) string { return ok(k) + "\r\n" }, ""},
		{"status 200", func(k string) string { return strings.Replace(ok(k), "101", "200", 1) + "Content-Length: 0\r\n\r\n" }, "status 200"},
		{"wrong accept", func(k string) string { return ok(k+"x") + "\r\n" }, "Sec-WebSocket-Accept"},
		{"no upgrade", func(k string) string { return strings.Replace(ok(k), "Upgrade: WebSocket", "Upgrade: h2c", 1) + "\r\n" }, "no upgrade"},
		{"an extension", func(k string) string { return ok(k) + "Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n" }, "extension"},
		{"an endless header", func(k string) string { return ok(k) + "X: " + strings.Repeat("a", maxHandshake) + "\r\n\r\n" }, "handshake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, _, err := dialBrowser(ctx, answer(tc.resp))
			if c != nil {
				c.Close()
			}
			if tc.want == "" && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// FuzzWSReader feeds arbitrary bytes to both readers. Whatever comes in,
// the relay writes only well-formed frames whose messages keep to the
// limit, and the client reader returns messages within it.
func FuzzWSReader(f *testing.F) {
	key := &[4]byte{1, 2, 3, 4}
	f.Add(wsFrame(text, []byte(`{"id":1}`), nil), false)
	f.Add(cat(wsFrame(opText, []byte("ab"), nil), wsFrame(fin|opPing, []byte("p"), nil), wsFrame(fin, []byte("cd"), nil)), false)
	f.Add(wsFrame(text, []byte(`{"id":1}`), key), true)
	f.Add(cat(wsFrame(opBinary, []byte("ab"), key), wsFrame(fin|opPing, nil, key), wsFrame(fin, []byte("cd"), key)), true)
	f.Add(wsLen(text, 1<<40), false)
	f.Fuzz(func(t *testing.T, in []byte, client bool) {
		const limit = 512
		if client {
			r := &wsReader{r: bufio.NewReaderSize(bytes.NewReader(in), 16), masked: true, limit: limit}
			for {
				op, msg, err := r.readMessage(nil, func(op byte, p []byte) error {
					if op < opClose || len(p) > maxControl {
						t.Fatalf("control op %d of %d bytes", op, len(p))
					}
					return nil
				})
				if err != nil {
					return
				}
				if len(msg) > limit || (op != opText && op != opBinary) {
					t.Fatalf("message op %d of %d bytes", op, len(msg))
				}
			}
		}
		out, _, rerr := relay(in, limit)
		// The output is frames a strict reader takes; it may end inside a
		// message that was refused part way, or inside a frame whose
		// payload the browser cut short (its header went first).
		back := &wsReader{r: bufio.NewReader(bytes.NewReader(out)), limit: limit}
		n := 0
		for {
			h, err := back.next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("relayed a frame a reader refuses: %v", err)
			}
			if h.control() {
				t.Fatal("relayed a control frame")
			}
			d, err := back.r.Discard(int(h.length))
			if err != nil && !errors.Is(rerr, errRelayBroken) {
				t.Fatalf("relayed a frame cut short (the relay ended with %v): %v", rerr, err)
			}
			n += d
		}
		if n > len(in) {
			t.Fatalf("relayed %d payload bytes from %d bytes of input", n, len(in))
		}
	})
}
