package session

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/ids"
)

// A warm pool keeps sessions of one shape fully started (display, VNC,
// Chromium answering CDP) and belonging to nobody, so that a create
// request of that shape gets one at once. A pooled session is used once:
// the first request that fits claims it and it becomes that request's
// session for good; it is never returned to the pool, so no two requests
// or tenants ever share a browser profile. Pooled sessions count against
// no tenant's quota, reach nothing through the egress proxy (their allow
// list is empty) and are removed, never adopted, by a restarted gateway.

// PoolConfig is one warm pool.
type PoolConfig struct {
	Kind    Kind   // default browser
	Runtime string // default: the manager's default runtime
	Screen  Screen // default DefaultScreenWidth x DefaultScreenHeight
	Size    int    // sessions kept started
}

// PoolLimits bound what all pools together take from the host.
type PoolLimits struct {
	// MaxSessions bounds the pooled sessions of all pools, started or
	// starting (default: the sum of the pools' sizes).
	MaxSessions int
	// MinAvailableMemoryMB: a refill waits while the host's available
	// memory is below this plus the new session's memory limit
	// (default 1024).
	MinAvailableMemoryMB int
	// Freeze stops pooled sessions' processes while they wait, so that a
	// full pool costs no CPU. Measured here, a thawed Chromium answers
	// slowly for seconds after the claim (a warm connect took 1.1 s under
	// runc instead of 0.2 s, 5 s under gVisor), so it is off by default.
	Freeze bool
	// MaxAge replaces a pooled session nobody claimed in this long
	// (default DefaultPoolMaxAge), so that a claim never gets a browser
	// that sat for hours.
	MaxAge time.Duration
	// RefillDelay is how long a pool waits after a claim before it starts
	// the session that replaces the claimed one (default
	// DefaultPoolRefillDelay). A start takes the host's CPU for seconds
	// (both cores of a small machine, for a gVisor sandbox); the claimed
	// session's first CDP exchanges come first. Claims in the meantime
	// do not push it further, so a busy pool is refilled all the same.
	RefillDelay time.Duration
}

// Pool defaults.
const (
	DefaultPoolMaxAge        = 30 * time.Minute
	DefaultPoolMinFreeMemory = 1024
	DefaultPoolRefillDelay   = time.Second
	poolRefillCheck          = time.Second
	thawCheck                = 5 * time.Second  // a thawed session answers within
	claimTimeout             = 15 * time.Second // a claim's containerd and runtime calls
	maxRefillBackoff         = time.Minute
)

// labelPool marks a pooled container with its pool's key; a claim clears
// it before the session is handed out.
const labelPool = "sandgate.pool"

// claimFailed marks a pooled session whose claim failed, on its way out.
const claimFailed = "(claim failed)"

// How a session was started, in Info.Start.
const (
	StartCold = "cold"
	StartWarm = "warm"
)

// shape is what a pooled session is started with; a request fits a pool
// when its normalised spec has the same shape.
type shape struct {
	kind      Kind
	runtime   string
	screen    Screen
	resources Resources
}

func (s shape) key() string {
	return fmt.Sprintf("%s/%s/%dx%d", s.kind, s.runtime, s.screen.Width, s.screen.Height)
}

// pool is one warm pool's state; its fields are guarded by Manager.mu.
type pool struct {
	shape
	size int

	claims, misses        int64
	refills, refillErrors int64
	refillTotal           time.Duration // of the successful refills
	lastRefill            time.Duration
	failStreak            int
	nextTry               time.Time
}

