package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd"
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
	// MaxSessions is the gateway's capacity: tenant sessions at once, all
	// tenants together (0: no limit). Pooled sessions do not count.
	MaxSessions int
	// MinFreeDiskMB is the free space a create needs on each of
	// DiskPaths (the state directory and containerd's root, by default);
	// below it creates are refused and running sessions go on. Default
	// DefaultMinFreeDiskMB; negative: no check.
	MinFreeDiskMB int
	DiskPaths     []string
	ReadyTimeout  time.Duration
	// ProxyPort is where the egress proxy listens on the bridge's
	// address (default 3128); the kernel rules let sessions reach only it.
	ProxyPort uint16
	// ProxyURL is where the sessions of a backend with its own network
	// reach the egress proxy ("http://host:port"); empty: no proxy, and
	// allow lists and credential bindings are refused.
	ProxyURL string
	// Env adds environment variables to a new session (the egress CA's
	// key hashes, say). Nothing secret may go there: it is the sandbox's.
	Env func(Info) []string
	// Retention is how long an ended session still answers (GET, events)
	// before the manager forgets it (default DefaultRetention); its
	// artifacts stay in the store. MaxEnded caps how many ended sessions
	// are remembered (default DefaultMaxEnded), the oldest forgotten first.
	Retention time.Duration
	MaxEnded  int
	// Pools are the warm pools, bounded together by PoolLimits.
	Pools      []PoolConfig
	PoolLimits PoolLimits
	// Backend, when set, runs the sessions' sandboxes instead of
	// containerd (the Kubernetes backend, session/kube). It gives each
	// sandbox its own network: the manager then makes no network
	// namespace, firewall or workspace on this host, and Network,
	// ProxyPort, Image, Snapshotter and Runtimes are not used. Warm pools
	// and egress allow lists need the containerd backend for now.
	Backend Backend
	// Finalisers bounds how many ended sessions are finalised (their
	// observer told, artifacts stored) at once (default 4). Finalisation
	// runs apart from the reaper, so a slow store never delays a stop.
	Finalisers int
	// Scope names where this gateway's sandboxes live, as no other
	// gateway that shares its artifact store names its own: the backend
	// and its place (a host's containerd namespace, a cluster's
	// namespace). Each session's created event carries a tag of it
	// (scopeTag), and a gateway finalises from the store alone
	// (endStoredOrphans) only the sessions whose tag is its own; empty:
	// none.
	Scope string
	// OrphanQuiet: a trail the store had a piece of within this long is
	// not finalised from the store yet (endStoredOrphans), only looked
	// at again after it. Under Kubernetes a leader that was paused
	// rather than dead may still write one, or make its sandbox, as it
	// wakes and before it sees it lost the lease.
	OrphanQuiet time.Duration
	// Trails, when set, keeps every session's audit trail in a store
	// as it is written, TrailFlush (DefaultTrailFlush) after an event at
	// most, so that the trail outlives the gateway's host.
	Trails     TrailStore
	TrailFlush time.Duration
	// TakenOverElsewhere says a gateway on another host may take this
	// one's sessions over (the kubernetes backend's replicas): it has
	// only the store's copy of their trails, so Durable stores what a
	// request recorded before the request is answered. Otherwise the
	// trail's file on this host is what outlives the gateway's process
	// (the next gateway here reads it), and Durable leaves the store to
	// the journal: a write to MinIO was most of a warm claim's time.
	TakenOverElsewhere bool
	// Revocations, when set, keeps revoked previews beside the host's
	// file, where a gateway on another host finds them.
	Revocations RevocationStore
}

// Defaults of the manager's own bookkeeping.
const (
	DefaultRetention = time.Hour
	DefaultMaxEnded  = 1000
	// DefaultMinFreeDiskMB is the free disk a create needs by default.
	DefaultMinFreeDiskMB = 1024
)

