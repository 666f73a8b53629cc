package session

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate/ids"
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

// sweep has the backend remove what removed sandboxes left behind,
// sparing sessions that are starting, running or stopping.
func (m *Manager) sweep() {
	m.backend.Sweep(func(id string) bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		if s, ok := m.sessions[id]; ok {
			switch s.info.State {
			case StateStarting, StateRunning, StateStopping:
				return true
			}
		}
		return false
	})
}

// sweepCgroups removes the cgroups of a containerd namespace that live
// does not claim: those a runtime left after its container was deleted,
// when Remove's own removal had already run (gVisor sandboxes were seen
// leaving an empty one per controller). Only empty cgroups go (rmdir
// refuses any with a process).
func sweepCgroups(namespace string, live func(id string) bool) {
	a, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", namespace, "s-*"))
	b, _ := filepath.Glob(filepath.Join(cgroupRoot, namespace, "s-*"))
	for _, d := range append(a, b...) {
		if id := filepath.Base(d); ids.IsSession(id) && !live(id) {
			rmdirTree(d)
		}
	}
}

// cgroupCPU reads the CPU time a session's cgroup has used so far (v1
// cpuacct.usage, else v2 cpu.stat). Under gVisor the sandbox (sentry,
// gofer, systrap stubs) runs in the container's cgroup, so it counts too.
func cgroupCPU(namespace, id string) (time.Duration, bool) {
	path := filepath.Join(namespace, id)
	for _, dir := range []string{"cpuacct", "cpu,cpuacct"} {
		if raw, err := os.ReadFile(filepath.Join(cgroupRoot, dir, path, "cpuacct.usage")); err == nil {
			n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
			return time.Duration(n), err == nil
		}
	}
	raw, err := os.ReadFile(filepath.Join(cgroupRoot, path, "cpu.stat"))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			return time.Duration(n) * time.Microsecond, err == nil
		}
	}
	return 0, false
}