// PoolStats is one pool as GET /v1/pools and /metrics show it.
type PoolStats struct {
	Key       string    `json:"key"`
	Kind      Kind      `json:"kind"`
	Runtime   string    `json:"runtime"`
	Screen    Screen    `json:"screen"`
	Resources Resources `json:"resources"`
	// Size is the target; Available are started and unclaimed; Starting
	// are on their way.
	Size      int `json:"size"`
	Available int `json:"available"`
	Starting  int `json:"starting"`
	// Frozen are the available ones whose processes are stopped while
	// they wait (they use no CPU).
	Frozen int `json:"frozen"`
	// Settling are the available ones whose start is still busy (see
	// quiesce); a claim takes one only when no settled one is there.
	Settling int `json:"settling"`
	// Claims are creates served from the pool, Misses creates that fit
	// it but found it empty (they took the cold path).
	Claims int64 `json:"claims"`
	Misses int64 `json:"misses"`
	// Refills are pooled sessions started, RefillErrors starts that
	// failed; RefillAvgMs is the mean time of a successful refill and
	// RefillsPerMinute the most this pool refills at that pace.
	Refills          int64   `json:"refills"`
	RefillErrors     int64   `json:"refill_errors"`
	RefillAvgMs      int64   `json:"refill_avg_ms"`
	LastRefillMs     int64   `json:"last_refill_ms"`
	RefillsPerMinute float64 `json:"refills_per_minute"`
}

// newPools checks the pools' config against the usable runtimes (as
// Offered gives them) and the default.
func newPools(cfgs []PoolConfig, runtimes map[string]*Runtime, defaultRuntime string) ([]*pool, error) {
	var out []*pool
	seen := map[string]bool{}
	for i, c := range cfgs {
		spec := Spec{Kind: c.Kind, Runtime: c.Runtime, Screen: c.Screen}
		rt, err := normalizeShape(&spec, runtimes, defaultRuntime)
		if err != nil {
			return nil, fmt.Errorf("pool %d: %w", i, err)
		}
		if c.Size < 0 || c.Size > 64 {
			return nil, fmt.Errorf("pool %d: size must be between 0 and 64", i)
		}
		p := &pool{shape: shape{kind: spec.Kind, runtime: rt.Name, screen: spec.Screen, resources: spec.Resources}, size: c.Size}
		if seen[p.key()] {
			return nil, fmt.Errorf("pool %d: a second pool of %s", i, p.key())
		}
		seen[p.key()] = true
		out = append(out, p)
	}
	return out, nil
}

// fitting returns the pool a normalised spec fits, or nil.
func (m *Manager) fitting(spec Spec) *pool {
	want := shape{kind: spec.Kind, runtime: spec.Runtime, screen: spec.Screen, resources: spec.Resources}
	for _, p := range m.pools {
		if p.shape == want {
			return p
		}
	}
	return nil
}

// takePooled reserves a started, unclaimed session of p; the caller holds
// m.mu. The session stays out of everyone's reach until the claim is
// finished or abandoned.
func (m *Manager) takePooled(p *pool, tenant string) *sess {
	var best *sess
	for _, s := range m.sessions {
		if s.pool == p && s.claimFor == "" && s.info.State == StateRunning {
			// A settled one first (see quiesce), then the oldest: it
			// has the least time left. One still settling is better than
			// the cold path.
			if best == nil || (s.settled && !best.settled) ||
				(s.settled == best.settled && s.info.CreatedAt.Before(best.info.CreatedAt)) {
				best = s
			}
		}
	}
	if best != nil {
		best.claimFor = tenant
	}
	return best
}

