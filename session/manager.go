package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
)

// Config is what the manager needs; cmd/sandgate fills it from the
// gateway's config file.
type Config struct {
	Namespace      string
	Image          string // session image reference
	Snapshotter    string
	StateDir       string
	Network        NetworkConfig
	Runtimes       RuntimeConfig
	DefaultRuntime string // empty: strongest usable (kata, then gvisor)
	Tenants        map[string]TenantLimits
	ReadyTimeout   time.Duration
	// ProxyPort is where the egress proxy listens on the bridge's
	// address (default 3128); the kernel rules let sessions reach only it.
	ProxyPort uint16
	// Env adds environment variables to a new session (the egress CA's
	// key hashes, say). Nothing secret may go there: it is the sandbox's.
	Env func(Info) []string
}

// TenantLimits bound what one tenant may ask for.
type TenantLimits struct {
	MaxSessions int
	DefaultTTL  time.Duration
	MaxTTL      time.Duration
	MaxIdle     time.Duration
	// AllowRoot lets the tenant run commands as root in its sessions.
	AllowRoot bool
	// MaxFileBytes bounds one file upload.
	MaxFileBytes int64
	// EgressAllow is added to every session's egress allow list.
	EgressAllow []string
}

// Manager runs sessions. It is safe for concurrent use.
type Manager struct {
	client   *containerd.Client
	cfg      Config
	log      *slog.Logger
	net      *network
	runtimes map[string]*Runtime
	// base outlives requests: task waits and background creates use it.
	base   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	sessions map[string]*sess
	observer Observer
}

type sess struct {
	info       Info
	addr       netip.Addr // on the bridge, once the network exists
	ep         Endpoint
	container  containerd.Container
	lastActive time.Time
	conns      map[*tracked]struct{}
	revoked    map[string]time.Time
	cancel     context.CancelFunc // cancels a create in progress
	done       chan struct{}      // closed when the session has stopped or failed
	events     []Event
	dropped    int
	misses     int // health probes in a row that found the display gone
	trail      *os.File
}

type tracked struct {
	preview string
	c       io.Closer
}

// New connects the manager to containerd, probes the runtime handlers,
// rebuilds sessions that survived a gateway restart and removes what
// nobody owns.
func New(ctx context.Context, client *containerd.Client, cfg Config, log *slog.Logger) (*Manager, error) {
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 60 * time.Second
	}
	if cfg.Network.IPAMDir == "" {
		cfg.Network.IPAMDir = filepath.Join(cfg.StateDir, "ipam")
	}
	if cfg.ProxyPort == 0 {
		cfg.ProxyPort = 3128
	}
	n, err := newNetwork(cfg.Network, cfg.Namespace+"-")
	if err != nil {
		return nil, err
	}
	fw := newFirewall(cfg.Namespace, cfg.Network.Bridge, netip.AddrPortFrom(n.gateway, cfg.ProxyPort))
	if err := fw.install(); err != nil {
		return nil, err
	}
	base, cancel := context.WithCancel(namespaces.WithNamespace(context.WithoutCancel(ctx), cfg.Namespace))
	m := &Manager{client: client, cfg: cfg, log: log, net: n, base: base, cancel: cancel, sessions: map[string]*sess{}}
	m.runtimes = probeRuntimes(ctx, cfg.Runtimes)
	if cfg.DefaultRuntime != "" {
		if rt := m.runtimes[cfg.DefaultRuntime]; rt == nil || !rt.Usable {
			cancel()
			return nil, fmt.Errorf("default runtime %q is not usable here", cfg.DefaultRuntime)
		}
	} else {
		for _, name := range runtimeOrder[:2] {
			if m.runtimes[name].Usable {
				m.cfg.DefaultRuntime = name
				break
			}
		}
	}
	for _, name := range runtimeOrder {
		rt := m.runtimes[name]
		if rt.Usable {
			log.Info("runtime usable", "runtime", name, "isolation", rt.Isolation, "version", rt.Version)
		} else {
			log.Info("runtime not usable", "runtime", name, "reason", rt.Reason)
		}
	}
	if m.runtimes["runc"].Usable {
		log.Warn("runc is not an isolation boundary: sessions under runc share the host kernel; use it for development only")
	}
	if m.cfg.DefaultRuntime == "" {
		log.Warn("no isolating runtime (kata, gvisor) is usable and none is configured as default; create requests must name a runtime")
	}
	if err := m.recover(m.base); err != nil {
		cancel()
		return nil, fmt.Errorf("recover sessions: %w", err)
	}
	m.wg.Add(1)
	go m.reap()
	return m, nil
}

