package gateway

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// frame is one sandgate-exec frame.
func frame(id byte, data string) []byte {
	b := []byte{id, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(data)))
	return append(b, data...)
}

type frameRun struct {
	records  []execRecord
	err      bool
	ended    bool
	timedOut bool
	code     int
}

// feed writes data to a fresh frameReader in pieces of step bytes, as a
// pipe would hand it over, and returns what came out.
func feed(t *testing.T, data []byte, step int) frameRun {
	c := make(chan execRecord, len(data)/5+2)
	out, errw := &recordWriter{stream: "stdout", c: c}, &recordWriter{stream: "stderr", c: c}
	f := &frameReader{streams: map[byte]*recordWriter{1: out, 2: errw}}
	var run frameRun
	for len(data) > 0 {
		n := min(step, len(data))
		w, err := f.Write(data[:n])
		if err != nil {
			run.err = true
			break
		}
		if w != n {
			t.Fatalf("Write took %d of %d bytes without an error", w, n)
		}
		if len(f.buf) > 5+maxExecFrame {
			t.Fatalf("the reader holds %d bytes, over one frame", len(f.buf))
		}
		data = data[n:]
	}
	close(c)
	for r := range c {
		run.records = append(run.records, r)
	}
	run.ended, run.timedOut, run.code = f.ended, f.timedOut, f.code
	return run
}

func TestFrameReader(t *testing.T) {
	in := bytes.Join([][]byte{frame(1, "out"), frame(2, "err"), frame(9, "unknown"), frame(1, ""), frame(3, "exit 7")}, nil)
	for _, step := range []int{1, 3, len(in)} {
		r := feed(t, in, step)
		if r.err || !r.ended || r.timedOut || r.code != 7 || len(r.records) != 3 ||
			r.records[0].Stream != "stdout" || string(r.records[0].Data) != "out" || r.records[1].Stream != "stderr" || string(r.records[1].Data) != "err" {
			t.Fatalf("step %d: %+v", step, r)
		}
	}
	if r := feed(t, frame(3, "timeout 124"), 2); !r.ended || !r.timedOut || r.code != 124 {
		t.Fatalf("timeout: %+v", r)
	}
	// A frame announcing more than the limit is refused before its bytes
	// are held.
	big := []byte{1, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(big[1:], maxExecFrame+1)
	if r := feed(t, big, len(big)); !r.err {
		t.Fatalf("a frame over the limit was accepted: %+v", r)
	}
}

// FuzzFrameReader: any byte stream, cut anywhere, gives the same records
// and end as the same stream in one piece, never panics, and never holds
// more than one frame.
func FuzzFrameReader(f *testing.F) {
	f.Add(bytes.Join([][]byte{frame(1, "hello\n"), frame(2, "oops"), frame(3, "exit 0")}, nil), uint8(2))
	f.Add(frame(3, "timeout 124"), uint8(0))
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff}, uint8(4))
	f.Add([]byte{3, 0, 0, 0, 4, 'e', 'x', 'i', 't'}, uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		whole := feed(t, data, len(data)+1)
		cut := feed(t, data, int(step)+1)
		if whole.err != cut.err || whole.ended != cut.ended || whole.timedOut != cut.timedOut || whole.code != cut.code || len(whole.records) != len(cut.records) {
			t.Fatalf("whole %+v, cut every %d bytes %+v", whole, int(step)+1, cut)
		}
		for i := range whole.records {
			if whole.records[i].Stream != cut.records[i].Stream || !bytes.Equal(whole.records[i].Data, cut.records[i].Data) {
				t.Fatalf("record %d differs: %+v / %+v", i, whole.records[i], cut.records[i])
			}
		}
	})
}
