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
