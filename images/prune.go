package images

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/images"
)

// Prune removes what earlier definitions left: each session image of
// the namespace other than current's that no container uses (containerd
// then collects its content and unpacked layers), and the archive in
// CacheDir of each image it removes. An image a container still uses (a
// session adopted from the gateway before an upgrade) stays until a
// later Prune finds it unused; so does an archive whose image is not in
// this namespace (another gateway's on this host, sharing the cache).
// It returns the references and archives it removed; an error leaves
// the rest for the next Prune.
func (b *Builder) Prune(ctx context.Context, current Definition) ([]string, error) {
	keep := current.Ref()
	used := map[string]bool{}
	cs, err := b.Client.ContainerService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	for _, c := range cs {
		used[c.Image] = true
	}
	imgs, err := b.Client.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var removed []string
	var errs []error
	for _, img := range imgs {
		tag, ok := strings.CutPrefix(img.Name, Repository+":")
		if !ok || img.Name == keep || used[img.Name] {
			continue
		}
		// Synchronous: the space is free when Prune returns.
		if err := b.Client.ImageService().Delete(ctx, img.Name, images.SynchronousDelete()); err != nil {
			errs = append(errs, fmt.Errorf("remove image %s: %w", img.Name, err))
			continue
		}
		removed = append(removed, img.Name)
		// The archive of that definition (Ref is a prefix of its hash).
		if b.CacheDir == "" || len(tag) != refHashLen || strings.ContainsAny(tag, "/*?[\\") {
			continue
		}
		archives, _ := filepath.Glob(filepath.Join(b.CacheDir, "session-"+tag+"*.oci.tar"))
		for _, a := range archives {
			if a == b.archive(current) {
				continue
			}
			if err := os.Remove(a); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, a)
		}
	}
	return removed, errors.Join(errs...)
}
