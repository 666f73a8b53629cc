package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/contrib/seccomp"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Container labels. They let a restarted gateway rebuild its sessions from
// containerd alone.
const (
	labelSession = "sandgate.session"
	labelTenant  = "sandgate.tenant"
	labelExpires = "sandgate.expires"
	labelCreated = "sandgate.created"
	labelAddr    = "sandgate.addr"
	labelInfo    = "sandgate.info"
	labelRevoked = "sandgate.revoked." // + preview id; value: unix expiry
)

// Session processes run as this user, created in the image.
const sessionUID, sessionGID = 1000, 1000

// storedInfo is the part of Info kept in a label.
type storedInfo struct {
	Kind        Kind              `json:"kind"`
	Runtime     string            `json:"runtime"`
	IdleTimeout int               `json:"idle"`
	Resources   Resources         `json:"resources"`
	Screen      Screen            `json:"screen"`
	Record      bool              `json:"record"`
	Labels      map[string]string `json:"labels"`
	Egress      Egress            `json:"egress"`
	Start       string            `json:"start,omitempty"`
	Profile     *ProfileUse       `json:"profile,omitempty"`
	Snapshot    string            `json:"snapshot,omitempty"`
}

func containerLabels(info Info, addr string) (map[string]string, error) {
	raw, err := json.Marshal(storedInfo{
		Kind: info.Kind, Runtime: info.Runtime, IdleTimeout: info.IdleTimeout,
		Resources: info.Resources, Screen: info.Screen, Record: info.Record, Labels: info.Labels, Egress: info.Egress, Start: info.Start,
		Profile: info.Profile, Snapshot: info.Snapshot,
	})
	if err != nil {
		return nil, err
	}
	return map[string]string{
		labelSession: info.ID,
		labelTenant:  info.Tenant,
		labelExpires: info.ExpiresAt.UTC().Format(time.RFC3339Nano),
		labelCreated: info.CreatedAt.UTC().Format(time.RFC3339Nano),
		labelAddr:    addr,
		labelInfo:    string(raw),
	}, nil
}

func infoFromLabels(l map[string]string) (Info, error) {
	var si storedInfo
	if err := json.Unmarshal([]byte(l[labelInfo]), &si); err != nil {
		return Info{}, fmt.Errorf("label %s: %w", labelInfo, err)
	}
	exp, err := time.Parse(time.RFC3339Nano, l[labelExpires])
	if err != nil {
		return Info{}, fmt.Errorf("label %s: %w", labelExpires, err)
	}
	created, err := time.Parse(time.RFC3339Nano, l[labelCreated])
	if err != nil {
		return Info{}, fmt.Errorf("label %s: %w", labelCreated, err)
	}
	return Info{
		ID: l[labelSession], Tenant: l[labelTenant], Kind: si.Kind, Runtime: si.Runtime,
		CreatedAt: created, ExpiresAt: exp, IdleTimeout: si.IdleTimeout, Resources: si.Resources,
		Screen: si.Screen, Record: si.Record, Labels: si.Labels, Egress: si.Egress, Start: si.Start,
		Profile: si.Profile, Snapshot: si.Snapshot,
	}, nil
}

func revokedFromLabels(l map[string]string) map[string]time.Time {
	out := map[string]time.Time{}
	for k, v := range l {
		if len(k) > len(labelRevoked) && k[:len(labelRevoked)] == labelRevoked {
			if sec, err := strconv.ParseInt(v, 10, 64); err == nil {
				out[k[len(labelRevoked):]] = time.Unix(sec, 0)
			}
		}
	}
	return out
}

// withOOMScoreAdj raises the session's OOM score so that under memory
// pressure sessions go before the gateway. (Lowering it is refused on
// some hosts and makes runc fail.)
func withOOMScoreAdj(score int) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		s.Process.OOMScoreAdj = &score
		return nil
	}
}

// withRlimit sets one resource limit, soft and hard, for every process.
func withRlimit(kind string, n uint64) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		for i, r := range s.Process.Rlimits {
			if r.Type == kind {
				s.Process.Rlimits[i].Soft, s.Process.Rlimits[i].Hard = n, n
				return nil
			}
		}
		s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: kind, Soft: n, Hard: n})
		return nil
	}
}