// claim makes a reserved pooled session the session of spec: its labels
// in containerd first (so that a gateway that dies now adopts it as the
// tenant's, or removes it as pooled, never half of each), then its record.
// On failure the pooled session is removed and the caller takes the cold
// path.
func (m *Manager) claim(ctx context.Context, s *sess, spec Spec, t0 time.Time, r *reservation, releaseProfile func()) (Info, bool, error) {
	// A claim, once begun, finishes even if its caller hangs up: the
	// session is the tenant's then, as a cold one would be.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	now := time.Now().UTC()
	m.mu.Lock()
	info := s.info
	pooledAt, p, sb, addr := info.CreatedAt, s.pool, s.box, s.addr
	m.mu.Unlock()
	info.Tenant, info.CreatedAt, info.ExpiresAt = spec.Tenant, now, now.Add(spec.TTL)
	info.IdleTimeout, info.Record, info.Labels, info.Egress = int(spec.IdleTimeout.Seconds()), spec.Record, spec.Labels, spec.Egress
	info.Start = StartWarm
	info.Profile, info.Snapshot = spec.Profile, spec.Snapshot
	if info.Labels == nil {
		info.Labels = map[string]string{}
	}
	// The claim record is written once the session is known to answer
	// (a frozen one is thawed first).
	err := m.thaw(ctx, s)
	var labels map[string]string
	if err == nil {
		labels, err = containerLabels(info, addr.String())
	}
	// A backend with its own network keeps the record with the sandbox
	// only (a Pod's annotation, read by any gateway), written before the
	// claim answers; the containerd backend's goes to a file first and
	// to containerd after (storeClaim).
	recordNow := m.net == nil
	if err == nil && recordNow && m.disabled(spec.Tenant) {
		err = errTenantDisabled // before the Pod is the tenant's, not after
	}
	if err == nil {
		labels[labelPool] = ""
		// The claim changes whose the session is, not its state: the
		// pooled session's own mark (markState) stays.
		delete(labels, labelState)
		if recordNow {
			_, err = sb.SetRecord(ctx, labels)
		} else {
			err = m.writeClaim(info.ID, labels)
		}
	}
	m.mu.Lock()
	if err == nil && m.disabled(spec.Tenant) {
		err = errTenantDisabled // the cold path refuses it too
	}
	if err != nil || s.info.State != StateRunning {
		// No longer counts against the tenant, and never taken again;
		// the reservation counts again, for the cold path.
		s.claimFor = claimFailed
		r.claiming = false
		m.mu.Unlock()
		// No record may outlive a failed claim: a restarted gateway
		// would adopt a session nobody was given.
		os.Remove(filepath.Join(m.workspaceDir(info.ID), claimFile))
		m.log.Warn("warm session could not be claimed; taking the cold path", "session", info.ID, "pool", p.key(), "err", err)
		m.stopAsync(s, StateFailed, "the claim failed")
		return Info{}, false, nil
	}
	s.pool, s.claimFor = nil, ""
	s.claimStored = make(chan struct{})
	if recordNow {
		close(s.claimStored)
	} else {
		s.storing = p
		m.wg.Add(1)
		go m.storeClaim(s, sb, labels)
	}
	s.info = info
	s.releaseProfile = releaseProfile
	m.releaseLocked(r)
	s.lastActive = time.Now()
	p.claims++
	if now := time.Now(); !now.Before(p.nextTry) {
		p.nextTry = now.Add(m.poolLimits.RefillDelay)
	}
	s.trail = m.liveTrail(info.Tenant, info.ID, true)
	created := m.createdFields(info)
	created["start"] = StartWarm
	s.record("created", created)
	s.record("started", map[string]any{"took_ms": time.Since(t0).Milliseconds(), "start": StartWarm,
		"pooled_ms": now.Sub(pooledAt).Milliseconds(), "pool": p.key()})
	o, out, ep := m.observer, copyInfo(s.info), s.ep
	m.mu.Unlock()
	m.log.Info("session claimed from the warm pool", "session", info.ID, "tenant", info.Tenant, "pool", p.key(), "took", time.Since(t0))
	time.AfterFunc(max(m.poolLimits.RefillDelay, 0), m.kickRefill)
	if out.Profile != nil || out.Snapshot != "" {
		// Written in before anyone has the session: a failure fails the
		// create (the session is the tenant's now; it is not handed out).
		t1 := time.Now()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.ReadyTimeout+SaveTimeout)
		version, err := m.restore(rctx, out, sb, ep)
		cancel()
		if err != nil {
			m.log.Warn("restore into a claimed session failed", "session", info.ID, "tenant", info.Tenant, "err", err)
			failure := failureText(rctx, err)
			m.stop(m.base, s, StateFailed, failure)
			return Info{}, false, publicf(ErrUnavailable, "the session could not be started: "+failure, err)
		}
		m.mu.Lock()
		s.ep.Version, ep.Version = version, version
		s.record("restored", map[string]any{"took_ms": time.Since(t1).Milliseconds()})
		m.mu.Unlock()
	}
	if o != nil {
		o.SessionRunning(out, ep)
	}
	return out, true, nil
}