// Runtimes lists the handlers, strongest first.
func (m *Manager) Runtimes() []Runtime {
	out := make([]Runtime, 0, len(runtimeOrder))
	for _, name := range runtimeOrder {
		out = append(out, *m.runtimes[name])
	}
	return out
}

// Ready tells whether containerd answers.
func (m *Manager) Ready(ctx context.Context) error {
	if _, err := m.client.Version(ctx); err != nil {
		return publicf(ErrUnavailable, "containerd is not answering", err)
	}
	return nil
}

// ProxyAddr is where sessions reach the egress proxy: the bridge's own
// address. The proxy must listen there.
func (m *Manager) ProxyAddr() netip.AddrPort {
	return netip.AddrPortFrom(m.net.gateway, m.cfg.ProxyPort)
}

// BySource finds the live session holding a bridge address, for the
// egress proxy.
func (m *Manager) BySource(a netip.Addr) (Info, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.sessions {
		if s.addr == a && (s.info.State == StateStarting || s.info.State == StateRunning) {
			return copyInfo(s.info), true
		}
	}
	return Info{}, false
}

// DefaultRuntime is the runtime a session gets when it names none.
func (m *Manager) DefaultRuntime() string { return m.cfg.DefaultRuntime }

// Limits returns the tenant's limits.
func (m *Manager) Limits(tenant string) (TenantLimits, bool) {
	l, ok := m.cfg.Tenants[tenant]
	return l, ok
}

// Close stops the reaper and background work; sessions keep running in
// containerd, for the next gateway to adopt.
func (m *Manager) Close() {
	m.cancel()
	m.wg.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.sessions {
		closeConns(s, "")
	}
}

func newID() string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return "s-" + hex.EncodeToString(b)
}

// normalize checks a spec against the tenant's limits and fills defaults.
func (m *Manager) normalize(spec *Spec) (*Runtime, error) {
	lim, ok := m.cfg.Tenants[spec.Tenant]
	if !ok {
		return nil, publicf(ErrNotFound, "unknown tenant", nil)
	}
	switch spec.Kind {
	case "":
		spec.Kind = KindBrowser
	case KindBrowser, KindDesktop:
	default:
		return nil, publicf(ErrInvalid, fmt.Sprintf("kind %q is not one of browser, desktop", spec.Kind), nil)
	}
	if spec.Runtime == "" {
		spec.Runtime = m.cfg.DefaultRuntime
		if spec.Runtime == "" {
			return nil, publicf(ErrUnavailableRuntime, "no isolating runtime is usable on this gateway; name a runtime explicitly", nil)
		}
	}
	rt, ok := m.runtimes[spec.Runtime]
	if !ok {
		return nil, publicf(ErrInvalid, fmt.Sprintf("runtime %q is not one of kata, gvisor, runc", spec.Runtime), nil)
	}
	if !rt.Usable {
		return nil, publicf(ErrUnavailableRuntime, fmt.Sprintf("runtime %q is not usable on this gateway: %s", rt.Name, rt.Reason), nil)
	}
	if spec.TTL == 0 {
		spec.TTL = lim.DefaultTTL
	}
	if spec.TTL < time.Second || spec.TTL > lim.MaxTTL {
		return nil, publicf(ErrInvalid, fmt.Sprintf("ttl_seconds must be between 1 and %d", int(lim.MaxTTL.Seconds())), nil)
	}
	if spec.IdleTimeout < 0 || (lim.MaxIdle > 0 && spec.IdleTimeout > lim.MaxIdle) {
		return nil, publicf(ErrInvalid, fmt.Sprintf("idle_timeout_seconds must be between 0 and %d", int(lim.MaxIdle.Seconds())), nil)
	}
	r := &spec.Resources
	if r.CPUs == 0 {
		r.CPUs = 1
	}
	if r.MemoryMB == 0 {
		r.MemoryMB = 2048
	}
	if r.Pids == 0 {
		r.Pids = 1024
	}
	if r.CPUs < 0.25 || r.CPUs > 8 {
		return nil, publicf(ErrInvalid, "resources.cpus must be between 0.25 and 8", nil)
	}
	if r.MemoryMB < 512 || r.MemoryMB > 16384 {
		return nil, publicf(ErrInvalid, "resources.memory_mb must be between 512 and 16384", nil)
	}
	if r.Pids < 128 || r.Pids > 8192 {
		return nil, publicf(ErrInvalid, "resources.pids must be between 128 and 8192", nil)
	}
	sc := &spec.Screen
	if sc.Width == 0 && sc.Height == 0 {
		sc.Width, sc.Height = 1280, 800
	}
	if sc.Width < 320 || sc.Width > 3840 || sc.Height < 240 || sc.Height > 2160 {
		return nil, publicf(ErrInvalid, "screen must be between 320x240 and 3840x2160", nil)
	}
	if len(spec.Labels) > 32 {
		return nil, publicf(ErrInvalid, "at most 32 labels", nil)
	}
	for k, v := range spec.Labels {
		if k == "" || len(k) > 63 || len(v) > 256 {
			return nil, publicf(ErrInvalid, "label keys must be 1-63 bytes and values at most 256 bytes", nil)
		}
	}
	return rt, nil
}

