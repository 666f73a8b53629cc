package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/sandgate/sandgate/ids"
)

// normalize checks a spec against the tenant's limits and fills defaults.
func (m *Manager) normalize(spec *Spec) (*Runtime, error) {
	lim, ok := m.Limits(spec.Tenant)
	if !ok {
		return nil, publicf(ErrNotFound, "unknown tenant", nil)
	}
	return normalizeFor(spec, lim, m.runtimes, m.cfg.DefaultRuntime, m.net == nil && m.cfg.ProxyURL == "", m.backend)
}

// normalizeFor is normalize with the tenant's limits, the runtimes (as
// Offered gives them) and the default, and whether no egress proxy
// serves the sessions of backend (noProxy).
func normalizeFor(spec *Spec, lim TenantLimits, runtimes map[string]*Runtime, defaultRuntime string, noProxy bool, backend Backend) (*Runtime, error) {
	rt, err := normalizeShape(spec, runtimes, defaultRuntime)
	if err != nil {
		return nil, err
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
	if noProxy && (len(spec.Egress.Allow) > 0 || len(spec.Egress.Credentials) > 0) {
		// Nothing here would enforce them: say so rather than pretend.
		return nil, publicf(ErrInvalid, fmt.Sprintf("egress allow lists and credential bindings need an egress proxy, which this gateway does not serve under the %s backend (egress.listen); a session reaches what the cluster's NetworkPolicy allows", backend.Name()), nil)
	}
	if len(spec.Labels) > 32 {
		return nil, publicf(ErrInvalid, "at most 32 labels", nil)
	}
	for k, v := range spec.Labels {
		if k == "" || len(k) > 63 || len(v) > 256 {
			return nil, publicf(ErrInvalid, "label keys must be 1-63 bytes and values at most 256 bytes", nil)
		}
	}
	// The session is kept in containerd labels, which hold at most
	// maxLabelBytes each: a request too large for them is refused here,
	// not when the container (or a warm session's claim) is written.
	labels, err := containerLabels(Info{Kind: spec.Kind, Runtime: rt.Name, Resources: spec.Resources, Screen: spec.Screen,
		Record: spec.Record, Labels: spec.Labels, Egress: spec.Egress, Start: StartCold, IdleTimeout: int(spec.IdleTimeout.Seconds())}, "255.255.255.255")
	if err != nil {
		return nil, publicf(ErrInvalid, "the request cannot be stored", err)
	}
	for k, v := range labels {
		if len(k)+len(v) > maxLabelBytes {
			return nil, publicf(ErrInvalid, fmt.Sprintf("labels, allow list and credential bindings together are too large to store (%d bytes, at most %d)", len(k)+len(v), maxLabelBytes), nil)
		}
	}
	return rt, nil
}

// maxLabelBytes is containerd's bound on one label, key and value (4096),
// less room for the fields a claim or an extension changes.
const maxLabelBytes = 4000

// normalizeShape checks and fills what a session is started with: kind,
// runtime, resources and screen (a warm pool's shape).
func (m *Manager) normalizeShape(spec *Spec) (*Runtime, error) {
	return normalizeShape(spec, m.runtimes, m.cfg.DefaultRuntime)
}

// normalizeShape is Manager.normalizeShape with the runtimes (as
// Offered gives them) and the default.
func normalizeShape(spec *Spec, runtimes map[string]*Runtime, defaultRuntime string) (*Runtime, error) {
	switch spec.Kind {
	case "":
		spec.Kind = KindBrowser
	case KindBrowser, KindDesktop:
	default:
		return nil, publicf(ErrInvalid, fmt.Sprintf("kind %q is not one of browser, desktop", spec.Kind), nil)
	}
	if spec.Runtime == "" {
		spec.Runtime = defaultRuntime
		if spec.Runtime == "" {
			return nil, publicf(ErrUnavailableRuntime, "no isolating runtime is usable on this gateway; name a runtime explicitly", nil)
		}
	}
	rt, ok := runtimes[spec.Runtime]
	if !ok {
		return nil, publicf(ErrInvalid, fmt.Sprintf("runtime %q is not one of kata, gvisor, runc", spec.Runtime), nil)
	}
	if !rt.Usable {
		return nil, publicf(ErrUnavailableRuntime, fmt.Sprintf("runtime %q is not usable on this gateway: %s", rt.Name, rt.Reason), nil)
	}
	r := &spec.Resources
	if r.CPUs == 0 {
		r.CPUs = DefaultCPUs
	}
	if r.MemoryMB == 0 {
		r.MemoryMB = DefaultMemoryMB
	}
	if r.Pids == 0 {
		r.Pids = DefaultPids
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
		sc.Width, sc.Height = DefaultScreenWidth, DefaultScreenHeight
	}
	if sc.Width < 320 || sc.Width > 3840 || sc.Height < 240 || sc.Height > 2160 {
		return nil, publicf(ErrInvalid, "screen must be between 320x240 and 3840x2160", nil)
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
	if err := m.checkDisk(); err != nil {
		return Info{}, err
	}
	// The profile first: a create waiting for it holds no share of the
	// tenant's quotas meanwhile.
	held := time.Now()
	releaseProfile, err := m.holdProfile(ctx, spec)
	if err != nil {
		return Info{}, err
	}
	// One wait for both: what the profile took is not waited again.
	spec.Wait = max(spec.Wait-time.Since(held), 0)
	handed := false // to the session, which drops it when it ends
	defer func() {
		if !handed {
			releaseProfile()
		}
	}()
	r, err := m.reserve(ctx, spec.Tenant, spec.Resources, spec.Record, spec.Wait)
	if err != nil {
		return Info{}, err
	}
	// Dropped once the session counts by itself; at once on failure.
	defer m.release(r)
	// Under way until answered (or, without wait, started): Drain waits.
	background := false
	defer func() {
		if !background {
			m.createDone()
		}
	}()
	t0 := time.Now()
	handed = true // from here on the session or the warm claim drops it
	if info, ok, err := m.createWarm(ctx, spec, t0, r, releaseProfile); ok || err != nil {
		return info, err
	}
	info := coldInfo(spec, rt)
	// The start belongs to the manager; a waiting caller that hangs up
	// cancels it (the create rolls back).
	startCtx, cancel := context.WithTimeout(m.base, m.cfg.ReadyTimeout+30*time.Second)
	s := newSess(info)
	s.cancel = cancel

	m.mu.Lock()
	if m.disabled(spec.Tenant) { // disabled while this create was admitted
		m.mu.Unlock()
		cancel()
		releaseProfile()
		return Info{}, errTenantDisabled
	}
	s.releaseProfile = releaseProfile
	m.sessions[info.ID] = s
	m.releaseLocked(r)
	s.trail = m.liveTrail(info.Tenant, info.ID, true)
	s.record("created", m.createdFields(info))
	m.mu.Unlock()

	log := m.log.With("session", info.ID, "tenant", info.Tenant, "runtime", rt.Name)
	if !wait {
		background = true
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			defer m.createDone()
			defer cancel()
			if err := m.start(startCtx, s, rt, log); err != nil {
				log.Error("session start failed", "err", err)
			} else {
				m.stopIfDisabled(s)
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
		// What the backend refused for the request's sake keeps its
		// class (a runtime the cluster no longer has: 422).
		var pe *PublicError
		if errors.As(err, &pe) && (errors.Is(pe.Class, ErrInvalid) || errors.Is(pe.Class, ErrUnavailableRuntime)) {
			return Info{}, pe
		}
		return Info{}, publicf(ErrUnavailable, "the session could not be started: "+m.snapshot(s).Failure, err)
	}
	if m.stopIfDisabled(s) {
		return Info{}, errTenantDisabled
	}
	return m.snapshot(s), nil
}

// coldInfo is the session a cold start of spec under rt makes, as it
// begins.
func coldInfo(spec Spec, rt *Runtime) Info {
	now := time.Now().UTC()
	info := Info{
		ID: ids.NewSession(), Tenant: spec.Tenant, Kind: spec.Kind, Runtime: rt.Name, Isolation: rt.Isolation,
		State: StateStarting, CreatedAt: now, ExpiresAt: now.Add(spec.TTL),
		IdleTimeout: int(spec.IdleTimeout.Seconds()), Resources: spec.Resources, Screen: spec.Screen,
		Record: spec.Record, Labels: spec.Labels, Egress: spec.Egress, Start: StartCold,
		Profile: spec.Profile, Snapshot: spec.Snapshot,
	}
	if info.Labels == nil {
		info.Labels = map[string]string{}
	}
	return info
}

// stopIfDisabled stops a session that finished starting after its
// tenant was disabled (StopTenant had not seen it running).
func (m *Manager) stopIfDisabled(s *sess) bool {
	if !m.disabled(s.info.Tenant) {
		return false
	}
	m.mu.Lock()
	s.record("stop_requested", map[string]any{"reason": "the tenant was disabled"})
	m.mu.Unlock()
	m.stop(m.base, s, StateStopped, "")
	return true
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
		m.stopping(id)
		for i := len(undo) - 1; i >= 0; i-- {
			if uerr := undo[i](cctx); uerr != nil {
				log.Error("rollback step failed", "err", uerr)
			}
		}
		m.mu.Lock()
		failure := s.info.Failure
		if failure == "" {
			failure = failureText(ctx, err)
		}
		closeConns(s, "")
		m.mu.Unlock()
		m.settle(s, StateFailed, failure)
	}()

	// Where the seconds of a start go, as the gateway sees them: network,
	// container and task follow each other; vnc and cdp are waited for
	// together and count from the task's start.
	steps := map[string]any{}
	last := t0
	step := func(name string) {
		now := time.Now()
		steps[name] = now.Sub(last).Milliseconds()
		last = now
	}
	m.mu.Lock()
	info := s.info
	m.mu.Unlock()
	host := Host{Env: m.sessionEnv(info), Step: step}
	if lim, ok := m.Limits(info.Tenant); ok {
		host.Deadline = info.CreatedAt.Add(lim.MaxTTL)
	} else if m.net == nil {
		// A pooled session has no tenant yet: it may wait its pool's
		// longest, then run any tenant's longest.
		host.Deadline = info.CreatedAt.Add(m.poolLimits.MaxAge + m.longestTTL())
	}
	var addr netip.Addr
	if m.net != nil {
		// The containerd backend's network and workspace, made here.
		if addr, err = m.net.create(ctx, id); err != nil {
			return err
		}
		step("network")
		m.mu.Lock()
		s.addr = addr
		m.byAddr[addr] = s
		m.mu.Unlock()
		undo = append(undo, func(c context.Context) error { return m.net.remove(c, id) })
		undo = append(undo, func(context.Context) error { return m.removeWorkspace(id) })
		if host.Workspace, host.Console, err = m.makeWorkspace(id); err != nil {
			return fmt.Errorf("workspace: %w", err)
		}
		host.NetNS = m.net.nsPath(id)
	}
	record, err := containerLabels(info, addrString(addr))
	if err != nil {
		return err
	}
	if !m.sharedRecords() {
		delete(record, labelState) // nobody reads it (markState)
	}
	if s.pool != nil {
		record[labelPool] = s.pool.key()
	}
	sb, exited, err := m.backend.Create(ctx, info, rt, record, host)
	if err != nil {
		return err
	}
	undo = append(undo, sb.Remove)
	if m.net == nil {
		// The backend's network: the sandbox's own address.
		if addr = sb.Addr(); !addr.IsValid() {
			return fmt.Errorf("the %s backend gave the sandbox no address", m.backend.Name())
		}
		m.mu.Lock()
		s.addr = addr
		stale := m.byAddr[addr]
		m.byAddr[addr] = s
		m.mu.Unlock()
		if stale != nil && stale != s {
			// The backend gave this sandbox an address another session
			// still holds here: that one's sandbox is gone, whatever its
			// state says. It stops, so that nothing takes this one for it.
			m.log.Warn("a new sandbox has the address of a live session; stopping that one", "session", stale.info.ID, "new", id, "addr", addr)
			m.stopAsync(stale, StateFailed, "its sandbox's address went to another")
		}
	}
	ep := endpointOf(addr)
	// A browser that waits for its profile answers CDP after the restore.
	ready, version, err := waitReady(ctx, ep, info.Kind == KindBrowser && info.Profile == nil, exited, m.cfg.ReadyTimeout)
	ep.Version = version
	if err != nil {
		return err
	}
	for name, d := range ready {
		steps[name] = d.Milliseconds()
	}
	if info.Profile != nil || info.Snapshot != "" {
		last = time.Now()
		if ep.Version, err = m.restore(ctx, info, sb, ep); err != nil {
			return err
		}
		step("restore")
	}
	m.mu.Lock()
	o, pooled := m.observer, s.pool != nil
	m.mu.Unlock()
	if eo, ok := o.(EarlyObserver); ok && pooled && !m.poolLimits.Freeze {
		// Before the session can be claimed: what needs no tenant starts
		// now, so a claim does not wait for it.
		eo.SessionPooled(copyInfo(info), ep)
	}
	m.mu.Lock()
	if s.info.State != StateStarting {
		m.mu.Unlock()
		return errors.New("session was stopped while starting")
	}
	s.info.State = StateRunning
	took := time.Since(t0)
	s.record("started", map[string]any{"took_ms": took.Milliseconds(), "steps_ms": steps})
	s.ep = ep
	s.box = sb
	s.lastActive = time.Now()
	s.cancel = nil
	m.mu.Unlock()
	log.Info("session running", "addr", addr.String(), "took", took.Round(time.Millisecond), "steps_ms", steps)
	m.markRunning(s, sb)
	m.wg.Add(1)
	go m.watch(s, exited)
	m.mu.Lock()
	o, info, pooled = m.observer, copyInfo(s.info), s.pool != nil
	m.mu.Unlock()
	if o != nil && !pooled {
		o.SessionRunning(info, ep)
	}
	return nil
}

// createWarm hands out a pooled session when spec fits a pool that has
// one; ok false sends the caller down the cold path.
func (m *Manager) createWarm(ctx context.Context, spec Spec, t0 time.Time, r *reservation, releaseProfile func()) (Info, bool, error) {
	m.mu.Lock()
	p := m.fitting(spec)
	if p == nil {
		m.mu.Unlock()
		return Info{}, false, nil
	}
	s := m.takePooled(p, spec.Tenant)
	if s == nil {
		p.misses++
	} else {
		// The claim counts against the tenant now, in the reservation's
		// stead.
		r.claiming = true
	}
	m.mu.Unlock()
	if s == nil {
		m.kickRefill()
		return Info{}, false, nil
	}
	return m.claim(ctx, s, spec, t0, r, releaseProfile)
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

// maxVersionBytes bounds the /json/version answer kept at readiness
// (Chromium's is under 1 KiB).
const maxVersionBytes = 16 << 10

// addrString is an address as the session's record keeps it; empty
// when the backend records it itself.
func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

func endpointOf(a netip.Addr) Endpoint {
	return Endpoint{Addr: a, CDP: netip.AddrPortFrom(a, CDPPort), VNC: netip.AddrPortFrom(a, VNCPort)}
}

// waitReady polls until the VNC server accepts connections and, for
// browser sessions, Chromium answers CDP discovery. It returns how long
// each took to become true ("vnc", "cdp"), counted from its call, and
// Chromium's answer (nil if it was over maxVersionBytes).
func waitReady(ctx context.Context, ep Endpoint, needCDP bool, exited <-chan Exit, limit time.Duration) (map[string]time.Duration, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	t0 := time.Now()
	ready := map[string]time.Duration{}
	var version []byte
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		if _, ok := ready["vnc"]; !ok {
			var d net.Dialer
			if c, err := d.DialContext(ctx, "tcp", ep.VNC.String()); err == nil {
				c.Close()
				ready["vnc"] = time.Since(t0)
			}
		}
		if _, ok := ready["cdp"]; needCDP && !ok {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ep.CDP.String()+"/json/version", nil)
			// As the gateway asks, so that the answer kept is one it reads.
			req.Host = CDPHost
			if resp, err := client.Do(req); err == nil {
				body, err := io.ReadAll(io.LimitReader(resp.Body, maxVersionBytes+1))
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ready["cdp"] = time.Since(t0)
					if err == nil && len(body) <= maxVersionBytes {
						version = body
					}
				}
			}
		}
		if _, ok := ready["vnc"]; ok {
			if _, ok := ready["cdp"]; ok || !needCDP {
				return ready, version, nil
			}
		}
		select {
		case st := <-exited:
			return nil, nil, publicf(ErrUnavailable, fmt.Sprintf("the session exited while starting (status %d)", st.Code), nil)
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("waiting for CDP and VNC: %w", ctx.Err())
		case <-time.After(readyPoll):
		}
	}
}

