package profile

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"
	"unicode/utf8"
)

// Tars come out of sessions (a profile's save, a workspace snapshot):
// the session's tar is the session's word, and the session may have
// replaced it. Clean reads one and writes the gateway's own: only
// directories, regular files and (where allowed) symlinks, with clean
// relative names, owned by the session user, within the configured
// bounds. What is stored, and later written into another session, is
// what Clean wrote.

// Errors of Clean; their messages are safe to show.
var (
	ErrTooLarge   = errors.New("the archive is larger than this gateway keeps")
	ErrBadArchive = errors.New("the archive is not a well-formed tar")
)

// Rules say what Clean keeps.
type Rules struct {
	// MaxBytes bounds the file contents, summed, as written: a sparse
	// file counts its full size, holes and all. MaxBytes and MaxEntries
	// of 0 bound nothing; a session's tar always gets both.
	MaxBytes   int64
	MaxEntries int
	// Skip drops an entry by its clean name, and everything under it.
	Skip func(name string) bool
	// Symlinks keeps symbolic links (their targets unchecked: they are
	// only ever followed inside a session) and hard links to files kept
	// earlier in the archive.
	Symlinks bool
	// Mounted names directories the archive goes into that are there
	// already and may not be the unpacking user's (a volume's mount
	// point): their own entries are dropped, so that tar leaves them as
	// they are; what is under them is kept.
	Mounted func(name string) bool
}

// Summary is what Clean kept and dropped.
type Summary struct {
	Files   int   `json:"files"`
	Dirs    int   `json:"dirs"`
	Links   int   `json:"links"`
	Skipped int   `json:"skipped"`
	Bytes   int64 `json:"bytes"`
}

// Name bounds: a name is at most maxName bytes and maxDepth levels.
const (
	maxName  = 1024
	maxDepth = 64
)

// Clean copies the tar in src to dst as the gateway's own, or fails
// with ErrTooLarge or ErrBadArchive.
func Clean(dst io.Writer, src io.Reader, r Rules) (Summary, error) {
	var sum Summary
	if r.MaxBytes > 0 && r.MaxEntries > 0 {
		// What is read at all is bounded too: what is kept, as much
		// again of what is dropped, and the headers of the entries.
		src = &boundedReader{r: src, left: 2*r.MaxBytes + int64(r.MaxEntries+2)*4096}
	}
	tr := tar.NewReader(src)
	tw := tar.NewWriter(dst)
	entries := 0
	files := map[string]bool{} // regular files kept: what a hard link may name
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return sum, bad(err)
		}
		entries++
		if r.MaxEntries > 0 && entries > r.MaxEntries {
			return sum, fmt.Errorf("%w: more than %d entries", ErrTooLarge, r.MaxEntries)
		}
		name, ok := cleanName(h.Name)
		if !ok {
			return sum, fmt.Errorf("%w: an entry's name is not a clean relative path", ErrBadArchive)
		}
		if name == "" { // the archive's own root
			continue
		}
		if r.Skip != nil && skips(r.Skip, name) {
			sum.Skipped++
			continue
		}
		out := &tar.Header{Name: name, Uid: 1000, Gid: 1000, ModTime: clampTime(h.ModTime), Format: tar.FormatPAX}
		switch h.Typeflag {
		case tar.TypeDir:
			if r.Mounted != nil && r.Mounted(name) {
				continue
			}
			out.Typeflag, out.Mode, out.Name = tar.TypeDir, 0o700|int64(h.Mode&0o755), name+"/"
			sum.Dirs++
		case tar.TypeReg, tar.TypeRegA:
			// Subtracted, not added: a size near MaxInt64 (a sparse
			// entry costs a few header bytes to claim one) must not wrap
			// the sum below the bound.
			if h.Size < 0 || r.MaxBytes > 0 && h.Size > r.MaxBytes-sum.Bytes {
				return sum, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, r.MaxBytes)
			}
			out.Typeflag, out.Mode, out.Size = tar.TypeReg, 0o600|int64(h.Mode&0o755), h.Size
			sum.Files++
			sum.Bytes += h.Size
			files[name] = true
		case tar.TypeLink:
			target, ok := cleanName(h.Linkname)
			if !r.Symlinks || !ok || !files[target] {
				sum.Skipped++
				continue
			}
			out.Typeflag, out.Mode, out.Linkname = tar.TypeLink, 0o600|int64(h.Mode&0o755), target
			sum.Links++
		case tar.TypeSymlink:
			if !r.Symlinks || h.Linkname == "" || len(h.Linkname) > maxName || !utf8.ValidString(h.Linkname) || strings.ContainsRune(h.Linkname, 0) {
				sum.Skipped++
				continue
			}
			out.Typeflag, out.Mode, out.Linkname = tar.TypeSymlink, 0o777, h.Linkname
			sum.Links++
		default:
			// Devices, fifos, sockets: nothing a profile or a workspace
			// needs kept.
			sum.Skipped++
			continue
		}
		if err := tw.WriteHeader(out); err != nil {
			return sum, fmt.Errorf("%w: %v", ErrBadArchive, err)
		}
		if out.Typeflag == tar.TypeReg {
			n, err := io.Copy(tw, io.LimitReader(tr, h.Size))
			if err != nil {
				return sum, bad(err)
			}
			if n != h.Size {
				return sum, fmt.Errorf("%w: an entry is shorter than its header says", ErrBadArchive)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return sum, err
	}
	return sum, nil
}