// Create starts a session. With wait, it returns once the session is
// running (or has failed, with the error); without, it returns the
// starting session and the start goes on in the background.
func (m *Manager) Create(ctx context.Context, spec Spec, wait bool) (Info, error) {
	rt, err := m.normalize(&spec)
	if err != nil {
		return Info{}, err
	}
	now := time.Now().UTC()
	info := Info{
		ID: newID(), Tenant: spec.Tenant, Kind: spec.Kind, Runtime: rt.Name, Isolation: rt.Isolation,
		State: StateStarting, CreatedAt: now, ExpiresAt: now.Add(spec.TTL),
		IdleTimeout: int(spec.IdleTimeout.Seconds()), Resources: spec.Resources, Screen: spec.Screen,
		Record: spec.Record, Labels: spec.Labels, Egress: spec.Egress,
	}
	if info.Labels == nil {
		info.Labels = map[string]string{}
	}
	// The start belongs to the manager; a waiting caller that hangs up
	// cancels it (the create rolls back).
	startCtx, cancel := context.WithTimeout(m.base, m.cfg.ReadyTimeout+30*time.Second)
	s := &sess{info: info, lastActive: now, conns: map[*tracked]struct{}{}, revoked: map[string]time.Time{}, cancel: cancel, done: make(chan struct{})}

	m.mu.Lock()
	active := 0
	for _, o := range m.sessions {
		if o.info.Tenant == spec.Tenant && (o.info.State == StateStarting || o.info.State == StateRunning) {
			active++
		}
	}
	if lim := m.cfg.Tenants[spec.Tenant]; lim.MaxSessions > 0 && active >= lim.MaxSessions {
		m.mu.Unlock()
		cancel()
		return Info{}, publicf(ErrQuota, fmt.Sprintf("the tenant already has %d active sessions, its maximum", active), nil)
	}
	m.sessions[info.ID] = s
	s.trail, _ = m.openTrail(info.Tenant, info.ID)
	s.record("created", map[string]any{"kind": info.Kind, "runtime": info.Runtime, "record": info.Record})
	m.mu.Unlock()

	log := m.log.With("session", info.ID, "tenant", info.Tenant, "runtime", rt.Name)
	if !wait {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			defer cancel()
			if err := m.start(startCtx, s, rt, log); err != nil {
				log.Error("session start failed", "err", err)
			}
		}()
		return m.snapshot(s), nil
	}
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	defer cancel()
	if err := m.start(startCtx, s, rt, log); err != nil {
		log.Error("session start failed", "err", err)
		if ctx.Err() != nil {
			return Info{}, fmt.Errorf("client went away: %w", ctx.Err())
		}
		return Info{}, publicf(ErrUnavailable, "the session could not be started: "+m.snapshot(s).Failure, err)
	}
	return m.snapshot(s), nil
}