// A claim is recorded in two places. Before it answers, the claimant's
// labels go to a file in the session's host directory (which the session
// cannot reach): a write and a rename, well under a millisecond. After
// it answers, they go to containerd (a bolt transaction with fsync, a few
// milliseconds), and the file goes. A gateway that dies in between finds
// the file when it restarts and applies it before it adopts (adopt). The
// file need not be synced to disk: it has to outlive the gateway's
// process, which the page cache does; a crash of the host ends every
// session anyway.
const claimFile = "claim.json"

// maxClaimBytes bounds a claim file read back.
const maxClaimBytes = 64 << 10

func (m *Manager) writeClaim(id string, labels map[string]string) error {
	b, err := json.Marshal(labels)
	if err != nil {
		return err
	}
	path := filepath.Join(m.workspaceDir(id), claimFile)
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("claim record: %w", err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return fmt.Errorf("claim record: %w", err)
	}
	return nil
}

// readClaim reads a claim record left by a gateway that died mid-claim;
// it must name the session it is in.
func (m *Manager) readClaim(id string) (map[string]string, error) {
	f, err := os.Open(filepath.Join(m.workspaceDir(id), claimFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var labels map[string]string
	if err := json.NewDecoder(io.LimitReader(f, maxClaimBytes)).Decode(&labels); err != nil {
		return nil, fmt.Errorf("claim record: %w", err)
	}
	if labels[labelSession] != id || labels[labelPool] != "" {
		return nil, errors.New("claim record: not this session's claim")
	}
	return labels, nil
}

// storeClaim writes a claim's labels to containerd after the claim has
// answered, then drops the claim file, trying again with backoff until
// containerd takes them, the container is gone, or the manager closes
// (the file then stays, and a restarted gateway applies it). done closes
// at the end: later label writes (Extend) wait for it, so that a claim
// written after them cannot undo them.
func (m *Manager) storeClaim(s *sess, sb Sandbox, labels map[string]string) {
	defer m.wg.Done()
	m.mu.Lock()
	id, done := s.info.ID, s.claimStored
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		s.storing = nil
		m.mu.Unlock()
		close(done)
		m.kickRefill() // the pool's place it held is free now
	}()
	// Not while the claimant connects (its first exchanges follow the
	// answer within milliseconds): on a small host, containerd's write
	// and fsync slowed them (one-call connects measured 9.9 ms p50 beside
	// 7.8 ms for clients that made two calls first). The record keeps
	// the claim meanwhile.
	select {
	case <-m.base.Done():
		return
	case <-time.After(claimStoreDelay):
	}
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		ctx, cancel := context.WithTimeout(m.base, claimTimeout)
		_, err := sb.SetRecord(ctx, labels)
		cancel()
		if err == nil || errors.Is(err, ErrSandboxGone) {
			os.Remove(filepath.Join(m.workspaceDir(id), claimFile))
			return
		}
		m.log.Warn("a claimed session's labels are not in containerd yet; its claim record keeps them meanwhile", "session", id, "err", err, "retry_in", wait)
		select {
		case <-m.base.Done():
			return
		case <-time.After(wait):
		}
	}
}

// claimStoreDelay is how long after a claim its labels go to containerd.
const claimStoreDelay = 250 * time.Millisecond

// kickRefill wakes the refiller without waiting for it.
func (m *Manager) kickRefill() {
	select {
	case m.refillNow <- struct{}{}:
	default:
	}
}

