package profile

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
)

type entry struct {
	name string
	typ  byte
	body string
	link string
	size int64 // overrides len(body) in the header when set
}

func mkTar(t testing.TB, es []entry) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body)), Linkname: e.link}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return b.Bytes()
}

func names(t testing.TB, raw []byte) map[string]string {
	out := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 1000 || h.Gid != 1000 {
			t.Errorf("%s owned by %d:%d", h.Name, h.Uid, h.Gid)
		}
		body, _ := io.ReadAll(tr)
		out[h.Name] = string(body) + h.Linkname
	}
}

// TestCleanProfile: a profile's tar keeps its state and loses its caches,
// locks and anything that is not a directory or a file; the kept files
// come out byte for byte.
func TestCleanProfile(t *testing.T) {
	in := mkTar(t, []entry{
		{name: "./", typ: tar.TypeDir},
		{name: "./Local State", typ: tar.TypeReg, body: "{}"},
		{name: "./SingletonLock", typ: tar.TypeSymlink, link: "sandgate-42"},
		{name: "./ShaderCache/", typ: tar.TypeDir},
		{name: "./ShaderCache/data_0", typ: tar.TypeReg, body: "x"},
		{name: "./Default/", typ: tar.TypeDir},
		{name: "./Default/Network/", typ: tar.TypeDir},
		{name: "./Default/Network/Cookies", typ: tar.TypeReg, body: "cookie jar"},
		{name: "./Default/Cache/", typ: tar.TypeDir},
		{name: "./Default/Cache/Cache_Data/f_000001", typ: tar.TypeReg, body: "cached"},
		{name: "./Default/Code Cache/js/x", typ: tar.TypeReg, body: "code"},
		{name: "./Default/Local Storage/leveldb/000003.log", typ: tar.TypeReg, body: "ls"},
		{name: "./Default/Service Worker/ScriptCache/abc", typ: tar.TypeReg, body: "sw"},
		{name: "./Default/Service Worker/CacheStorage/x", typ: tar.TypeReg, body: "cs"},
		{name: "./Default/fifo", typ: tar.TypeFifo},
		{name: "./Default/link", typ: tar.TypeSymlink, link: "/etc/shadow"},
	})
	var out bytes.Buffer
	sum, err := Clean(&out, bytes.NewReader(in), Rules{MaxBytes: 1 << 20, MaxEntries: 100, Skip: ProfileSkip})
	if err != nil {
		t.Fatal(err)
	}
	got := names(t, out.Bytes())
	want := map[string]string{
		"Local State": "{}", "Default/": "", "Default/Network/": "", "Default/Network/Cookies": "cookie jar",
		"Default/Local Storage/leveldb/000003.log": "ls", "Default/Service Worker/ScriptCache/abc": "sw",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%q: got %q, want %q", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("kept %q", k)
		}
	}
	if sum.Files != 4 || sum.Bytes != int64(len("{}cookie jarlssw")) {
		t.Errorf("summary %+v", sum)
	}
}

