package session

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// DiskLow says which of the disk paths has less free space than a create
// needs, and how much it has ("" when every one has enough, or the check
// is off). A path that cannot be read is skipped: a missing containerd
// root on a Kubernetes node is not a full disk.
func (m *Manager) DiskLow() string {
	if m.cfg.MinFreeDiskMB < 0 {
		return ""
	}
	for _, p := range m.cfg.DiskPaths {
		var st unix.Statfs_t
		if p == "" || unix.Statfs(p, &st) != nil {
			continue
		}
		free := int64(st.Bavail) * int64(st.Bsize) >> 20
		if free < int64(m.cfg.MinFreeDiskMB) {
			return fmt.Sprintf("%d MB free in %s, and a new session needs %d MB", free, p, m.cfg.MinFreeDiskMB)
		}
	}
	return ""
}

// checkDisk refuses a create while the host's disk is nearly full.
func (m *Manager) checkDisk() error {
	if why := m.DiskLow(); why != "" {
		return publicf(ErrUnavailable, "the host's disk is nearly full ("+why+"): no new sessions until space is freed; running sessions go on", nil)
	}
	return nil
}
