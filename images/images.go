// Package images owns the definition of the session image and the builder
// that turns it into an OCI image inside containerd. The image is tagged by
// a hash of its definition, so an unchanged definition is never rebuilt.
package images

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"sort"
	"strings"
)

//go:embed session
var sessionFS embed.FS

// builderVersion changes when the build steps change in a way the
// definition files do not show.
const builderVersion = "5"

// Suite is the Debian release the session image is built from.
const Suite = "bookworm"

// Repository is the name under which session images are stored.
const Repository = "sandgate.local/session"

// Definition is what a session image is built from.
type Definition struct {
	Packages []string
	// Files are copied into the root filesystem, path to content and mode.
	Files map[string]File
}

// File is one file of the image's root filesystem.
type File struct {
	Data []byte
	Mode fs.FileMode
}

// SessionDefinition returns the definition of the session image.
func SessionDefinition() Definition {
	d := Definition{Files: map[string]File{}}
	raw, err := sessionFS.ReadFile("session/packages.txt")
	if err != nil {
		panic("images: embedded packages.txt missing: " + err.Error())
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		d.Packages = append(d.Packages, line)
	}
	sort.Strings(d.Packages)
	err = fs.WalkDir(sessionFS, "session/rootfs", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		data, err := sessionFS.ReadFile(p)
		if err != nil {
			return err
		}
		mode := fs.FileMode(0o644)
		if strings.Contains(p, "/bin/") {
			mode = 0o755
		}
		d.Files[strings.TrimPrefix(p, "session/rootfs")] = File{Data: data, Mode: mode}
		return nil
	})
	if err != nil {
		panic("images: embedded rootfs unreadable: " + err.Error())
	}
	return d
}

// Hash is a digest of everything the image is built from.
func (d Definition) Hash() string {
	h := sha256.New()
	h.Write([]byte("builder " + builderVersion + "\nsuite " + Suite + "\n"))
	for _, p := range d.Packages {
		h.Write([]byte("package " + p + "\n"))
	}
	paths := make([]string, 0, len(d.Files))
	for p := range d.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		f := d.Files[p]
		sum := sha256.Sum256(f.Data)
		h.Write([]byte("file " + p + " " + f.Mode.String() + " " + hex.EncodeToString(sum[:]) + "\n"))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Ref is the image reference the definition is stored under: its
// hash's first refHashLen digits as the tag.
func (d Definition) Ref() string {
	return Repository + ":" + d.Hash()[:refHashLen]
}

const refHashLen = 16