// bad is a read error as Clean returns it: ErrTooLarge as it is, any
// other as ErrBadArchive.
func bad(err error) error {
	if errors.Is(err, ErrTooLarge) {
		return err
	}
	return fmt.Errorf("%w: %v", ErrBadArchive, err)
}

// boundedReader fails with ErrTooLarge past its bound.
type boundedReader struct {
	r    io.Reader
	left int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("%w: the archive goes on past what its bounds allow", ErrTooLarge)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// skips tells whether skip drops name or a directory above it (an
// archive need not list the directories of its files).
func skips(skip func(string) bool, name string) bool {
	for i := 0; i <= len(name); i++ {
		if (i == len(name) || name[i] == '/') && skip(name[:i]) {
			return true
		}
	}
	return false
}

// cleanName returns a tar entry's name as a clean relative path ("" for
// the archive's root), or false when it is absolute, climbs out, or is
// not a plain UTF-8 name within the bounds.
func cleanName(n string) (string, bool) {
	if len(n) > maxName || !utf8.ValidString(n) || strings.ContainsAny(n, "\x00\\") || strings.HasPrefix(n, "/") {
		return "", false
	}
	n = strings.TrimSuffix(n, "/")
	for strings.HasPrefix(n, "./") {
		n = n[2:]
	}
	if n == "." || n == "" {
		return "", true
	}
	c := path.Clean(n)
	if c != n || c == ".." || strings.HasPrefix(c, "../") || strings.Count(c, "/") >= maxDepth {
		return "", false
	}
	for _, r := range c {
		if r < 0x20 || r == 0x7f {
			return "", false
		}
	}
	return c, true
}

// clampTime keeps a modification time within what tar and the session's
// tools read back alike.
func clampTime(t time.Time) time.Time {
	lo, hi := time.Unix(0, 0), time.Now().Add(24*time.Hour)
	switch {
	case t.Before(lo):
		return lo
	case t.After(hi):
		return hi
	}
	return t.Truncate(time.Second)
}

// ProfileSkip drops what a browser profile keeps that is a cache, a lock
// or a crash report: not part of the state a profile carries over.
func ProfileSkip(name string) bool {
	base := path.Base(name)
	top := !strings.Contains(name, "/")
	depth := strings.Count(name, "/")
	switch {
	case top && (strings.HasPrefix(base, "Singleton") || strings.Contains(base, "Cache") || strings.HasSuffix(base, "_crx_cache") ||
		base == "Crashpad" || strings.HasPrefix(base, "BrowserMetrics")):
		return true
	case depth == 1 && strings.HasSuffix(base, "Cache"): // Default/Cache, Default/Code Cache, Default/GPUCache ...
		return true
	case depth == 2 && strings.HasSuffix(name, "/Service Worker/CacheStorage"):
		return true
	}
	return false
}

// SnapshotSkip drops the session's kept browser profile from a workspace
// snapshot: a profile is stored sealed, a snapshot is not.
func SnapshotSkip(name string) bool { return name == ProfileDir }

// ProfileDir is where a session keeps its profile, under its home.
const ProfileDir = ".sandgate-profile"
