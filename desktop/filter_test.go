package desktop

import (
	"bytes"
	"errors"
	"testing"
)

var handshake = []byte("RFB 003.008\n\x01\x00")

func msgs(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

var (
	setPF   = append([]byte{0, 0, 0, 0}, make([]byte, 16)...)
	setEnc  = []byte{2, 0, 0, 2, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x21}
	fbReq   = []byte{3, 1, 0, 0, 0, 0, 5, 0, 3, 32}
	key     = []byte{4, 1, 0, 0, 0, 0, 0, 'a'}
	pointer = []byte{5, 1, 0, 10, 0, 20}
	cut     = []byte{6, 0, 0, 0, 0, 0, 0, 3, 'a', 'b', 'c'}
	qemuKey = []byte{255, 0, 0, 1, 0, 0, 0, 'a', 0, 0, 0, 30}
	resize  = append([]byte{251, 0, 5, 0, 3, 32, 1, 0}, make([]byte, 16)...)
)

func TestFilterForwardsAndDrops(t *testing.T) {
	stream := msgs(handshake, setPF, setEnc, fbReq, key, pointer, cut, qemuKey, resize, fbReq)
	for _, viewOnly := range []bool{false, true} {
		// Byte by byte: messages split anywhere must come out whole.
		f := &Filter{ViewOnly: viewOnly}
		var out []byte
		for i := range stream {
			o, err := f.Feed(stream[i : i+1])
			if err != nil {
				t.Fatalf("view-only %v: %v", viewOnly, err)
			}
			out = append(out, o...)
		}
		want := msgs(handshake[:12], []byte{1, 1}, setPF, setEnc, fbReq, key, pointer, cut, qemuKey, resize, fbReq)
		if viewOnly {
			want = msgs(handshake[:12], []byte{1, 1}, setPF, setEnc, fbReq, fbReq)
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("view-only %v:\n got %v\nwant %v", viewOnly, out, want)
		}
		if viewOnly && f.Dropped != 5 {
			t.Fatalf("dropped %d, want 5", f.Dropped)
		}
	}
}

func TestFilterForcesShared(t *testing.T) {
	f := &Filter{}
	out, err := f.Feed([]byte("RFB 003.008\n\x01\x00"))
	if err != nil || out[len(out)-1] != 1 {
		t.Fatalf("shared flag not forced: %v %v", out, err)
	}
}

func TestFilterRejects(t *testing.T) {
	huge := []byte{6, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff}
	for name, stream := range map[string][]byte{
		"not rfb":          []byte("GET / HTTP/1.1\r\n"),
		"old version":      []byte("RFB 003.003\n"),
		"bad security":     []byte("RFB 003.008\n\x10"),
		"unknown message":  msgs(handshake, []byte{77}),
		"huge cut text":    msgs(handshake, huge),
		"too many encodes": msgs(handshake, []byte{2, 0, 0xff, 0xff}),
		"qemu audio":       msgs(handshake, []byte{255, 1, 0, 0}),
	} {
		f := &Filter{}
		if _, err := f.Feed(stream); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: err %v, want ErrProtocol", name, err)
		}
	}
}

func FuzzFilter(f *testing.F) {
	f.Add(msgs(handshake, setPF, key, pointer, cut))
	f.Add([]byte("RFB 003.008\n\x02" + "0123456789abcdef\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		flt := &Filter{ViewOnly: true}
		out, err := flt.Feed(data)
		if err != nil {
			return
		}
		// Whatever passed a view-only filter holds no input message.
		if flt.state == stMessages {
			chk := &Filter{ViewOnly: true}
			again, err := chk.Feed(out)
			if err != nil || !bytes.Equal(again, out) || chk.Dropped != 0 {
				t.Fatalf("filtered output is not stable: %v %v", err, chk.Dropped)
			}
		}
		if len(out) > len(data) {
			t.Fatalf("filter produced more bytes than it got")
		}
	})
}

// TestFilterServerSide: what the session's server sends the viewer is
// checked up to ServerInit, split anywhere; a screen over the session's
// or an unbounded length ends the connection.
func TestFilterServerSide(t *testing.T) {
	good := serverInit(1280, 800, 4, "good")
	after := update(rawRect(0, 0, 1, 1, [4]byte{1, 2, 3}))
	for name, tc := range map[string]struct {
		server []byte
		ok     bool
	}{
		"well behaved":  {append(append([]byte(nil), good...), after...), true},
		"vnc auth":      {msgs([]byte("RFB 003.008\n\x01\x02"), make([]byte, 16), []byte{0, 0, 0, 0}, good[18:]), true},
		"huge screen":   {serverInit(65535, 65535, 0, ""), false},
		"taller":        {serverInit(1280, 801, 0, ""), false},
		"huge name":     {serverInit(1280, 800, 1<<30, ""), false},
		"huge reason":   {[]byte("RFB 003.008\n\x00\x7f\xff\xff\xff"), false},
		"refused again": {[]byte("RFB 003.008\n\x01\x01\x00\x00\x00\x01\x00\x00\x00\x01xmore"), false},
		"not rfb":       {[]byte("HTTP/1.1 200 OK\r\n\r\n"), false},
	} {
		for _, split := range []int{1, 7, 1 << 20} {
			f := &Filter{ViewOnly: true, MaxWidth: 1280, MaxHeight: 800}
			// The viewer answers before the server goes on, as the gateway
			// forwards it.
			f.Feed([]byte("RFB 003.008\n"))
			sec := byte(1)
			if name == "vnc auth" {
				sec = 2
			}
			f.Feed([]byte{sec})
			var err error
			for p := tc.server; len(p) > 0 && err == nil; {
				n := min(split, len(p))
				err = f.FromServer(p[:n])
				p = p[n:]
			}
			if tc.ok && err != nil {
				t.Errorf("%s, split %d: %v", name, split, err)
			}
			if !tc.ok && !errors.Is(err, ErrProtocol) {
				t.Errorf("%s, split %d: err %v, want ErrProtocol", name, split, err)
			}
			if tc.ok && (f.srv != srvMessages || f.srvBuf != nil) {
				t.Errorf("%s: state %d, %d bytes held after ServerInit", name, f.srv, len(f.srvBuf))
			}
		}
	}
}