// refill keeps the pools full, one session start at a time, so that
// refilling never takes more than one start's worth of the host.
func (m *Manager) refill() {
	defer m.wg.Done()
	tick := time.NewTicker(poolRefillCheck)
	defer tick.Stop()
	for {
		for {
			mem := availableMemoryMB()
			if m.net == nil {
				mem = -1 // the sessions are not on this host: the scheduler places them
			}
			p := m.nextRefill(time.Now(), mem)
			if p == nil {
				break
			}
			m.fill(p)
			if m.base.Err() != nil {
				return
			}
		}
		select {
		case <-m.base.Done():
			return
		case <-m.refillNow:
		case <-tick.C:
		}
	}
}

// nextRefill picks the pool to start a session for, or nil: the one
// furthest below its size, within the pools' limits and past its backoff.
func (m *Manager) nextRefill(now time.Time, memMB int) *pool {
	if m.DiskLow() != "" {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.draining {
		return nil // the next gateway fills its own pools
	}
	live := map[*pool]int{}
	total := 0
	for _, s := range m.sessions {
		// One on its way out still holds its container: it counts
		// until it is gone, so that the pool never holds more.
		if s.pool != nil && (s.info.State == StateStarting || s.info.State == StateRunning || s.info.State == StateStopping) {
			live[s.pool]++
			total++
		}
		if s.storing != nil {
			live[s.storing]++
			total++
		}
	}
	if total >= m.poolLimits.MaxSessions {
		return nil
	}
	var best *pool
	for _, p := range m.pools {
		missing := p.size - live[p]
		if missing <= 0 || now.Before(p.nextTry) {
			continue
		}
		if memMB >= 0 && memMB < m.poolLimits.MinAvailableMemoryMB+p.resources.MemoryMB {
			continue
		}
		if best == nil || missing > best.size-live[best] {
			best = p
		}
	}
	return best
}

// fill starts one pooled session of p and waits for it.
func (m *Manager) fill(p *pool) {
	rt := m.runtimes[p.runtime]
	now := time.Now().UTC()
	info := Info{
		ID: ids.NewSession(), Kind: p.kind, Runtime: rt.Name, Isolation: rt.Isolation,
		State: StateStarting, CreatedAt: now, ExpiresAt: now.Add(m.poolLimits.MaxAge),
		Resources: p.resources, Screen: p.screen, Labels: map[string]string{}, Start: StartWarm,
	}
	ctx, cancel := context.WithTimeout(m.base, m.cfg.ReadyTimeout+30*time.Second)
	defer cancel()
	s := newSess(info)
	s.pool, s.cancel = p, cancel
	m.mu.Lock()
	m.sessions[info.ID] = s
	m.mu.Unlock()
	log := m.log.With("session", info.ID, "pool", p.key())
	t0 := time.Now()
	err := m.start(ctx, s, rt, log)
	took := time.Since(t0)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		p.refillErrors++
		p.failStreak++
		wait := min(time.Duration(1<<min(p.failStreak, 6))*time.Second, maxRefillBackoff)
		p.nextTry = time.Now().Add(wait)
		if m.base.Err() == nil {
			log.Warn("warm pool refill failed", "err", err, "retry_in", wait)
		}
		return
	}
	p.refills++
	p.failStreak, p.nextTry = 0, time.Time{}
	p.refillTotal += took
	p.lastRefill = took
	log.Info("warm pool refilled", "took", took.Round(time.Millisecond))
	m.wg.Add(1)
	go m.quiesce(s, log)
}

// A pooled browser answers CDP seconds before Chromium has finished
// starting: it goes on loading and compiling for a while, and a claim
// made at once waited 200 ms (runc) and 1.6 s (gVisor) for its first CDP
// answer (measured). quiesce watches the session's cgroup until it uses
// less than settleCPU of a core over a settleWindow, for at most
// settleLimit, and marks it settled; a claim prefers a settled session.
// Only then is a pool that freezes frozen: the start's work is done
// while the session waits, not after the claim.
const (
	settleWindow = 500 * time.Millisecond
	settleCPU    = 0.2 // cores; above an idle gVisor sandbox's floor (0.115)
	settleLimit  = time.Minute
)