// sessionEnv is the environment of every session process: what the
// session shows, and the egress proxy as the way out for Chromium and
// command-line tools.
func (m *Manager) sessionEnv(info Info) []string {
	proxy := "http://" + m.ProxyAddr().String()
	env := []string{
		"SANDGATE_KIND=" + string(info.Kind),
		"SANDGATE_SCREEN_WIDTH=" + strconv.Itoa(info.Screen.Width),
		"SANDGATE_SCREEN_HEIGHT=" + strconv.Itoa(info.Screen.Height),
		"SANDGATE_CDP_PORT=" + strconv.Itoa(CDPPort),
		"SANDGATE_VNC_PORT=" + strconv.Itoa(VNCPort),
		"SANDGATE_PROXY=" + proxy,
		"http_proxy=" + proxy, "https_proxy=" + proxy, "HTTP_PROXY=" + proxy, "HTTPS_PROXY=" + proxy,
		"no_proxy=localhost,127.0.0.1", "NO_PROXY=localhost,127.0.0.1",
	}
	if info.Profile != nil {
		// The browser waits for its profile: it starts once, on it,
		// rather than on a fresh one first.
		env = append(env, "SANDGATE_BROWSER_HOLD=1")
	}
	if m.cfg.Env != nil {
		env = append(env, m.cfg.Env(info)...)
	}
	return env
}

// newContainer creates the session's container (not its task).
func (m *Manager) newContainer(ctx context.Context, info Info, rt *Runtime, addr string, workspace string, extraLabels map[string]string) (containerd.Container, error) {
	image, err := m.client.GetImage(ctx, m.cfg.Image)
	if err != nil {
		return nil, fmt.Errorf("session image %s: %w", m.cfg.Image, err)
	}
	labels, err := containerLabels(info, addr)
	if err != nil {
		return nil, err
	}
	for k, v := range extraLabels {
		labels[k] = v
	}
	res := info.Resources
	period := uint64(100000)
	quota := int64(res.CPUs * float64(period))
	specOpts := []oci.SpecOpts{
		oci.WithImageConfig(image),
		oci.WithHostname("sandgate"),
		oci.WithUIDGID(sessionUID, sessionGID),
		oci.WithEnv(m.sessionEnv(info)),
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: m.net.nsPath(info.ID)}),
		oci.WithCapabilities(nil),
		oci.WithAmbientCapabilities(nil),
		oci.WithNoNewPrivileges,
		seccomp.WithDefaultProfile(),
		withSessionSeccomp(rt.Name),
		oci.WithMemoryLimit(uint64(res.MemoryMB) << 20),
		oci.WithCPUCFS(quota, period),
		oci.WithPidsLimit(int64(res.Pids)),
		withOOMScoreAdj(500),
		withRlimit("RLIMIT_NOFILE", 4096),
		// The image is read-only; what a session writes goes to bounded
		// tmpfs (charged to the session's memory) or its workspace.
		oci.WithRootFSReadonly(),
		oci.WithMounts([]specs.Mount{
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", "size=1g"}},
			{Destination: "/home/sandgate", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=0755", "uid=1000", "gid=1000", "size=256m"}},
			{Destination: "/home/sandgate/workspace", Type: "bind", Source: workspace, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
		}),
	}
	return m.client.NewContainer(ctx, info.ID,
		containerd.WithImage(image),
		containerd.WithSnapshotter(m.cfg.Snapshotter),
		containerd.WithNewSnapshot(info.ID, image),
		containerd.WithRuntime(rt.shim, rt.options),
		containerd.WithContainerLabels(labels),
		containerd.WithNewSpec(specOpts...),
	)
}