// TestFilterServerInTurn: the two sides take turns, as over a real
// connection: the server's security types come before the viewer's
// choice, and what follows after it.
func TestFilterServerInTurn(t *testing.T) {
	init := serverInit(1280, 800, 4, "good")
	f := &Filter{MaxWidth: 1280, MaxHeight: 800}
	steps := []struct {
		viewer, server []byte
	}{
		{nil, init[:12]},                       // version
		{[]byte("RFB 003.008\n"), init[12:14]}, // security types
		{[]byte{1}, init[14:18]},               // result
		{[]byte{1}, init[18:]},                 // ServerInit
	}
	for i, st := range steps {
		if _, err := f.Feed(st.viewer); err != nil {
			t.Fatalf("step %d: viewer: %v", i, err)
		}
		if err := f.FromServer(st.server); err != nil {
			t.Fatalf("step %d: server: %v", i, err)
		}
	}
	if f.srv != srvMessages {
		t.Fatalf("state %d after ServerInit", f.srv)
	}
}

// TestFilterServerBeforeChoice: a server that goes on before the viewer
// chose a security type is cut.
func TestFilterServerBeforeChoice(t *testing.T) {
	f := &Filter{MaxWidth: 1280, MaxHeight: 800}
	if err := f.FromServer(serverInit(1280, 800, 0, "")); !errors.Is(err, ErrProtocol) {
		t.Fatalf("err %v, want ErrProtocol", err)
	}
}

// TestFilterLargeInput: a viewer's message of many megabytes is refused
// while the filter holds no more than one message's worth.
func TestFilterLargeInput(t *testing.T) {
	f := &Filter{}
	big := msgs(handshake, []byte{6, 0, 0, 0, 0, 0x20, 0, 0}, make([]byte, 64<<20)) // 2 MiB of cut text announced, 64 MiB sent
	n := allocated(func() {
		if _, err := f.Feed(big); !errors.Is(err, ErrProtocol) {
			t.Errorf("err %v, want ErrProtocol", err)
		}
	})
	if n > 8<<20 {
		t.Errorf("allocated %d bytes for a refused message", n)
	}
	// Positive control: many small messages in one large input all pass.
	f = &Filter{}
	many := append(append([]byte(nil), handshake...), bytes.Repeat(fbReq, 100000)...)
	out, err := f.Feed(many)
	if err != nil || len(out) != len(many) {
		t.Fatalf("%d of %d bytes passed: %v", len(out), len(many), err)
	}
}

// FuzzFilterServer feeds the server's side of the filter what a hostile
// server might send: it must never panic, never hold more than the longest
// message before ServerInit, and never pass a screen over the limit.
func FuzzFilterServer(f *testing.F) {
	f.Add(byte(1), append(serverInit(16, 12, 4, "good"), update(rawRect(0, 0, 1, 1, [4]byte{1}))...))
	f.Add(byte(2), msgs([]byte("RFB 003.008\n\x01\x02"), make([]byte, 16), []byte{0, 0, 0, 0}, serverInit(16, 12, 0, "")[18:]))
	f.Add(byte(1), serverInit(65535, 65535, 0, ""))
	f.Add(byte(1), []byte("RFB 003.008\n\x00\x00\x00\x00\x03bad"))
	f.Add(byte(2), []byte("RFB 003.008\n\x01\x02................\x00\x00\x00\x01\x00\x00\x00\x02no"))
	f.Fuzz(func(t *testing.T, sec byte, data []byte) {
		flt := &Filter{MaxWidth: 16, MaxHeight: 12}
		flt.Feed([]byte("RFB 003.008\n"))
		flt.Feed([]byte{sec})
		// In two pieces, split where the data says.
		cut := 0
		if len(data) > 0 {
			cut = int(data[0]) % (len(data) + 1)
		}
		for _, p := range [][]byte{data[:cut], data[cut:]} {
			if err := flt.FromServer(p); err != nil {
				return
			}
			if len(flt.srvBuf) > maxServerPrelude {
				t.Fatalf("holding %d bytes", len(flt.srvBuf))
			}
		}
		if flt.srv == srvMessages && (flt.srvW < 1 || flt.srvW > 16 || flt.srvH < 1 || flt.srvH > 12) {
			t.Fatalf("passed a %dx%d screen", flt.srvW, flt.srvH)
		}
	})
}