// start does the work of Create. On any failure everything created so far
// is removed and the session is marked failed.
func (m *Manager) start(ctx context.Context, s *sess, rt *Runtime, log *slog.Logger) (err error) {
	id := s.info.ID
	t0 := time.Now()
	var undo []func(context.Context) error
	defer func() {
		if err == nil {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for i := len(undo) - 1; i >= 0; i-- {
			if uerr := undo[i](cctx); uerr != nil {
				log.Error("rollback step failed", "err", uerr)
			}
		}
		m.mu.Lock()
		s.info.State = StateFailed
		if s.info.Failure == "" {
			s.info.Failure = failureText(ctx, err)
		}
		s.record("failed", map[string]any{"failure": s.info.Failure})
		closeConns(s, "")
		m.mu.Unlock()
		m.ended(s)
		close(s.done)
	}()

	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Millisecond)) }
	addr, err := m.net.create(ctx, id)
	if err != nil {
		return err
	}
	mark("network")
	m.mu.Lock()
	s.addr = addr
	m.mu.Unlock()
	undo = append(undo, func(c context.Context) error { return m.net.remove(c, id) })
	undo = append(undo, func(context.Context) error { return m.removeWorkspace(id) })
	workspace, console, err := m.makeWorkspace(id)
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	m.mu.Lock()
	info := s.info
	m.mu.Unlock()
	c, err := m.newContainer(ctx, info, rt, addr.String(), workspace)
	if err != nil {
		return fmt.Errorf("create container: %w", err)
	}
	undo = append(undo, func(c2 context.Context) error { return removeContainer(c2, c) })
	mark("container")
	task, err := newTask(ctx, c, console)
	if err != nil {
		return fmt.Errorf("create task: %w", err)
	}
	exited, err := task.Wait(m.base)
	if err != nil {
		return fmt.Errorf("wait task: %w", err)
	}
	if err := task.Start(ctx); err != nil {
		return fmt.Errorf("start task: %w", err)
	}
	mark("started")
	ep := endpointOf(addr)
	if err := waitReady(ctx, ep, info.Kind == KindBrowser, exited, m.cfg.ReadyTimeout); err != nil {
		return err
	}
	mark("ready")
	m.mu.Lock()
	if s.info.State != StateStarting {
		m.mu.Unlock()
		return errors.New("session was stopped while starting")
	}
	s.info.State = StateRunning
	s.record("started", map[string]any{"took_ms": time.Since(t0).Milliseconds()})
	s.ep = ep
	s.container = c
	s.lastActive = time.Now()
	s.cancel = nil
	m.mu.Unlock()
	log.Info("session running", append([]any{"addr", addr.String()}, phases...)...)
	m.wg.Add(1)
	go m.watch(s, exited)
	m.mu.Lock()
	o, info := m.observer, copyInfo(s.info)
	m.mu.Unlock()
	if o != nil {
		o.SessionRunning(info, ep)
	}
	return nil
}

func failureText(ctx context.Context, err error) string {
	var pe *PublicError
	switch {
	case errors.As(err, &pe):
		return pe.Msg
	case ctx.Err() == context.DeadlineExceeded:
		return "the session did not become ready in time"
	case ctx.Err() != nil:
		return "the start was cancelled"
	default:
		return "the session's container failed to start"
	}
}

func endpointOf(a netip.Addr) Endpoint {
	return Endpoint{Addr: a, CDP: netip.AddrPortFrom(a, CDPPort), VNC: netip.AddrPortFrom(a, VNCPort)}
}