func (m *Manager) quiesce(s *sess, log *slog.Logger) {
	defer m.wg.Done()
	t0 := time.Now()
	m.mu.Lock()
	sb := s.box
	m.mu.Unlock()
	prev, ok := sb.CPU()
	at := time.Now()
	quiet := false
	for ok && !quiet && time.Since(t0) < settleLimit {
		select {
		case <-s.done:
			return
		case <-m.base.Done():
			return
		case <-time.After(settleWindow):
		}
		m.mu.Lock()
		claimed := s.pool == nil || s.claimFor != ""
		m.mu.Unlock()
		if claimed {
			return // the claimant's session now; nothing to prefer
		}
		var cur time.Duration
		if cur, ok = sb.CPU(); ok {
			now := time.Now()
			quiet = float64(cur-prev) < settleCPU*float64(now.Sub(at))
			prev, at = cur, now
		}
	}
	m.mu.Lock()
	// Claimed or stopping meanwhile (a teardown removes the cgroup before
	// the session is done): nothing left to mark.
	waiting := s.pool != nil && s.claimFor == "" && s.info.State == StateRunning
	if waiting {
		s.settled = true
	}
	m.mu.Unlock()
	if !waiting {
		return
	}
	switch {
	case quiet:
		log.Debug("pooled session settled", "took", time.Since(t0).Round(time.Millisecond))
	case ok:
		log.Warn("pooled session still busy; taken as settled all the same", "waited", settleLimit)
	default:
		m.cgroupWarn.Do(func() {
			m.log.Warn("pooled sessions' CPU use cannot be read: they are taken as settled at once", "backend", m.backend.Name(), "session", s.info.ID)
		})
	}
	if m.poolLimits.Freeze {
		m.wg.Add(1)
		m.freeze(s)
	}
}

// freeze stops a pooled session's processes while it waits, so that a
// full pool costs no CPU. Nobody can reach it meanwhile: it has no tenant,
// no preview and an empty allow list.
func (m *Manager) freeze(s *sess) {
	defer m.wg.Done()
	// freezeMu is held from the check to the end of the pause: a claim
	// (thaw) or a teardown waits for it, then sees frozen.
	s.freezeMu.Lock()
	defer s.freezeMu.Unlock()
	m.mu.Lock()
	sb, ok := s.box, s.pool != nil && s.claimFor == "" && s.info.State == StateRunning
	if ok {
		s.frozen = true
	}
	m.mu.Unlock()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(m.base, 30*time.Second)
	defer cancel()
	if err := sb.Freeze(ctx); err != nil {
		m.log.Warn("pooled session not frozen; it waits running", "session", s.info.ID, "err", err)
		m.mu.Lock()
		s.frozen = false
		m.mu.Unlock()
	}
}

// thaw resumes a frozen pooled session and checks that it answers: its
// display, and for a browser its CDP endpoint.
func (m *Manager) thaw(ctx context.Context, s *sess) error {
	s.freezeMu.Lock()
	defer s.freezeMu.Unlock()
	m.mu.Lock()
	frozen, sb, ep, kind := s.frozen, s.box, s.ep, s.info.Kind
	m.mu.Unlock()
	if !frozen {
		return nil
	}
	if err := sb.Thaw(ctx); err != nil {
		return fmt.Errorf("thaw: %w", err)
	}
	m.mu.Lock()
	s.frozen = false
	m.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, thawCheck)
	defer cancel()
	if _, _, err := waitReady(cctx, ep, kind == KindBrowser, nil, thawCheck); err != nil {
		return fmt.Errorf("after the thaw: %w", err)
	}
	return nil
}