// readyPoll is how often waitReady asks: what it waits for is every
// session start's last step, so each tick is time a client waits for
// nothing, and a refused connection costs next to nothing.
const readyPoll = 5 * time.Millisecond

// watch marks a session failed when its processes exit on their own.
// A wait that ends because containerd went away (a restart: the task
// runs on under its shim) is taken up again once containerd answers.
func (m *Manager) watch(s *sess, exited <-chan Exit) {
	defer m.wg.Done()
	for {
		select {
		case st := <-exited:
			if err := st.Err; err != nil && m.base.Err() == nil {
				m.log.Warn("lost the wait on the session's task; taking it up again when containerd answers", "session", s.info.ID, "err", err)
				ch, rerr := m.rewait(s)
				if rerr == nil {
					m.log.Info("session's task wait taken up again", "session", s.info.ID)
					m.mu.Lock()
					s.record("containerd_reconnected", nil)
					m.mu.Unlock()
					exited = ch
					continue
				}
				m.log.Warn("the session's task is gone", "session", s.info.ID, "err", rerr)
			}
			m.mu.Lock()
			running := s.info.State == StateRunning
			m.mu.Unlock()
			if running {
				msg := fmt.Sprintf("the session's processes exited (status %d)", st.Code)
				if st.Err != nil {
					msg = "the session's task was lost while containerd was away"
				}
				m.log.Warn("session exited", "session", s.info.ID, "status", st.Code)
				m.stop(m.base, s, StateFailed, msg)
			}
			return
		case <-s.done:
			return
		case <-m.base.Done():
			return
		}
	}
}

// rewaitFor bounds how long a watch waits for containerd to come back.
const rewaitFor = 2 * time.Minute

// rewait waits until containerd answers again and returns a new wait on
// the session's task, or an error when the task is gone or containerd
// stays away.
func (m *Manager) rewait(s *sess) (<-chan Exit, error) {
	m.mu.Lock()
	sb := s.box
	m.mu.Unlock()
	deadline := time.Now().Add(rewaitFor)
	delay := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(m.base, 5*time.Second)
		_, err := sb.Running(ctx) // answers only once the backend does
		cancel()
		if err == nil {
			var ch <-chan Exit
			if ch, err = sb.Wait(m.base); err == nil {
				return ch, nil
			}
		}
		if errors.Is(err, ErrSandboxGone) {
			return nil, err
		}
		select {
		case <-s.done:
			return nil, errors.New("the session stopped")
		case <-m.base.Done():
			return nil, m.base.Err()
		case <-time.After(delay):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("containerd did not answer for %s: %w", rewaitFor, err)
		}
		delay = min(2*delay, 2*time.Second)
	}
}