// waitReady polls until the VNC server accepts connections and, for
// browser sessions, Chromium answers CDP discovery.
func waitReady(ctx context.Context, ep Endpoint, needCDP bool, exited <-chan containerd.ExitStatus, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	cdpOK, vncOK := !needCDP, false
	for {
		if !vncOK {
			var d net.Dialer
			if c, err := d.DialContext(ctx, "tcp", ep.VNC.String()); err == nil {
				c.Close()
				vncOK = true
			}
		}
		if !cdpOK {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ep.CDP.String()+"/json/version", nil)
			if resp, err := client.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				cdpOK = resp.StatusCode == http.StatusOK
			}
		}
		if cdpOK && vncOK {
			return nil
		}
		select {
		case st := <-exited:
			return publicf(ErrUnavailable, fmt.Sprintf("the session exited while starting (status %d)", st.ExitCode()), nil)
		case <-ctx.Done():
			return fmt.Errorf("waiting for CDP and VNC: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// watch marks a session failed when its processes exit on their own.
func (m *Manager) watch(s *sess, exited <-chan containerd.ExitStatus) {
	defer m.wg.Done()
	select {
	case st := <-exited:
		m.mu.Lock()
		running := s.info.State == StateRunning
		m.mu.Unlock()
		if running {
			msg := fmt.Sprintf("the session's processes exited (status %d)", st.ExitCode())
			m.log.Warn("session exited", "session", s.info.ID, "status", st.ExitCode())
			m.stop(m.base, s, StateFailed, msg)
		}
	case <-s.done:
	case <-m.base.Done():
	}
}

func (m *Manager) snapshot(s *sess) Info {
	m.mu.Lock()
	defer m.mu.Unlock()
	return copyInfo(s.info)
}

func copyInfo(i Info) Info {
	l := make(map[string]string, len(i.Labels))
	for k, v := range i.Labels {
		l[k] = v
	}
	i.Labels = l
	return i
}

func (m *Manager) lookup(tenant, id string) (*sess, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok || s.info.Tenant != tenant {
		return nil, publicf(ErrNotFound, "no such session", nil)
	}
	return s, nil
}

// Get returns one of the tenant's sessions.
func (m *Manager) Get(tenant, id string) (Info, error) {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return Info{}, err
	}
	return m.snapshot(s), nil
}

// List returns the tenant's sessions, newest first.
func (m *Manager) List(tenant string) []Info {
	m.mu.Lock()
	out := []Info{}
	for _, s := range m.sessions {
		if s.info.Tenant == tenant {
			out = append(out, copyInfo(s.info))
		}
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out
}

// Extend sets the session's expiry to now+ttl, bounded by the tenant's
// maximum TTL counted from the session's creation.
func (m *Manager) Extend(ctx context.Context, tenant, id string, ttl time.Duration) (Info, error) {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return Info{}, err
	}
	lim := m.cfg.Tenants[tenant]
	if ttl < time.Second {
		return Info{}, publicf(ErrInvalid, "ttl_seconds must be at least 1", nil)
	}
	m.mu.Lock()
	if s.info.State != StateRunning {
		m.mu.Unlock()
		return Info{}, publicf(ErrConflict, "only a running session can be extended", nil)
	}
	exp := time.Now().UTC().Add(ttl)
	if max := s.info.CreatedAt.Add(lim.MaxTTL); exp.After(max) {
		m.mu.Unlock()
		return Info{}, publicf(ErrInvalid, fmt.Sprintf("the session may live until %s at most (the tenant's maximum TTL)", max.Format(time.RFC3339)), nil)
	}
	c := s.container
	m.mu.Unlock()
	if _, err := c.SetLabels(m.ctx(ctx), map[string]string{labelExpires: exp.Format(time.RFC3339Nano)}); err != nil {
		return Info{}, fmt.Errorf("store expiry: %w", err)
	}
	m.mu.Lock()
	s.info.ExpiresAt = exp
	info := copyInfo(s.info)
	m.mu.Unlock()
	return info, nil
}

// Delete stops a session and returns its final state. Deleting a stopped
// session returns it unchanged.
func (m *Manager) Delete(ctx context.Context, tenant, id string) (Info, error) {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return Info{}, err
	}
	m.mu.Lock()
	state, cancel := s.info.State, s.cancel
	m.mu.Unlock()
	if state == StateStarting && cancel != nil {
		cancel() // the start rolls back by itself
		select {
		case <-s.done:
		case <-ctx.Done():
			return Info{}, ctx.Err()
		}
		m.mu.Lock()
		s.info.State, s.info.Failure = StateStopped, ""
		m.mu.Unlock()
		return m.snapshot(s), nil
	}
	m.stop(m.ctx(ctx), s, StateStopped, "")
	return m.snapshot(s), nil
}

func (m *Manager) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, m.cfg.Namespace)
}

// stop tears a session down: live connections, task, container, snapshot,
// network namespace and workspace. It is idempotent.
func (m *Manager) stop(ctx context.Context, s *sess, final State, failure string) {
	m.mu.Lock()
	if s.info.State != StateRunning {
		m.mu.Unlock()
		<-s.done
		return
	}
	s.info.State = StateStopping
	closeConns(s, "")
	c := s.container
	m.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	log := m.log.With("session", s.info.ID, "tenant", s.info.Tenant)
	if err := removeContainer(ctx, c); err != nil {
		log.Error("remove container", "err", err)
	}
	if err := m.net.remove(ctx, s.info.ID); err != nil {
		log.Error("remove network", "err", err)
	}
	if err := m.removeWorkspace(s.info.ID); err != nil {
		log.Error("remove workspace", "err", err)
	}
	m.mu.Lock()
	s.info.State = final
	s.info.Failure = failure
	s.record(string(final), map[string]any{"failure": failure})
	m.mu.Unlock()
	m.ended(s)
	close(s.done)
	log.Info("session stopped", "state", final, "failure", failure)
}

