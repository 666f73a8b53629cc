package profile

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// A sealed object is a header (magic and a random salt) and chunks of
// AES-256-GCM under a key derived for that one object from the store's
// key, the salt and what the object is bound to (tenant, profile,
// version). Each chunk's nonce counts the chunks and marks the last, so
// chunks cannot be reordered, dropped or cut off at the end unnoticed,
// and an object moved to another tenant, profile or version does not
// open.

const (
	sealMagic = "SGPROF1\n"
	saltSize  = 32
	chunkSize = 64 << 10
	tagSize   = 16
)

// ErrTampered: a sealed object does not open (altered, cut short, moved
// or sealed under another key).
var ErrTampered = errors.New("the stored profile failed its integrity check")

func objectKey(master []byte, salt []byte, bind string) (cipher.AEAD, error) {
	k, err := hkdf.Key(sha256.New, master, salt, "sandgate profile v1\x00"+bind, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func nonce(n uint64, last bool) []byte {
	var b [12]byte
	binary.BigEndian.PutUint64(b[3:11], n)
	if last {
		b[11] = 1
	}
	return b[:]
}

// sealer seals what is written to it into w; Close writes the last
// chunk.
type sealer struct {
	w    io.Writer
	aead cipher.AEAD
	buf  []byte
	n    uint64
	out  []byte
}

func newSealer(w io.Writer, master []byte, bind string) (*sealer, error) {
	salt := make([]byte, saltSize)
	rand.Read(salt)
	aead, err := objectKey(master, salt, bind)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(append([]byte(sealMagic), salt...)); err != nil {
		return nil, err
	}
	return &sealer{w: w, aead: aead, buf: make([]byte, 0, chunkSize), out: make([]byte, 0, chunkSize+tagSize)}, nil
}

func (s *sealer) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		// A full chunk is sealed only once more follows, so that Close
		// knows which is the last.
		if len(s.buf) == chunkSize {
			if err := s.flush(false); err != nil {
				return 0, err
			}
		}
		n := min(len(p), chunkSize-len(s.buf))
		s.buf = append(s.buf, p[:n]...)
		p = p[n:]
	}
	return total, nil
}

func (s *sealer) flush(last bool) error {
	s.out = s.aead.Seal(s.out[:0], nonce(s.n, last), s.buf, nil)
	s.n++
	s.buf = s.buf[:0]
	_, err := s.w.Write(s.out)
	return err
}

// Close seals what is left as the last chunk (full, a part, or empty).
func (s *sealer) Close() error { return s.flush(true) }

// opener reads a sealed object and returns its plaintext, failing with
// ErrTampered at the first chunk that does not open, or at the end when
// the last chunk is missing.
type opener struct {
	r     io.Reader
	aead  cipher.AEAD
	n     uint64
	plain []byte // opened, not yet read
	next  []byte // the chunk read ahead
	buf   []byte
	done  bool
	err   error
}

func newOpener(r io.Reader, master []byte, bind string) (*opener, error) {
	head := make([]byte, len(sealMagic)+saltSize)
	if _, err := io.ReadFull(r, head); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: the object is shorter than its header", ErrTampered)
		}
		return nil, err
	}
	if string(head[:len(sealMagic)]) != sealMagic {
		return nil, fmt.Errorf("%w: not a sealed profile", ErrTampered)
	}
	aead, err := objectKey(master, head[len(sealMagic):], bind)
	if err != nil {
		return nil, err
	}
	return &opener{r: r, aead: aead, buf: make([]byte, chunkSize+tagSize)}, nil
}

// readChunk reads the next sealed chunk: full, short (the last), or none.
func (o *opener) readChunk() ([]byte, error) {
	n, err := io.ReadFull(o.r, o.buf)
	switch {
	case err == nil:
		return append([]byte(nil), o.buf[:n]...), nil
	case errors.Is(err, io.ErrUnexpectedEOF):
		return append([]byte(nil), o.buf[:n]...), nil
	case errors.Is(err, io.EOF):
		return nil, nil
	default:
		return nil, err
	}
}

func (o *opener) Read(p []byte) (int, error) {
	for len(o.plain) == 0 {
		if o.err != nil {
			return 0, o.err
		}
		if o.done {
			return 0, io.EOF
		}
		cur := o.next
		if cur == nil {
			c, err := o.readChunk()
			if err != nil {
				o.err = err
				return 0, err
			}
			cur = c
		}
		if cur == nil {
			o.err = fmt.Errorf("%w: its last part is missing", ErrTampered)
			return 0, o.err
		}
		// Whether this chunk is the last depends on what follows it.
		last := len(cur) < chunkSize+tagSize
		o.next = nil
		if !last {
			nx, err := o.readChunk()
			if err != nil {
				o.err = err
				return 0, err
			}
			if nx == nil {
				last = true
			} else {
				o.next = nx
			}
		}
		plain, err := o.aead.Open(cur[:0], nonce(o.n, last), cur, nil)
		if err != nil {
			o.err = fmt.Errorf("%w: part %d does not open", ErrTampered, o.n)
			return 0, o.err
		}
		o.n++
		o.plain = plain
		o.done = last
	}
	n := copy(p, o.plain)
	o.plain = o.plain[n:]
	return n, nil
}
