package session

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// removeCgroups removes a deleted container's cgroup directories, which
// the runtime does not always remove itself (an empty one per controller
// was seen left behind by some gVisor sandboxes). path is the spec's
// cgroupsPath; only paths under this manager's namespace are touched, and
// only empty cgroups can be removed (rmdir refuses any with a process).
func removeCgroups(namespace, path string) error {
	if path == "" || !strings.HasPrefix(filepath.Clean(path), "/"+namespace+"/") {
		return nil
	}
	dirs := []string{filepath.Join(cgroupRoot, path)} // cgroup v2
	ents, _ := os.ReadDir(cgroupRoot)
	for _, e := range ents {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(cgroupRoot, e.Name(), path)) // v1 controllers
		}
	}
	var errs []error
	for _, d := range dirs {
		if err := rmdirTree(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rmdirTree removes a cgroup directory and the cgroups below it, deepest
// first. Missing ones count as removed.
func rmdirTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := rmdirTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