// Endpoint returns where a running session answers.
func (m *Manager) Endpoint(tenant, id string) (Endpoint, error) {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return Endpoint{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.info.State != StateRunning {
		return Endpoint{}, publicf(ErrConflict, "the session is "+string(s.info.State), nil)
	}
	return s.ep, nil
}

// Touch records client activity, which re-arms the idle timeout.
func (m *Manager) Touch(id string) {
	m.mu.Lock()
	if s, ok := m.sessions[id]; ok {
		s.lastActive = time.Now()
	}
	m.mu.Unlock()
}

// Track registers a live connection of a preview on its session, so that
// the session's end or the preview's revocation closes it. The returned
// func unregisters it.
func (m *Manager) Track(tenant, id, preview string, c io.Closer) (func(), error) {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.info.State != StateRunning {
		return nil, publicf(ErrConflict, "the session is "+string(s.info.State), nil)
	}
	if _, ok := s.revoked[preview]; ok {
		return nil, publicf(ErrNotFound, "the preview was revoked", nil)
	}
	t := &tracked{preview: preview, c: c}
	s.conns[t] = struct{}{}
	return func() {
		m.mu.Lock()
		delete(s.conns, t)
		m.mu.Unlock()
	}, nil
}

// closeConns closes the session's tracked connections, all of them or
// those of one preview. The caller holds m.mu.
func closeConns(s *sess, preview string) {
	for t := range s.conns {
		if preview == "" || t.preview == preview {
			go t.c.Close()
			delete(s.conns, t)
		}
	}
}

// RevokePreview marks a preview revoked until its expiry and closes its
// live connections. Revocations are stored on the container, so they
// survive a gateway restart.
func (m *Manager) RevokePreview(ctx context.Context, tenant, id, preview string, until time.Time) error {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return err
	}
	m.mu.Lock()
	s.revoked[preview] = until
	closeConns(s, preview)
	c := s.container
	m.mu.Unlock()
	if c != nil {
		if _, err := c.SetLabels(m.ctx(ctx), map[string]string{labelRevoked + preview: strconv.FormatInt(until.Unix(), 10)}); err != nil {
			return fmt.Errorf("store revocation: %w", err)
		}
	}
	return nil
}

// Revoked tells whether a preview of the session was revoked.
func (m *Manager) Revoked(id, preview string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return false
	}
	_, r := s.revoked[preview]
	return r
}

// Health probing: a session whose VNC port stops accepting connections
// for probeMisses probes in a row has lost its sandbox (a gVisor sandbox
// killed by its memory limit, say, whose task containerd still reports
// running); it is stopped and reported failed.
const (
	probeEvery  = 3 * time.Second
	probeMisses = 3
)

// running returns the sessions that are running now.
func (m *Manager) running() []*sess {
	m.mu.Lock()
	defer m.mu.Unlock()
	var live []*sess
	for _, s := range m.sessions {
		if s.info.State == StateRunning {
			live = append(live, s)
		}
	}
	return live
}

func (m *Manager) probe() {
	for _, s := range m.running() {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			ctx, cancel := context.WithTimeout(m.base, 2*time.Second)
			defer cancel()
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", s.ep.VNC.String())
			if c != nil {
				c.Close()
			}
			if m.base.Err() != nil {
				return
			}
			m.mu.Lock()
			if err == nil {
				s.misses = 0
				m.mu.Unlock()
				return
			}
			s.misses++
			dead := s.misses >= probeMisses && s.info.State == StateRunning
			m.mu.Unlock()
			if dead {
				m.log.Warn("session stopped answering", "session", s.info.ID, "tenant", s.info.Tenant, "err", err)
				m.stop(m.base, s, StateFailed, "the session stopped answering: its display server is gone (the sandbox may have run out of memory)")
			}
		}()
	}
}

// reap ends sessions past their TTL or idle timeout, and probes their
// health.
func (m *Manager) reap() {
	defer m.wg.Done()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	health := time.NewTicker(probeEvery)
	defer health.Stop()
	for {
		select {
		case <-m.base.Done():
			return
		case <-health.C:
			m.probe()
		case now := <-tick.C:
			var due []*sess
			var why []string
			m.mu.Lock()
			for _, s := range m.sessions {
				if s.info.State != StateRunning {
					continue
				}
				switch {
				case now.After(s.info.ExpiresAt):
					due, why = append(due, s), append(why, "ttl")
				case s.info.IdleTimeout > 0 && now.Sub(s.lastActive) > time.Duration(s.info.IdleTimeout)*time.Second:
					due, why = append(due, s), append(why, "idle timeout")
				}
			}
			m.mu.Unlock()
			for i, s := range due {
				m.log.Info("reaping session", "session", s.info.ID, "tenant", s.info.Tenant, "reason", why[i])
				m.stop(m.base, s, StateStopped, "")
			}
		}
	}
}