// Defaults: what a session, a tenant or the manager gets when the request
// or the config names nothing. They are defined here, once; the gateway
// and cmd/sandgate refer to them.
const (
	DefaultTTL          = 15 * time.Minute // a session's TTL, at most the tenant's MaxTTL
	DefaultMaxTTL       = 24 * time.Hour   // a tenant's MaxTTL; its MaxIdle defaults to it
	DefaultMaxFileBytes = 1 << 30          // one file upload
	DefaultCPUs         = 1
	DefaultMemoryMB     = 2048
	DefaultPids         = 1024
	DefaultScreenWidth  = 1280
	DefaultScreenHeight = 800
	DefaultProxyPort    = 3128 // the egress proxy's port on the bridge
)

// WithDefaults fills the limits the config left out.
func (l TenantLimits) WithDefaults() TenantLimits {
	if l.MaxTTL == 0 {
		l.MaxTTL = DefaultMaxTTL
	}
	if l.DefaultTTL == 0 {
		l.DefaultTTL = min(DefaultTTL, l.MaxTTL)
	}
	if l.MaxIdle == 0 {
		l.MaxIdle = l.MaxTTL
	}
	if l.MaxFileBytes == 0 {
		l.MaxFileBytes = DefaultMaxFileBytes
	}
	return l
}

// TenantLimits bound what one tenant may ask for.
type TenantLimits struct {
	MaxSessions int
	// MaxCPUs and MaxMemoryMB bound the resources of the tenant's
	// sessions together (0: no limit).
	MaxCPUs     float64
	MaxMemoryMB int
	DefaultTTL  time.Duration
	MaxTTL      time.Duration
	MaxIdle     time.Duration
	// AllowRoot lets the tenant run commands as root in its sessions.
	AllowRoot bool
	// MaxFileBytes bounds one file upload.
	MaxFileBytes int64
	// EgressAllow is added to every session's egress allow list.
	EgressAllow []string
	// MaxRecordings bounds the tenant's recording sessions at once;
	// MaxCreatesPerMinute its creates admitted in a minute;
	// MaxArtifactBytes what its artifacts may take in the store (the
	// gateway checks that one). 0: no limit.
	MaxRecordings       int
	MaxCreatesPerMinute int
	MaxArtifactBytes    int64
	// Disabled refuses the tenant's creates, waiting ones too, and
	// stops a session that would start for it anyway.
	Disabled bool
}

// Manager runs sessions. It is safe for concurrent use.
type Manager struct {
	backend  Backend
	cfg      Config
	log      *slog.Logger
	net      *network
	runtimes map[string]*Runtime
	// base outlives requests: task waits and background creates use it.
	base   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	revocations *revocations
	finals      chan struct{} // a slot per finalisation running

	pools      []*pool
	poolLimits PoolLimits
	refillNow  chan struct{}
	cgroupWarn sync.Once // sessions' CPU use cannot be read (said once)

	// tenantMu guards cfg.Tenants, which SetTenant replaces whole.
	tenantMu sync.RWMutex

	mu        sync.Mutex
	sessions  map[string]*sess
	adopting  map[string]bool      // sessions being adopted (takeOver; made there)
	orphaning map[string]bool      // sessions whose trail file is finalised as ended unobserved (endOrphanFile; made there)
	overdue   map[string]bool      // sessions started alone whose due time is awaited (overdueAlone)
	byAddr    map[netip.Addr]*sess // live sessions by bridge address
	observer  Observer
	// Admission (admit.go): creates waiting per tenant, in order, and the
	// shares of creates admitted but not yet counted as sessions.
	queues     map[string][]*waiter
	reserved   map[*reservation]bool
	queueWaits queueStats
	// draining refuses new creates; inflight counts the creates under
	// way (admitted, not yet answered or, without wait, not yet started).
	draining bool
	inflight int
	creates  map[string][]time.Time // admission times in the last minute, by tenant
	// Profile holds (keep.go) by tenant/profile; profileFreed is closed
	// and replaced whenever one is dropped.
	profiles     map[string]*profileHold
	profileFreed chan struct{}
	// aloneHolds are the profile holds of sessions a replica starts
	// alone, by id (holdStartingAlone): each drops its hold, called
	// under mu. Moved to the session as it is adopted.
	aloneHolds map[string]func()
	// observed is closed once Observe has set the observer (nil in a
	// manager made without New: nothing to wait for).
	observed chan struct{}

	// The journal (journal.go) stores trails as they are written.
	journalKick chan struct{}
	journalCtx  context.Context // ends at Close, before the last flush
	journalStop context.CancelFunc
	// journalFailing: the journal's last flush failed (the store is
	// away); Durable does not wait for the store meanwhile.
	journalFailing atomic.Bool
}

