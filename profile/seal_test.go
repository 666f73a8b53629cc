package profile

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"testing"
)

func seal(t *testing.T, key []byte, bindTo string, plain []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	s, err := newSealer(&out, key, bindTo)
	if err != nil {
		t.Fatal(err)
	}
	// Odd write sizes, so chunks are cut across writes.
	for p := plain; len(p) > 0; {
		n := min(len(p), 7777)
		if _, err := s.Write(p[:n]); err != nil {
			t.Fatal(err)
		}
		p = p[n:]
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func open(key []byte, bindTo string, sealed []byte) ([]byte, error) {
	o, err := newOpener(bytes.NewReader(sealed), key, bindTo)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(o)
}

// TestSealRoundTrip: what is sealed opens to the same bytes, at every
// size around the chunk boundaries (the positive control of the tamper
// tests below).
func TestSealRoundTrip(t *testing.T) {
	key := make([]byte, 32)
	rand.Read(key)
	for _, n := range []int{0, 1, chunkSize - 1, chunkSize, chunkSize + 1, 3 * chunkSize, 3*chunkSize + 5} {
		plain := make([]byte, n)
		rand.Read(plain)
		got, err := open(key, "t\x00prof\x001", seal(t, key, "t\x00prof\x001", plain))
		if err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("%d bytes: %v (got %d bytes)", n, err, len(got))
		}
	}
}

// TestSealTamper: a flipped bit, a cut at a chunk boundary or anywhere
// else, swapped chunks, another binding (tenant, profile or version) or
// another key: each fails with ErrTampered.
func TestSealTamper(t *testing.T) {
	key, other := make([]byte, 32), make([]byte, 32)
	rand.Read(key)
	rand.Read(other)
	plain := make([]byte, 3*chunkSize+100)
	rand.Read(plain)
	good := seal(t, key, "a\x00p\x002", plain)
	head := len(sealMagic) + saltSize
	full := chunkSize + tagSize
	flip := append([]byte(nil), good...)
	flip[head+full+10] ^= 1
	swapped := append([]byte(nil), good[:head]...)
	swapped = append(swapped, good[head+full:head+2*full]...)
	swapped = append(swapped, good[head:head+full]...)
	swapped = append(swapped, good[head+2*full:]...)
	for _, c := range []struct {
		name   string
		bindTo string
		key    []byte
		data   []byte
	}{
		{"bit flipped", "a\x00p\x002", key, flip},
		{"cut at a chunk boundary", "a\x00p\x002", key, good[:head+3*full]},
		{"cut inside a chunk", "a\x00p\x002", key, good[:len(good)-7]},
		{"only the header", "a\x00p\x002", key, good[:head]},
		{"chunks swapped", "a\x00p\x002", key, swapped},
		{"another tenant", "b\x00p\x002", key, good},
		{"another version", "a\x00p\x001", key, good},
		{"another key", "a\x00p\x002", other, good},
		{"not sealed", "a\x00p\x002", key, []byte("plain tar bytes, not sealed at all, long enough for a header")},
	} {
		if _, err := open(c.key, c.bindTo, c.data); !errors.Is(err, ErrTampered) {
			t.Errorf("%s: %v, want ErrTampered", c.name, err)
		}
	}
	if got, err := open(key, "a\x00p\x002", good); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("the untouched object: %v", err)
	}
}
