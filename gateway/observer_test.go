package gateway

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestLimitedReaderTellsTheFileFromTheStore: a download read twice (to
// hash, then to upload) as it was fails neither time (the control); one
// cut or grown between the reads fails the second with its own error,
// noted as the file's fault; one over the limit fails too.
func TestLimitedReaderTellsTheFileFromTheStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "download")
	read := func(limit int64, between func()) (*limitedReader, error) {
		t.Helper()
		if err := os.WriteFile(path, make([]byte, 1000), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		l := &limitedReader{r: f, limit: limit, left: limit, first: -1}
		if _, err := io.Copy(io.Discard, l); err != nil {
			return l, err
		}
		between()
		if _, err := l.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		_, err = io.Copy(io.Discard, l)
		return l, err
	}
	if l, err := read(4096, func() {}); err != nil || l.err != nil {
		t.Fatalf("read twice as it was: %v, noted %v", err, l.err)
	}
	l, err := read(4096, func() { os.Truncate(path, 500) })
	if !errors.Is(err, errDownloadChanged) || !errors.Is(l.err, errDownloadChanged) {
		t.Fatalf("cut between the reads: %v, noted %v", err, l.err)
	}
	// Grown: minio-go reads a part into a buffer of its own size, which
	// the longer file would fill with no end seen; the read ends where
	// the first did.
	if err := os.WriteFile(path, make([]byte, 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l = &limitedReader{r: f, limit: 4096, left: 4096, first: -1}
	io.Copy(io.Discard, l)
	g, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	g.Write(make([]byte, 1000))
	g.Close()
	l.Seek(0, io.SeekStart)
	if n, err := io.ReadFull(l, make([]byte, 2000)); !errors.Is(err, errDownloadChanged) || !errors.Is(l.err, errDownloadChanged) {
		t.Fatalf("longer between the reads: %d bytes read, %v, noted %v", n, err, l.err)
	}
	l, err = read(999, func() {})
	if !errors.Is(err, errDownloadTooLarge) || !errors.Is(l.err, errDownloadTooLarge) {
		t.Fatalf("over the limit: %v, noted %v", err, l.err)
	}
}