type sess struct {
	info       Info
	addr       netip.Addr // on the bridge, once the network exists
	ep         Endpoint
	box        Sandbox // its sandbox, once created
	lastActive time.Time
	conns      map[*tracked]struct{}
	cancel     context.CancelFunc // cancels a create in progress
	done       chan struct{}      // closed when the session has stopped or failed
	final      chan struct{}      // closed when its finalisation is over
	endedAt    time.Time
	finalised  bool // the observer has the trail; the session may be forgotten
	told       bool // the observer was told it runs (adoptCreatedAlone, Observe)
	// relog: events were recorded after the trail was finalised, and the
	// stored log lacks them; relogging: a goroutine stores it again.
	relog, relogging bool
	relogMu          sync.Mutex // one store of it again at a time
	misses           int        // health probes in a row that found the display gone
	trail            trail
	// pool is the warm pool of a session nobody has claimed yet; claimFor
	// names the tenant of a claim in progress.
	pool     *pool
	claimFor string
	// rechecking: the reaper reads the record of this session, due for
	// its TTL, again (reapUnlessExtended).
	rechecking bool
	frozen     bool // its processes are frozen (a pooled session waiting)
	// settled: a pooled session whose start has quietened (see quiesce);
	// a claim prefers one.
	settled  bool
	freezeMu sync.Mutex // orders a freeze and the thaw of a claim
	// markMu orders the writes of the session's state to its record
	// (markState); marked is the last written, stopMarked says a stop
	// began (no running after it); resumeStop: adopted with a stop
	// that had begun, which the adoption finishes.
	markMu     sync.Mutex
	marked     State
	stopMarked bool
	resumeStop bool
	// claimStored, after a claim, is closed once containerd has the
	// claimant's labels (see storeClaim); later label writes wait for it.
	claimStored chan struct{}
	// storing is the pool of a claimed session whose container is still
	// labelled pooled in containerd (until storeClaim is done): it counts
	// against that pool meanwhile, so that containerd never holds more
	// pooled containers than the pool's limit.
	storing *pool
	// releaseProfile drops the session's profile hold once it has ended.
	releaseProfile func()
	// journalMu keeps one flush or drop of the session's stored trail at
	// a time (journal.go).
	journalMu sync.Mutex
}