// TestCleanRefuses: names that climb out or are absolute, too many bytes
// or entries, a header that claims more than follows: refused, each with
// its error; the same archive within the bounds is the control.
func TestCleanRefuses(t *testing.T) {
	ok := []entry{{name: "a/", typ: tar.TypeDir}, {name: "a/b", typ: tar.TypeReg, body: strings.Repeat("x", 100)}}
	if _, err := Clean(io.Discard, bytes.NewReader(mkTar(t, ok)), Rules{MaxBytes: 100, MaxEntries: 2}); err != nil {
		t.Fatalf("control: %v", err)
	}
	for _, c := range []struct {
		name string
		raw  []byte
		r    Rules
		want error
	}{
		{"climbs out", mkTar(t, []entry{{name: "../x", typ: tar.TypeReg, body: "x"}}), Rules{}, ErrBadArchive},
		{"climbs out inside", mkTar(t, []entry{{name: "a/../../x", typ: tar.TypeReg, body: "x"}}), Rules{}, ErrBadArchive},
		{"absolute", mkTar(t, []entry{{name: "/etc/passwd", typ: tar.TypeReg, body: "x"}}), Rules{}, ErrBadArchive},
		{"control character", mkTar(t, []entry{{name: "a\nb", typ: tar.TypeReg, body: "x"}}), Rules{}, ErrBadArchive},
		{"too many bytes", mkTar(t, ok), Rules{MaxBytes: 99}, ErrTooLarge},
		{"too many entries", mkTar(t, ok), Rules{MaxEntries: 1}, ErrTooLarge},
		{"cut short", mkTar(t, ok)[:512+512+50], Rules{}, ErrBadArchive},
		{"not a tar", []byte(strings.Repeat("garbage!", 200)), Rules{}, ErrBadArchive},
	} {
		if _, err := Clean(io.Discard, bytes.NewReader(c.raw), c.r); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

// TestCleanSnapshot: a snapshot keeps symlinks (as links) and drops the
// kept profile; with its workspace mounted, it drops the workspace's own
// entry (tar then leaves the mount point as it is).
func TestCleanSnapshot(t *testing.T) {
	in := mkTar(t, []entry{
		{name: "./workspace/", typ: tar.TypeDir},
		{name: "./workspace/a.txt", typ: tar.TypeReg, body: "a"},
		{name: "./workspace/l", typ: tar.TypeSymlink, link: "a.txt"},
		{name: "./workspace/hard", typ: tar.TypeLink, link: "./workspace/a.txt"},
		{name: "./workspace/dangling", typ: tar.TypeLink, link: "./workspace/nothing"},
		{name: "./workspace/out", typ: tar.TypeLink, link: "../etc/passwd"},
		{name: "./.sandgate-profile/", typ: tar.TypeDir},
		{name: "./.sandgate-profile/Default/Cookies", typ: tar.TypeReg, body: "secret cookies"},
	})
	var out bytes.Buffer
	if _, err := Clean(&out, bytes.NewReader(in), Rules{Skip: SnapshotSkip, Symlinks: true}); err != nil {
		t.Fatal(err)
	}
	got := names(t, out.Bytes())
	if _, dir := got["workspace/"]; !dir || got["workspace/a.txt"] != "a" || got["workspace/l"] != "a.txt" || got["workspace/hard"] != "workspace/a.txt" || len(got) != 4 {
		t.Fatalf("got %v", got)
	}
	// The workspace, mounted where it is unpacked: its own entry goes,
	// what is under it stays.
	out.Reset()
	if _, err := Clean(&out, bytes.NewReader(in), Rules{Skip: SnapshotSkip, Symlinks: true, Mounted: func(n string) bool { return n == "workspace" }}); err != nil {
		t.Fatal(err)
	}
	got = names(t, out.Bytes())
	if _, dir := got["workspace/"]; dir || got["workspace/a.txt"] != "a" || got["workspace/l"] != "a.txt" || got["workspace/hard"] != "workspace/a.txt" || len(got) != 3 {
		t.Fatalf("with the workspace mounted: got %v", got)
	}
}

// FuzzClean: whatever a session sends, Clean returns (never panics), and
// what it writes is a tar that Clean takes again unchanged in what it
// keeps.
func FuzzClean(f *testing.F) {
	f.Add(mkTar(f, []entry{{name: "a/", typ: tar.TypeDir}, {name: "a/b", typ: tar.TypeReg, body: "hello"}}))
	f.Add(mkTar(f, []entry{{name: "../x", typ: tar.TypeReg, body: "x"}}))
	f.Add(mkTar(f, []entry{{name: "l", typ: tar.TypeSymlink, link: "/"}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		r := Rules{MaxBytes: 1 << 16, MaxEntries: 64, Skip: ProfileSkip, Symlinks: true}
		var out bytes.Buffer
		sum, err := Clean(&out, bytes.NewReader(raw), r)
		if err != nil {
			return
		}
		var again bytes.Buffer
		sum2, err := Clean(&again, bytes.NewReader(out.Bytes()), r)
		if err != nil || sum2.Files != sum.Files || sum2.Bytes != sum.Bytes || sum2.Links != sum.Links {
			t.Fatalf("cleaned output does not clean again the same: %v %+v %+v", err, sum, sum2)
		}
	})
}

// TestCleanBoundsWhatItReads: an archive of dropped entries (a huge
// skipped cache) is refused once it goes past twice the kept bound; the
// same archive with a small cache (the control) is read whole.
func TestCleanBoundsWhatItReads(t *testing.T) {
	r := Rules{MaxBytes: 1 << 10, MaxEntries: 4, Skip: ProfileSkip}
	small := mkTar(t, []entry{{name: "ShaderCache/x", typ: tar.TypeReg, body: strings.Repeat("c", 100)}, {name: "Local State", typ: tar.TypeReg, body: "{}"}})
	if _, err := Clean(io.Discard, bytes.NewReader(small), r); err != nil {
		t.Fatalf("control: %v", err)
	}
	big := mkTar(t, []entry{{name: "ShaderCache/x", typ: tar.TypeReg, body: strings.Repeat("c", 64<<10)}, {name: "Local State", typ: tar.TypeReg, body: "{}"}})
	if _, err := Clean(io.Discard, bytes.NewReader(big), r); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a 64 KiB dropped cache under a 1 KiB bound: %v", err)
	}
}

// TestCleanSparseOverflow: a sparse entry that claims a size near
// MaxInt64 after a kept file is refused, not let wrap the sum below the
// bound and write without end (a few header bytes claim it; the tar
// reader makes up its holes without reading). The control: the same
// archive with a sparse entry of a size within the bound is kept whole.
func TestCleanSparseOverflow(t *testing.T) {
	// Written by hand: archive/tar writes no GNU sparse entries.
	archive := func(size int64) []byte {
		var in []byte
		in = append(in, rawHeader(t, "a", tar.TypeReg, 1)...)
		in = append(in, padBlock([]byte("x"))...)
		// A PAX GNU sparse 1.0 entry: its real size in the PAX records,
		// an empty map of data in its body (all hole).
		recs := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
			paxRecord("GNU.sparse.name", "hole") + paxRecord("GNU.sparse.realsize", fmt.Sprint(size))
		in = append(in, rawHeader(t, "PaxHeaders/hole", tar.TypeXHeader, int64(len(recs)))...)
		in = append(in, padBlock([]byte(recs))...)
		in = append(in, rawHeader(t, "GNUSparseFile.0/hole", tar.TypeReg, 512)...)
		in = append(in, padBlock([]byte("0\n"))...)
		return append(in, make([]byte, 1024)...)
	}
	var out countWriter
	if sum, err := Clean(&out, bytes.NewReader(archive(100_000)), Rules{MaxBytes: 1 << 20, MaxEntries: 10}); err != nil || sum.Bytes != 100_001 || out.n < 100_001 {
		t.Fatalf("control: a sparse file within the bound: %v, %d bytes written", err, out.n)
	}
	out = countWriter{limit: 64 << 20}
	_, err := Clean(&out, bytes.NewReader(archive(math.MaxInt64)), Rules{MaxBytes: 1 << 20, MaxEntries: 10})
	if !errors.Is(err, ErrTooLarge) || out.n > 1<<20+64<<10 {
		t.Fatalf("a sparse file of MaxInt64 bytes: %v after %d bytes written, want ErrTooLarge within the bound", err, out.n)
	}
}

// countWriter counts what it is given, and fails past limit (if any).
type countWriter struct{ n, limit int64 }

func (w *countWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	if w.limit > 0 && w.n > w.limit {
		return 0, errors.New("the test's writer is full")
	}
	return len(p), nil
}

// rawHeader is a ustar header block.
func rawHeader(t *testing.T, name string, typ byte, size int64) []byte {
	b := make([]byte, 512)
	copy(b, name)
	copy(b[100:], "0000644\x00")
	copy(b[108:], "0001750\x00")
	copy(b[116:], "0001750\x00")
	copy(b[124:], fmt.Sprintf("%011o\x00", size))
	copy(b[136:], "00000000000\x00")
	b[156] = typ
	copy(b[257:], "ustar\x0000")
	copy(b[148:], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// padBlock pads b to whole 512-byte blocks.
func padBlock(b []byte) []byte {
	return append(b, make([]byte, (512-len(b)%512)%512)...)
}

// paxRecord is one PAX record, its length counted in itself.
func paxRecord(k, v string) string {
	n := len(k) + len(v) + 3 // " ", "=", "\n"
	d := 1
	for len(fmt.Sprint(n+d)) != d {
		d++
	}
	return fmt.Sprintf("%d %s=%s\n", n+d, k, v)
}
