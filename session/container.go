package session

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

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
	// labelState is the session's state as the manager last stored it
	// (markState): running once it runs, stopping once its stop began.
	labelState = "sandgate.state"
)

// RecordAddr is the key of the sandbox's address in a session's record.
// A backend that gives sandboxes their own network fills it in when the
// record is read (Sandbox.Record), once it knows the address.
const RecordAddr = labelAddr

// RecordTenant and RecordExpires are the keys of the session's tenant
// and expiry (RFC 3339) in its record, for a backend that mirrors them
// where its own tools see them (a Pod's labels): a claim and an
// extension change them.
const (
	RecordTenant  = labelTenant
	RecordExpires = labelExpires
)

// RecordSeen is a session's record as one who holds no session reads
// it (a gateway replica standing by, from the session's Pod), and
// whether its sandbox runs.
type RecordSeen struct {
	Record  map[string]string
	Running bool
}

// RecordPool is the key of a pooled session's pool in its record (its
// pool's key), cleared when it is claimed.
const RecordPool = labelPool

// RecordState is the key of the session's state in its record
// (markState), and RecordStopAsked that of the time (RFC 3339) a
// replica that stood by while no leader answered stopped the session
// by its record: running to stopping, the next leader finishing the
// stop as it adopts it (adopt).
const (
	RecordState     = labelState
	RecordStopAsked = "sandgate.stop_asked"
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
		labelState:   string(StateStarting),
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

// FromRecord is the session a sandbox's record holds, as the manager
// adopts it, and where it serves: for a replica that reads a session
// from its sandbox (a Pod) without the manager. A warm pool's sandbox
// not claimed yet holds no session (ErrNotFound). Its State is the one
// the manager stored (markState): starting until it ran (the mark is
// written just after: briefly, a running session may read starting),
// and stopping once its stop began (a sandbox may still run then: a
// profile is being saved).
func FromRecord(r map[string]string) (Info, Endpoint, error) {
	info, err := InfoFromRecord(r)
	if err != nil {
		return Info{}, Endpoint{}, err
	}
	addr, err := netip.ParseAddr(r[labelAddr])
	if err != nil {
		return Info{}, Endpoint{}, fmt.Errorf("the record has no address: %w", err)
	}
	return info, endpointOf(addr), nil
}

// InfoFromRecord is FromRecord's session alone, for a sandbox that may
// have no address yet (one starting).
func InfoFromRecord(r map[string]string) (Info, error) {
	if r[labelPool] != "" || r[labelSession] == "" || r[labelTenant] == "" {
		return Info{}, publicf(ErrNotFound, "no such session", nil)
	}
	info, err := infoFromLabels(r)
	if err != nil {
		return Info{}, err
	}
	switch st := State(r[labelState]); st {
	case StateStarting, StateRunning, StateStopping:
		info.State = st
	case "":
		// A session of a gateway before the state was stored: taken
		// as running, as before.
		info.State = StateRunning
	default:
		return Info{}, fmt.Errorf("the record's state %q is none", st)
	}
	if info.Labels == nil {
		info.Labels = map[string]string{} // as the manager shows it
	}
	return info, nil
}

// sharedRecords: other gateway replicas read the sessions' records (a
// backend with its own network: Kubernetes, where a replica standing by
// admits by a session's Pod while no leader answers), so the manager
// stores its state there (markState).
func (m *Manager) sharedRecords() bool { return m.net == nil }

// markState stores the session's state in its record, for a replica
// that reads the session from its sandbox without the manager
// (FromRecord): running once it runs, stopping once its stop begins.
// One session's writes are made in order, and none of running once a
// stop began, whatever came of its write.
func (m *Manager) markState(ctx context.Context, s *sess, sb Sandbox, st State) error {
	if !m.sharedRecords() || sb == nil {
		return nil
	}
	s.markMu.Lock()
	defer s.markMu.Unlock()
	if st == StateStopping {
		s.stopMarked = true
	} else if s.stopMarked {
		return nil
	}
	if s.marked == st {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// A stop's mark clears the stop asked by another replica: it is
	// recorded (recordChanged, adopt), and this stop carries it out.
	change := map[string]string{labelState: string(st), RecordStopAsked: ""}
	var err error
	if u, ok := sb.(RecordUpdater); ok && st == StateRunning {
		// Never over a stop another replica stored (a delete while no
		// leader answered this one): that stop is carried out instead.
		var asked map[string]string
		_, err = u.UpdateRecord(ctx, func(rec map[string]string) (map[string]string, error) {
			asked = nil
			if State(rec[labelState]) == StateStopping {
				asked = rec
				return nil, nil
			}
			return map[string]string{labelState: string(st)}, nil
		})
		if err == nil && asked != nil {
			// (Not marked: the stop's own mark clears the stop asked.)
			m.recordChanged(asked)
			return nil
		}
	} else {
		_, err = sb.SetRecord(ctx, change)
	}
	if err != nil && !errors.Is(err, ErrSandboxGone) {
		return err
	}
	s.marked = st
	return nil
}

// markRunning is markState running, apart from the caller (a create
// does not wait for it), tried again a few times.
func (m *Manager) markRunning(s *sess, sb Sandbox) {
	if !m.sharedRecords() {
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for wait := time.Second; ; wait *= 2 {
			err := m.markState(m.base, s, sb, StateRunning)
			if err == nil {
				return
			}
			if wait > 8*time.Second {
				m.log.Warn("the session's state could not be stored with its sandbox: a replica standing by refuses it while no leader answers", "session", s.info.ID, "err", err)
				return
			}
			select {
			case <-m.base.Done():
				return
			case <-time.After(wait):
			}
		}
	}()
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

// sessionEnv is the environment of every session process: what the
// session shows, and the egress proxy as the way out for Chromium and
// command-line tools.
func (m *Manager) sessionEnv(info Info) []string {
	// Under a backend with its own network, the proxy the gateway serves
	// there, if it does; the cluster's NetworkPolicy keeps the session to it.
	proxy := m.cfg.ProxyURL
	if pa := m.ProxyAddr(); pa.IsValid() {
		proxy = "http://" + pa.String()
	}
	return sandboxEnv(info, proxy, m.cfg.Env)
}

// sandboxEnv is sessionEnv with the egress proxy's URL ("": none) and
// the config's own additions (nil: none).
func sandboxEnv(info Info, proxy string, extra func(Info) []string) []string {
	env := []string{
		"SANDGATE_KIND=" + string(info.Kind),
		"SANDGATE_SCREEN_WIDTH=" + strconv.Itoa(info.Screen.Width),
		"SANDGATE_SCREEN_HEIGHT=" + strconv.Itoa(info.Screen.Height),
		"SANDGATE_CDP_PORT=" + strconv.Itoa(CDPPort),
		"SANDGATE_VNC_PORT=" + strconv.Itoa(VNCPort),
	}
	if proxy != "" {
		env = append(env, "SANDGATE_PROXY="+proxy,
			"http_proxy="+proxy, "https_proxy="+proxy, "HTTP_PROXY="+proxy, "HTTPS_PROXY="+proxy,
			"no_proxy=localhost,127.0.0.1", "NO_PROXY=localhost,127.0.0.1")
	}
	if info.Profile != nil {
		// The browser waits for its profile: it starts once, on it,
		// rather than on a fresh one first.
		env = append(env, "SANDGATE_BROWSER_HOLD=1")
	}
	if extra != nil {
		env = append(env, extra(info)...)
	}
	return env
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

// OpenDownload opens a copy of a finished download of a session, made
// now: at most limit+1 bytes of the file, in an unlinked file of the
// gateway's, which the session cannot change. The workspace belongs to
// the session, so the file is opened from the host side beneath it with
// no symlink followed: a session cannot point the gateway at a host
// file. Under a backend with its own network there is no workspace on
// this host: the file is read inside the session (see spoolInside). The
// caller bounds what it reads either way.
func (m *Manager) OpenDownload(tenant, id, guid string, limit int64) (*os.File, error) {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return nil, err
	}
	if guid == "" || strings.ContainsAny(guid, "/\\") || guid == "." || guid == ".." {
		return nil, publicf(ErrInvalid, "bad download id", nil)
	}
	if m.net == nil {
		return m.spoolInside(s, DownloadDir+"/"+guid, limit)
	}
	f, err := m.openBeneath(id, downloadsDir+"/"+guid, unix.O_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("open download: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, errors.New("download is not a regular file")
	}
	// Copied at once into a file of the gateway's own, as spoolInside
	// does: the session may change its file while it is stored (between
	// the store's hash and its upload), and what is stored must be what
	// was hashed.
	tmp, err := m.newSpool()
	if err != nil {
		return nil, err
	}
	if _, err := io.CopyN(tmp, f, limit+1); err != nil && !errors.Is(err, io.EOF) {
		tmp.Close()
		return nil, fmt.Errorf("copy download: %w", err)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		tmp.Close()
		return nil, err
	}
	return tmp, nil
}

// openBeneath opens rel (read only, with flags) beneath the session's
// workspace from the host side: the workspace is the session's, so no
// symlink is followed and nothing outside it is reached.
func (m *Manager) openBeneath(id, rel string, flags int) (*os.File, error) {
	root, err := os.Open(filepath.Join(m.workspaceDir(id), "workspace"))
	if err != nil {
		return nil, err
	}
	defer root.Close()
	fd, err := unix.Openat2(int(root.Fd()), rel, &unix.OpenHow{
		Flags:   uint64(unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | flags),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// newSpool is an unlinked file in the state directory, for a copy out
// of a session that the session cannot change.
func (m *Manager) newSpool() (*os.File, error) {
	f, err := os.CreateTemp(m.cfg.StateDir, "spool-")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name())
	return f, nil
}

// boxToRead is the sandbox of a session that can be read from inside:
// running, or being torn down (what finished before the stop is read
// then).
func (m *Manager) boxToRead(s *sess) (Sandbox, error) {
	m.mu.Lock()
	sb, state := s.box, s.info.State
	m.mu.Unlock()
	if sb == nil || (state != StateRunning && state != StateStopping) {
		return nil, publicf(ErrConflict, "the session is "+string(state), nil)
	}
	return sb, nil
}

// MaxDownloadNames bounds how many names ListDownloads returns; a
// directory with more (the session's doing) is read only that far.
const MaxDownloadNames = 4096

// ListDownloads names what is in a session's download directory: at most
// MaxDownloadNames names, none longer than maxListedName, in no order;
// none when there is no directory. The directory is the session's: it is
// opened beneath the workspace with no symlink followed, or, under a
// backend with its own network, listed inside the session as its user,
// with the output bounded.
func (m *Manager) ListDownloads(ctx context.Context, tenant, id string) ([]string, error) {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return nil, err
	}
	if m.net == nil {
		return m.listInside(ctx, s, DownloadDir)
	}
	dir, err := m.openBeneath(id, downloadsDir, unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the download directory: %w", err)
	}
	defer dir.Close()
	names, err := dir.Readdirnames(MaxDownloadNames)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read the download directory: %w", err)
	}
	return shortNames(names), nil
}

// maxListedName bounds a listed name: a download's GUID and the suffix
// of one being written are far shorter.
const maxListedName = 128

func shortNames(names []string) []string {
	out := names[:0]
	for _, n := range names {
		if len(n) <= maxListedName && n != "." && n != ".." {
			out = append(out, n)
		}
	}
	return out
}

// listInside lists a directory inside the session as its user, reading
// at most MaxDownloadNames lines of at most maxListedName bytes each;
// a longer listing is cut there.
func (m *Manager) listInside(ctx context.Context, s *sess, path string) ([]string, error) {
	sb, err := m.boxToRead(s)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	stop := context.AfterFunc(m.base, cancel) // the manager's end too
	defer stop()
	var out bytes.Buffer
	w := &cappedWriter{w: &out, left: MaxDownloadNames * (maxListedName + 1), cancel: cancel}
	stderr := &limitedBuffer{max: 1024}
	// Unsorted (-f): the session's directory may be large, and only
	// what is read up to the cap is used.
	p, err := m.startIn(ctx, sb, s.info.ID, ExecSpec{Args: []string{"sh", "-c", `[ -d "$1" ] && [ ! -L "$1" ] || exit 0; exec ls -1fq -- "$1"`, "sandgate", path},
		Stdout: w, Stderr: stderr})
	if err != nil {
		return nil, err
	}
	code, err := p.Wait(ctx)
	p.Close()
	w.stop()
	switch {
	case w.full:
		// Cut at the cap: the last line may be cut too.
		if i := bytes.LastIndexByte(out.Bytes(), '\n'); i >= 0 {
			out.Truncate(i + 1)
		} else {
			out.Reset()
		}
	case err != nil:
		return nil, fmt.Errorf("listing %s in the session: %w", path, err)
	case code != 0:
		return nil, fmt.Errorf("listing %s in the session: exit %d: %s", path, code, bytes.TrimSpace(stderr.Bytes()))
	}
	if w.err != nil {
		return nil, w.err
	}
	names := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(names) == 1 && names[0] == "" {
		return nil, nil
	}
	if len(names) > MaxDownloadNames {
		names = names[:MaxDownloadNames]
	}
	return shortNames(names), nil
}

// listTimeout bounds a listing inside a session.
const listTimeout = 30 * time.Second

// spoolInside copies a regular file out of a session through exec, as
// the session's user (what it reads is the session's own, which it could
// write anyway), into an unlinked file in the state directory, and
// returns that file at its start. It copies at most limit+1 bytes, so
// that a caller bounding at limit sees the file is too large, and gives
// up after spoolTimeout. It works while the session is being torn down
// too: the downloads that finished before the stop are read then.
func (m *Manager) spoolInside(s *sess, path string, limit int64) (*os.File, error) {
	sb, err := m.boxToRead(s)
	if err != nil {
		return nil, err
	}
	f, err := m.newSpool()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(m.base, spoolTimeout)
	defer cancel()
	w := &cappedWriter{w: f, left: limit + 1, cancel: cancel}
	stderr := &limitedBuffer{max: 1024}
	// Not a FIFO or a device, which would hold the copy open: a
	// regular file, no symlink, as the host side opens it.
	p, err := m.startIn(ctx, sb, s.info.ID, ExecSpec{Args: []string{"sh", "-c", `[ -f "$1" ] && [ ! -L "$1" ] || exit 66; exec cat -- "$1"`, "sandgate", path},
		Stdout: w, Stderr: stderr})
	if err != nil {
		f.Close()
		return nil, err
	}
	code, err := p.Wait(ctx)
	p.Close()
	w.stop() // nothing the exec still copies reaches f after this
	switch {
	case w.full:
		// Cut at the cap: what was read is what the caller refuses.
	case err != nil:
		f.Close()
		return nil, fmt.Errorf("reading %s in the session: %w", path, err)
	case code == 66:
		f.Close()
		return nil, errors.New("download is not a regular file")
	case code != 0:
		f.Close()
		return nil, fmt.Errorf("reading %s in the session: exit %d: %s", path, code, bytes.TrimSpace(stderr.Bytes()))
	}
	if w.err != nil {
		f.Close()
		return nil, w.err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// spoolTimeout bounds a copy out of a session.
const spoolTimeout = 5 * time.Minute

// cappedWriter writes at most left bytes, then stops the copy.
type cappedWriter struct {
	mu      sync.Mutex
	w       io.Writer
	left    int64
	full    bool
	stopped bool
	err     error
	cancel  context.CancelFunc
}

// stop drops what is written from now on (a backend's copy can outlive
// the command's end by a little).
func (c *cappedWriter) stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
}

func (c *cappedWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.full || c.err != nil || c.stopped {
		return len(p), nil
	}
	if int64(len(p)) >= c.left {
		p, c.full = p[:c.left], true
		defer c.cancel()
	}
	n, err := c.w.Write(p)
	c.left -= int64(n)
	if err != nil {
		c.err = err
	}
	return len(p), nil
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

// removeHostParts removes what the manager made on this host for a
// session's sandbox: its network namespace (releasing its address) and
// its workspace. Nothing when the backend brings its own network.
func (m *Manager) removeHostParts(ctx context.Context, id string) error {
	if m.net == nil {
		return nil
	}
	return errors.Join(m.net.remove(ctx, id), m.removeWorkspace(id))
}

// removeWorkspace unmounts and deletes the session's directory.
func (m *Manager) removeWorkspace(id string) error {
	dir := m.workspaceDir(id)
	if err := unix.Unmount(filepath.Join(dir, "workspace"), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount workspace: %w", err)
	}
	return os.RemoveAll(dir)
}