func newSess(info Info) *sess {
	return &sess{info: info, lastActive: time.Now(), conns: map[*tracked]struct{}{},
		done: make(chan struct{}), final: make(chan struct{})}
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
		cfg.ProxyPort = DefaultProxyPort
	}
	tenants := make(map[string]TenantLimits, len(cfg.Tenants))
	for name, lim := range cfg.Tenants {
		tenants[name] = lim.WithDefaults()
	}
	cfg.Tenants = tenants
	if cfg.MinFreeDiskMB == 0 {
		cfg.MinFreeDiskMB = DefaultMinFreeDiskMB
	}
	if len(cfg.DiskPaths) == 0 {
		cfg.DiskPaths = []string{cfg.StateDir, "/var/lib/containerd"}
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.MaxEnded <= 0 {
		cfg.MaxEnded = DefaultMaxEnded
	}
	if cfg.Finalisers <= 0 {
		cfg.Finalisers = 4
	}
	if cfg.TrailFlush <= 0 {
		cfg.TrailFlush = DefaultTrailFlush
	}
	revs, err := loadRevocations(filepath.Join(cfg.StateDir, "revocations.jsonl"), time.Now())
	if err != nil {
		return nil, err
	}
	base, cancel := context.WithCancel(context.WithoutCancel(ctx))
	backend, n := cfg.Backend, (*network)(nil)
	if backend == nil {
		if n, err = newNetwork(cfg.Network, cfg.Namespace+"-"); err != nil {
			cancel()
			return nil, err
		}
		fw := newFirewall(cfg.Namespace, cfg.Network.Bridge, netip.AddrPortFrom(n.gateway, cfg.ProxyPort))
		if err := fw.install(); err != nil {
			cancel()
			return nil, err
		}
		backend = newContainerdBackend(base, client, cfg, log)
	} else if len(cfg.Pools) > 0 && cfg.PoolLimits.Freeze {
		// Freezing is the host cgroup's; a Pod cannot be paused.
		cancel()
		return nil, fmt.Errorf("warm pools that freeze need the containerd backend, not %s", backend.Name())
	}
	m := &Manager{backend: backend, cfg: cfg, log: log, net: n, base: base, cancel: cancel,
		sessions: map[string]*sess{}, byAddr: map[netip.Addr]*sess{}, queues: map[string][]*waiter{}, reserved: map[*reservation]bool{}, creates: map[string][]time.Time{}, profiles: map[string]*profileHold{}, profileFreed: make(chan struct{}), observed: make(chan struct{}), journalKick: make(chan struct{}, 1), revocations: revs, finals: make(chan struct{}, cfg.Finalisers)}
	m.dropEndedTrails()
	if err := m.loadStoredRevocations(ctx); err != nil {
		cancel()
		return nil, err
	}
	if m.runtimes, m.cfg.DefaultRuntime, err = Offered(backend.Name(), backend.Runtimes(ctx), cfg.DefaultRuntime); err != nil {
		cancel()
		return nil, err
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
	// Watched before the sessions are adopted; each adopted one's record
	// is read again once it is held (recover): a change another replica
	// writes meanwhile is not missed.
	if w, ok := m.backend.(RecordWatcher); ok {
		w.WatchRecords(m.recordChanged)
	}
	// Recovery first: an earlier gateway's pooled sessions are removed
	// even when this one's pool config is refused.
	if err := m.recover(m.base); err != nil {
		cancel()
		return nil, fmt.Errorf("recover sessions: %w", err)
	}
	if m.pools, err = newPools(cfg.Pools, m.runtimes, m.cfg.DefaultRuntime); err != nil {
		cancel()
		return nil, err
	}
	m.poolLimits, m.refillNow = cfg.PoolLimits.withDefaults(m.pools), make(chan struct{}, 1)
	m.wg.Add(1)
	go m.reap()
	m.journalCtx, m.journalStop = context.WithCancel(m.base)
	if m.journalOn() {
		m.wg.Add(1)
		go m.journal(m.journalCtx)
	}
	if len(m.pools) > 0 {
		m.wg.Add(1)
		go m.refill()
	}
	return m, nil
}

// Runtimes lists the handlers, strongest first.
func (m *Manager) Runtimes() []Runtime { return InOrder(m.runtimes) }

// Ready tells whether the backend answers.
func (m *Manager) Ready(ctx context.Context) error {
	if err := m.backend.Ready(ctx); err != nil {
		return publicf(ErrUnavailable, m.backend.Name()+" is not answering", err)
	}
	return nil
}

// ProxyAddr is where sessions reach the egress proxy: the bridge's own
// address. The proxy must listen there. Invalid when the backend gives
// sandboxes their own network: there is no egress proxy then.
func (m *Manager) ProxyAddr() netip.AddrPort {
	if m.net == nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(m.net.gateway, m.cfg.ProxyPort)
}

// Backend names the backend that runs the sessions' sandboxes.
func (m *Manager) Backend() string { return m.backend.Name() }

// BySource finds the live session holding a bridge address, for the
// egress proxy.
func (m *Manager) BySource(a netip.Addr) (Info, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.byAddr[a]
	if !ok || (s.info.State != StateStarting && s.info.State != StateRunning) {
		return Info{}, false
	}
	return copyInfo(s.info), true
}

// DefaultRuntime is the runtime a session gets when it names none.
func (m *Manager) DefaultRuntime() string { return m.cfg.DefaultRuntime }

// Limits returns the tenant's limits.
func (m *Manager) Limits(tenant string) (TenantLimits, bool) {
	m.tenantMu.RLock()
	defer m.tenantMu.RUnlock()
	l, ok := m.cfg.Tenants[tenant]
	return l, ok
}

// SetTenant adds a tenant or changes its limits; creates waiting in line
// look again (a raised quota may let them in).
func (m *Manager) SetTenant(name string, lim TenantLimits) {
	m.tenantMu.Lock()
	tenants := make(map[string]TenantLimits, len(m.cfg.Tenants)+1)
	for k, v := range m.cfg.Tenants {
		tenants[k] = v
	}
	tenants[name] = lim.WithDefaults()
	m.cfg.Tenants = tenants
	m.tenantMu.Unlock()
	m.mu.Lock()
	m.wakeAllLocked() // a raised quota lets some in; a disabled tenant's leave
	m.mu.Unlock()
}

// disabled reports whether tenant is disabled.
func (m *Manager) disabled(tenant string) bool {
	l, _ := m.Limits(tenant)
	return l.Disabled
}

var errTenantDisabled = &PublicError{Class: ErrDenied, Msg: "the tenant is disabled"}

// StopTenant stops every session of the tenant (a disabled tenant's):
// their connections close and their artifacts are kept, as at any stop.
func (m *Manager) StopTenant(tenant, reason string) int {
	m.mu.Lock()
	var running []*sess
	var starting []context.CancelFunc
	for _, s := range m.sessions {
		if s.pool != nil || s.info.Tenant != tenant {
			continue
		}
		switch {
		case m.beginStopLocked(s, map[string]any{"reason": reason}):
			running = append(running, s)
		case s.info.State == StateStarting && s.cancel != nil:
			starting = append(starting, s.cancel) // the start rolls back by itself
		}
	}
	m.mu.Unlock()
	for _, cancel := range starting {
		cancel()
	}
	for _, s := range running {
		m.teardownAsync(s, StateStopped, "")
	}
	return len(running) + len(starting)
}

// Close stops the reaper and background work; sessions keep running in
// containerd, for the next gateway to adopt. Pooled sessions nobody
// claimed are removed (the next gateway would remove them anyway).
func (m *Manager) Close() {
	if m.journalStop != nil {
		m.journalStop() // a put under way ends now: the last flush follows
	}
	m.lastFlush()
	m.mu.Lock() // (adoptCreatedAlone adds to wg under it)
	m.cancel()
	m.mu.Unlock()
	m.wg.Wait()
	m.removePooled()
	m.sweep()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.sessions {
		closeConns(s, "")
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
	if i.Profile != nil {
		p := *i.Profile
		i.Profile = &p
	}
	return i
}

func (m *Manager) lookup(tenant, id string) (*sess, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok || s.pool != nil || s.info.Tenant != tenant {
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
		if s.pool == nil && s.info.Tenant == tenant {
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
	lim, _ := m.Limits(tenant)
	m.mu.Lock()
	if s.info.State != StateRunning {
		m.mu.Unlock()
		return Info{}, publicf(ErrConflict, "only a running session can be extended", nil)
	}
	exp, err := ExtendedExpiry(s.info.CreatedAt, lim.MaxTTL, ttl, time.Now())
	if err != nil {
		m.mu.Unlock()
		return Info{}, err
	}
	sb, stored := s.box, s.claimStored
	m.mu.Unlock()
	if stored != nil {
		select { // the claim's labels first: they hold the older expiry
		case <-stored:
		case <-ctx.Done():
			return Info{}, fmt.Errorf("store expiry: %w", ctx.Err())
		}
	}
	set := map[string]string{labelExpires: exp.Format(time.RFC3339Nano)}
	if u, ok := sb.(RecordUpdater); ok {
		// Not over a stop another replica stored (a delete while no
		// leader answered it): that stop is carried out (recordChanged).
		_, err = u.UpdateRecord(ctx, func(rec map[string]string) (map[string]string, error) {
			if State(rec[labelState]) == StateStopping {
				return nil, publicf(ErrConflict, "only a running session can be extended", nil)
			}
			return set, nil
		})
	} else {
		_, err = sb.SetRecord(ctx, set)
	}
	var pe *PublicError
	if errors.As(err, &pe) {
		return Info{}, err
	}
	if err != nil {
		return Info{}, fmt.Errorf("store expiry: %w", err)
	}
	m.mu.Lock()
	s.info.ExpiresAt = exp
	info := copyInfo(s.info)
	m.mu.Unlock()
	return info, nil
}

// recordChanged takes in what another replica wrote to the record of
// a session this manager holds (RecordWatcher): while no leader
// answered it, or this one (alive, its lease held) did not answer it.
// A stop asked (a delete) stops the session, as the leader's delete
// would, recorded as asked; an expiry moved (an extension) is the
// session's. Records of sessions it does not hold, pooled ones', and
// any change to a session not running, are left alone.
func (m *Manager) recordChanged(rec map[string]string) {
	if m.base.Err() != nil {
		return // closed (or closing): the next gateway adopts it
	}
	m.mu.Lock()
	s := m.sessions[rec[labelSession]]
	if s == nil && rec[RecordCreatedAlone] != "" && rec[labelPool] == "" {
		// A session a replica created while no leader answered, which
		// runs now (or was deleted as it started): this leader's.
		m.mu.Unlock()
		switch State(rec[labelState]) {
		case StateRunning, StateStopping:
			m.adoptCreatedAlone(rec[labelSession])
		case StateStarting:
			// Its creator answers for it until then.
			m.holdStartingAlone(rec[labelSession], rec)
			m.overdueAlone(rec[labelSession])
		}
		return
	}
	if s == nil || s.pool != nil || s.resumeStop || s.info.State != StateRunning || rec[labelPool] != "" {
		m.mu.Unlock()
		return
	}
	if State(rec[labelState]) == StateStopping {
		at, err := time.Parse(time.RFC3339Nano, rec[RecordStopAsked])
		if err != nil {
			m.mu.Unlock()
			return // (this manager's own stop, under way)
		}
		m.beginStopLocked(s, map[string]any{"happened_at": at.UTC().Format(time.RFC3339Nano),
			"reason": "deleted through another gateway replica"}) // (running: checked above)
		m.mu.Unlock()
		m.log.Info("another gateway replica stopped the session by its record: it is stopped", "session", s.info.ID)
		m.teardownAsync(s, StateStopped, "")
		return
	}
	if exp, err := time.Parse(time.RFC3339Nano, rec[labelExpires]); err == nil && !exp.Equal(s.info.ExpiresAt) {
		s.info.ExpiresAt = exp
	}
	m.mu.Unlock()
}

// ExtendedExpiry is the expiry an extension by ttl at now gives a
// session created at created, bounded by the tenant's maximum TTL
// (maxTTL) counted from its creation: what the leader (Extend) and a
// replica that extends a session while no leader answers both check.
func ExtendedExpiry(created time.Time, maxTTL, ttl time.Duration, now time.Time) (time.Time, error) {
	if ttl < time.Second {
		return time.Time{}, publicf(ErrInvalid, "ttl_seconds must be at least 1", nil)
	}
	exp := now.UTC().Add(ttl)
	if max := created.Add(maxTTL); exp.After(max) {
		return time.Time{}, publicf(ErrInvalid, fmt.Sprintf("the session may live until %s at most (the tenant's maximum TTL)", max.Format(time.RFC3339)), nil)
	}
	return exp, nil
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