// removeContainer kills the task and deletes the container and its
// snapshot; anything already gone counts as done.
func removeContainer(ctx context.Context, c containerd.Container) error {
	spec, _ := c.Spec(ctx) // for its cgroups, after the delete
	if t, err := c.Task(ctx, nil); err == nil {
		// A frozen task (a warm pool's) takes no signal until thawed.
		if st, err := t.Status(ctx); err == nil && (st.Status == containerd.Paused || st.Status == containerd.Pausing) {
			t.Resume(ctx)
		}
		if _, err := t.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			// A gVisor sandbox whose control server died (after an OOM
			// kill, say) cannot be signalled through runsc any more: kill
			// its process from the host, then delete what is left.
			if pid := t.Pid(); pid > 0 {
				if exited, werr := t.Wait(ctx); werr == nil {
					unix.Kill(int(pid), unix.SIGKILL)
					select {
					case <-exited:
					case <-time.After(10 * time.Second):
					}
				}
			}
			if _, err2 := t.Delete(ctx); err2 != nil && !errdefs.IsNotFound(err2) {
				return fmt.Errorf("delete task: %w (and after killing its process: %v)", err, err2)
			}
		}
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("task: %w", err)
	}
	if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete container: %w", err)
	}
	if ns, ok := namespaces.Namespace(ctx); ok && spec != nil && spec.Linux != nil {
		if err := removeCgroups(ns, spec.Linux.CgroupsPath); err != nil {
			return fmt.Errorf("remove cgroups: %w", err)
		}
	}
	return nil
}

func (m *Manager) workspaceDir(id string) string {
	return filepath.Join(m.cfg.StateDir, "sessions", id)
}

// DownloadDir is where Chromium saves downloads inside a session, in its
// workspace, which the gateway reads from the host side.
const (
	downloadsDir = ".downloads"
	DownloadDir  = "/home/sandgate/workspace/" + downloadsDir
)

// OpenDownload opens a finished download of a session from the host side.
// The workspace belongs to the session, so the file is opened beneath it
// with no symlink followed: a session cannot point the gateway at a host
// file.
func (m *Manager) OpenDownload(tenant, id, guid string) (*os.File, error) {
	if _, err := m.lookup(tenant, id); err != nil {
		return nil, err
	}
	if guid == "" || strings.ContainsAny(guid, "/\\") || guid == "." || guid == ".." {
		return nil, publicf(ErrInvalid, "bad download id", nil)
	}
	root, err := os.Open(filepath.Join(m.workspaceDir(id), "workspace"))
	if err != nil {
		return nil, err
	}
	defer root.Close()
	fd, err := unix.Openat2(int(root.Fd()), downloadsDir+"/"+guid, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return nil, fmt.Errorf("open download: %w", err)
	}
	f := os.NewFile(uintptr(fd), guid)
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, errors.New("download is not a regular file")
	}
	return f, nil
}

// workspaceBytes bounds what a session can write to its workspace.
const workspaceBytes = 1 << 30

// makeWorkspace creates the session's directory: the workspace mounted
// into the session, a tmpfs of bounded size (its pages are charged to the
// session's memory), and the console log, which stays on the host.
func (m *Manager) makeWorkspace(id string) (workspace string, console string, err error) {
	dir := m.workspaceDir(id)
	workspace = filepath.Join(dir, "workspace")
	if err := os.MkdirAll(workspace, 0o700); err != nil {
		return "", "", err
	}
	opts := fmt.Sprintf("size=%d,mode=0755,uid=%d,gid=%d", workspaceBytes, sessionUID, sessionGID)
	if err := unix.Mount("tmpfs", workspace, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return "", "", fmt.Errorf("mount workspace: %w", err)
	}
	dl := filepath.Join(workspace, downloadsDir)
	if err := os.Mkdir(dl, 0o755); err != nil {
		return "", "", err
	}
	if err := os.Chown(dl, sessionUID, sessionGID); err != nil {
		return "", "", err
	}
	return workspace, filepath.Join(dir, "console.log"), nil
}

// removeWorkspace unmounts and deletes the session's directory.
func (m *Manager) removeWorkspace(id string) error {
	dir := m.workspaceDir(id)
	if err := unix.Unmount(filepath.Join(dir, "workspace"), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount workspace: %w", err)
	}
	return os.RemoveAll(dir)
}

func newTask(ctx context.Context, c containerd.Container, console string) (containerd.Task, error) {
	return c.NewTask(ctx, cio.LogFile(console))
}