// PoolsOf reports the warm pools of cfgs (checked as a manager checks
// them, against runtimes as Offered gives them and the default) from
// their sessions' records, as a replica that holds none of them says
// them: a pooled session whose record says running and whose sandbox
// runs is available, one whose record says starting is on its way.
// What only the manager that refills them knows (claims, misses,
// refills, which are frozen or settling) reads 0, as it does on a
// manager that has just taken over.
func PoolsOf(cfgs []PoolConfig, runtimes map[string]*Runtime, defaultRuntime string, records []RecordSeen) ([]PoolStats, error) {
	pools, err := newPools(cfgs, runtimes, defaultRuntime)
	if err != nil {
		return nil, err
	}
	out := make([]PoolStats, 0, len(pools))
	for _, p := range pools {
		st := PoolStats{Key: p.key(), Kind: p.kind, Runtime: p.runtime, Screen: p.screen, Resources: p.resources, Size: p.size}
		for _, r := range records {
			if r.Record[labelPool] != st.Key {
				continue
			}
			switch State(r.Record[labelState]) {
			case StateRunning:
				if r.Running {
					st.Available++
				}
			case StateStarting:
				st.Starting++
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// Pools reports the warm pools.
func (m *Manager) Pools() []PoolStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	avail, starting, frozen, settling := map[*pool]int{}, map[*pool]int{}, map[*pool]int{}, map[*pool]int{}
	for _, s := range m.sessions {
		switch {
		case s.pool == nil:
		case s.info.State == StateRunning && s.claimFor == "":
			avail[s.pool]++
			if s.frozen {
				frozen[s.pool]++
			}
			if !s.settled {
				settling[s.pool]++
			}
		case s.info.State == StateStarting:
			starting[s.pool]++
		}
	}
	out := make([]PoolStats, 0, len(m.pools))
	for _, p := range m.pools {
		st := PoolStats{Key: p.key(), Kind: p.kind, Runtime: p.runtime, Screen: p.screen, Resources: p.resources,
			Size: p.size, Available: avail[p], Starting: starting[p], Frozen: frozen[p], Settling: settling[p], Claims: p.claims, Misses: p.misses,
			Refills: p.refills, RefillErrors: p.refillErrors, LastRefillMs: p.lastRefill.Milliseconds()}
		if p.refills > 0 {
			avg := p.refillTotal / time.Duration(p.refills)
			st.RefillAvgMs = avg.Milliseconds()
			if avg > 0 {
				st.RefillsPerMinute = float64(time.Minute) / float64(avg)
			}
		}
		out = append(out, st)
	}
	return out
}

// availableMemoryMB reads MemAvailable from /proc/meminfo, or -1.
func availableMemoryMB() int {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				return -1
			}
			return kb / 1024
		}
	}
	return -1
}

func (l PoolLimits) withDefaults(pools []*pool) PoolLimits {
	if l.MaxSessions <= 0 {
		for _, p := range pools {
			l.MaxSessions += p.size
		}
	}
	if l.MinAvailableMemoryMB <= 0 {
		l.MinAvailableMemoryMB = DefaultPoolMinFreeMemory
	}
	if l.MaxAge <= 0 {
		l.MaxAge = DefaultPoolMaxAge
	}
	if l.RefillDelay == 0 {
		l.RefillDelay = DefaultPoolRefillDelay
	}
	return l
}

// removePooled removes the pooled sessions nobody claimed, at shutdown,
// once the refiller has stopped.
func (m *Manager) removePooled() {
	m.mu.Lock()
	var pooled []*sess
	for _, s := range m.sessions {
		if s.pool != nil && s.claimFor == "" && s.info.State == StateRunning {
			s.info.State = StateStopping
			pooled = append(pooled, s)
		}
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range pooled {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			m.stopping(s.info.ID)
			s.freezeMu.Lock()
			err := s.box.Remove(ctx)
			s.freezeMu.Unlock()
			if err == nil {
				err = m.removeHostParts(ctx, s.info.ID)
			}
			if err != nil {
				m.log.Warn("pooled session not removed at shutdown; the next gateway removes it", "session", s.info.ID, "err", err)
			}
		}()
	}
	wg.Wait()
}

// longestTTL is the longest TTL any tenant may give a session now.
func (m *Manager) longestTTL() time.Duration {
	m.tenantMu.RLock()
	defer m.tenantMu.RUnlock()
	var d time.Duration
	for _, l := range m.cfg.Tenants {
		d = max(d, l.MaxTTL)
	}
	return d
}
