package images

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Builder builds session images with mmdebstrap and imports them into
// containerd. Built archives are kept in CacheDir, keyed by the
// definition's hash, so a machine builds each definition once.
type Builder struct {
	Client      *containerd.Client
	CacheDir    string
	Snapshotter string
	Mirrors     []string
	Log         *slog.Logger
}

// DefaultMirrors are the apt sources the image is built from.
var DefaultMirrors = []string{
	"deb http://deb.debian.org/debian bookworm main",
	"deb http://deb.debian.org/debian bookworm-updates main",
	"deb http://deb.debian.org/debian-security bookworm-security main",
}

// Ensure makes sure the image of d is in containerd and unpacked, building
// it only when neither containerd nor the cache holds it. It returns the
// image reference.
func (b *Builder) Ensure(ctx context.Context, d Definition) (string, error) {
	ref := d.Ref()
	if img, err := b.Client.GetImage(ctx, ref); err == nil {
		if ok, err := img.IsUnpacked(ctx, b.snapshotter()); err == nil && ok {
			return ref, nil
		}
		return ref, b.unpack(ctx, img)
	} else if !errdefs.IsNotFound(err) {
		return "", fmt.Errorf("look up image %s: %w", ref, err)
	}
	archive := b.archive(d)
	if _, err := os.Stat(archive); err != nil {
		start := time.Now()
		b.Log.Info("building session image", "ref", ref)
		if err := b.build(ctx, d, ref, archive); err != nil {
			return "", err
		}
		b.Log.Info("built session image", "ref", ref, "took", time.Since(start).Round(time.Second))
	}
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	imgs, err := b.Client.Import(ctx, f)
	if err != nil {
		return "", fmt.Errorf("import %s: %w", archive, err)
	}
	for _, i := range imgs {
		if i.Name == ref {
			return ref, b.unpack(ctx, containerd.NewImage(b.Client, i))
		}
	}
	return "", fmt.Errorf("archive %s holds no image named %s", archive, ref)
}

// archive is where the image of d is kept once built.
func (b *Builder) archive(d Definition) string {
	return filepath.Join(b.CacheDir, "session-"+d.Hash()+".oci.tar")
}

func (b *Builder) snapshotter() string {
	if b.Snapshotter == "" {
		return containerd.DefaultSnapshotter
	}
	return b.Snapshotter
}

func (b *Builder) unpack(ctx context.Context, img containerd.Image) error {
	if err := img.Unpack(ctx, b.snapshotter()); err != nil {
		return fmt.Errorf("unpack %s: %w", img.Name(), err)
	}
	return nil
}

// build runs mmdebstrap into a root filesystem tarball and wraps it as an
// OCI image archive at dst.
func (b *Builder) build(ctx context.Context, d Definition, ref, dst string) error {
	if err := os.MkdirAll(b.CacheDir, 0o700); err != nil {
		return err
	}
	work, err := os.MkdirTemp(b.CacheDir, "build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	files := filepath.Join(work, "files.tar")
	if err := writeFilesTar(files, d.Files); err != nil {
		return err
	}
	rootfs := filepath.Join(work, "rootfs.tar")
	args := []string{
		"--variant=minbase",
		"--mode=root",
		"--aptopt=APT::Install-Recommends \"false\"",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--include=" + join(d.Packages, ","),
		"--customize-hook=tar-in " + files + " /",
		`--customize-hook=chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/bash sandgate`,
		`--customize-hook=mkdir -p -m 1777 "$1/tmp/.X11-unix"`,
		`--customize-hook=mkdir -p "$1/home/sandgate/workspace" && chown 1000:1000 "$1/home/sandgate/workspace"`,
		// Without a font cache Chromium needs seconds to answer CDP. The
		// cache holds each font directory's mtime, and the tarball clamps
		// every mtime to SOURCE_DATE_EPOCH (mmdebstrap's start unless set):
		// the directories get that time first, or every process finds the
		// cache stale and rescans the fonts (100 ms of each Chromium start).
		`--customize-hook=find "$1/usr/share/fonts" "$1/usr/local/share/fonts" -type d -exec touch -m -d "@$SOURCE_DATE_EPOCH" {} +`,
		`--customize-hook=chroot "$1" fc-cache -f`,
		`--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*`,
		Suite, rootfs,
	}
	args = append(args, b.mirrors()...)
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("SOURCE_DATE_EPOCH=%d", time.Now().Unix()))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mmdebstrap: %w\n%s", err, tail(out.Bytes(), 4000))
	}
	tmp := dst + ".tmp"
	if err := writeOCIArchive(tmp, rootfs, ref); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, dst)
}

func (b *Builder) mirrors() []string {
	if len(b.Mirrors) > 0 {
		return b.Mirrors
	}
	return DefaultMirrors
}

func writeFilesTar(path string, files map[string]File) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for p, file := range files {
		hdr := &tar.Header{Name: "." + p, Mode: int64(file.Mode), Size: int64(len(file.Data)), Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(file.Data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// writeOCIArchive writes an OCI image layout tarball with one
// uncompressed layer, the root filesystem tarball at rootfs.
func writeOCIArchive(dst, rootfs, ref string) error {
	layerDigest, layerSize, err := digestFile(rootfs)
	if err != nil {
		return err
	}
	cfg := ocispec.Image{
		Platform: ocispec.Platform{Architecture: runtime.GOARCH, OS: "linux"},
		Config: ocispec.ImageConfig{
			User:       "1000:1000",
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/home/sandgate", "LANG=C.UTF-8"},
			Entrypoint: []string{"/usr/bin/tini", "-g", "--", "/usr/local/bin/sandgate-session"},
			WorkingDir: "/home/sandgate",
		},
		RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{layerDigest}},
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	manifest := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(cfgJSON), Size: int64(len(cfgJSON))},
		Layers:    []ocispec.Descriptor{{MediaType: ocispec.MediaTypeImageLayer, Digest: layerDigest, Size: layerSize}},
	}
	manJSON, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	index := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{{
			MediaType:   ocispec.MediaTypeImageManifest,
			Digest:      digest.FromBytes(manJSON),
			Size:        int64(len(manJSON)),
			Annotations: map[string]string{"io.containerd.image.name": ref, ocispec.AnnotationRefName: ref},
		}},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}

	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := add(ocispec.ImageLayoutFile, []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	layer, err := os.Open(rootfs)
	if err != nil {
		return err
	}
	defer layer.Close()
	if err := tw.WriteHeader(&tar.Header{Name: "blobs/sha256/" + layerDigest.Encoded(), Mode: 0o644, Size: layerSize, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, layer); err != nil {
		return err
	}
	for _, blob := range [][]byte{cfgJSON, manJSON} {
		if err := add("blobs/sha256/"+digest.FromBytes(blob).Encoded(), blob); err != nil {
			return err
		}
	}
	if err := add("index.json", indexJSON); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

func digestFile(path string) (digest.Digest, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return digest.NewDigest(digest.SHA256, h), n, nil
}

func join(ss []string, sep string) string {
	var b bytes.Buffer
	for i, s := range ss {
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(s)
	}
	return b.String()
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
