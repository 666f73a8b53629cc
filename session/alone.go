package session

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Creating a session while no leader answers: a replica that stands by
// (under a backend whose sandboxes hold the sessions' records, where
// every replica reads them: Kubernetes) starts the session itself, as
// the leader would, and the leader that answers next adopts it
// (adoptCreatedAlone) as it adopts those of a leader that died.
//
// What it admits by is the backend's records, read fresh (not a watch's
// cache), under a lock the replicas share (Alone.Lock): a create counts
// from the moment its sandbox exists, so two replicas creating alone at
// once cannot both take the tenant's last slot. A leader admits by its
// own counts and does not take that lock: while one leads and a replica
// that cannot reach it creates alone (a partition between them, or the
// moment a new leader takes over), the tenant may get a session past
// its quota, until the leader adopts it.
//
// What it does not start alone (these wait for a leader, with a 503):
// a create that waits in line for room (the line is the leader's), one
// from a warm pool (the pools are the leader's), one that records (the
// recordings are placed by the leader), and one with a profile or a
// snapshot (their holds and restores are the leader's).

// RecordCreatedAlone, in a session's record, names the replica that
// created the session while no leader answered; the leader clears it as
// it adopts the session.
const RecordCreatedAlone = "sandgate.created-alone"

// aloneSlack is how long past its ready timeout a session created alone
// may stay starting before a leader takes it for what its creator (dead
// since) left, and removes it.
const aloneSlack = 30 * time.Second

// Alone creates sessions for a replica that stands by.
type Alone struct {
	Backend Backend
	// Identity is the replica's, written in each session's record
	// (RecordCreatedAlone).
	Identity string
	// ReadyTimeout bounds a start, as the leader's Config.ReadyTimeout
	// (60 s when 0).
	ReadyTimeout time.Duration
	// ProxyURL and Env are the leader's Config.ProxyURL and Config.Env.
	ProxyURL string
	Env      func(Info) []string
	// Trails stores the created and started events, where the leader
	// that adopts the session reads them (nil: not stored). Scope is
	// the leader's Config.Scope.
	Trails TrailStore
	Scope  string
	// Lock makes the admission exclusive among the replicas; unlock is
	// called once the sandbox exists (or the create failed before).
	Lock func(ctx context.Context) (unlock func(), err error)
	// Records is every session's record, read fresh.
	Records func(ctx context.Context) ([]RecordSeen, error)
	// Capacity is the leader's Config.MaxSessions (0: none).
	Capacity int
	Log      *slog.Logger
}

// Create starts a session for spec, of a tenant with the limits lim,
// under one of runtimes (as Offered gives them; def the default), and
// returns it running.
func (a *Alone) Create(ctx context.Context, spec Spec, lim TenantLimits, runtimes map[string]*Runtime, def string) (Info, error) {
	rt, err := normalizeFor(&spec, lim, runtimes, def, a.ProxyURL == "", a.Backend)
	if err != nil {
		return Info{}, err
	}
	if why := neverFits(lim, spec.Resources); why != "" {
		return Info{}, publicf(ErrInvalid, why, nil)
	}
	ready := a.ReadyTimeout
	if ready == 0 {
		ready = 60 * time.Second
	}
	info := coldInfo(spec, rt)
	record, err := containerLabels(info, "")
	if err != nil {
		return Info{}, err
	}
	record[RecordCreatedAlone] = a.Identity
	log := a.Log.With("session", info.ID, "tenant", info.Tenant, "runtime", rt.Name)

	log.Info("creating a session while no leader answers")
	unlock, err := a.Lock(ctx)
	if err != nil {
		return Info{}, &PublicError{Class: ErrUnavailable, Msg: "the replicas' admission could not be taken; retry", Err: err, RetryAfter: 2}
	}
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	if err := a.admit(ctx, info, lim); err != nil {
		return Info{}, err
	}
	t0 := time.Now()
	steps := map[string]any{}
	last := t0
	host := Host{
		Env:      sandboxEnv(info, a.ProxyURL, a.Env),
		Deadline: info.CreatedAt.Add(lim.MaxTTL),
		Step: func(name string) {
			if locked {
				// The sandbox exists: its record counts from here on.
				locked = false
				unlock()
			}
			steps[name] = time.Since(last).Milliseconds()
			last = time.Now()
		},
	}
	startCtx, cancel := context.WithTimeout(ctx, ready+aloneSlack)
	defer cancel()
	sb, exited, err := a.Backend.Create(startCtx, info, rt, record, host)
	if err != nil {
		log.Error("session start failed (created while no leader answered)", "err", err)
		var pe *PublicError
		if errors.As(err, &pe) && (errors.Is(pe.Class, ErrInvalid) || errors.Is(pe.Class, ErrUnavailableRuntime)) {
			return Info{}, pe
		}
		return Info{}, publicf(ErrUnavailable, "the session could not be started: "+failureText(startCtx, err), err)
	}
	if locked {
		locked = false
		unlock()
	}
	fail := func(err error) (Info, error) {
		log.Error("session start failed (created while no leader answered)", "err", err)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if rerr := sb.Remove(rctx); rerr != nil {
			log.Error("removing the session's sandbox failed; the leader removes it once its start is overdue", "err", rerr)
		}
		var pe *PublicError
		if errors.As(err, &pe) {
			return Info{}, pe
		}
		if ctx.Err() != nil {
			return Info{}, fmt.Errorf("client went away: %w", ctx.Err())
		}
		return Info{}, publicf(ErrUnavailable, "the session could not be started: "+failureText(startCtx, err), err)
	}
	addr := sb.Addr()
	if !addr.IsValid() {
		return fail(fmt.Errorf("the %s backend gave the sandbox no address", a.Backend.Name()))
	}
	waited, _, err := waitReady(startCtx, endpointOf(addr), info.Kind == KindBrowser, exited, ready)
	if err != nil {
		return fail(err)
	}
	for name, d := range waited {
		steps[name] = d.Milliseconds()
	}
	took := time.Since(t0)
	// The trail first: a leader adopts the session once it is marked
	// running, and reads the trail then.
	if err := a.storeTrail(ctx, info, took, steps); err != nil {
		return fail(fmt.Errorf("store the session's audit trail: %w", err))
	}
	if err := a.markRunning(ctx, sb); err != nil {
		return fail(err)
	}
	info.State = StateRunning
	log.Info("session running (created while no leader answered)", "addr", addr.String(), "took", took.Round(time.Millisecond), "steps_ms", steps)
	return info, nil
}

// admit refuses a create that does not fit (ErrQuota), by the records
// as they are now.
func (a *Alone) admit(ctx context.Context, info Info, lim TenantLimits) error {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	seen, err := a.Records(rctx)
	if err != nil {
		return &PublicError{Class: ErrUnavailable, Msg: "the sessions could not be counted; retry", Err: err, RetryAfter: 2}
	}
	var u Usage
	creates, total := 0, 0
	cut := time.Now().Add(-time.Minute)
	retry := 30.0
	for _, r := range seen {
		held, err := InfoFromRecord(r.Record)
		if err != nil {
			continue // a pooled sandbox, or none of a session
		}
		total++
		if held.Tenant != info.Tenant {
			continue
		}
		u.Hold(held.Resources, held.Record)
		if held.CreatedAt.After(cut) {
			creates++
		}
		retry = min(retry, time.Until(held.ExpiresAt).Seconds())
	}
	if why := fits(u, creates, lim, info.Resources, info.Record, total, a.Capacity); why != "" {
		return &PublicError{Class: ErrQuota, Msg: "over quota: " + why, RetryAfter: int(max(1, min(30, retry)))}
	}
	return nil
}

// storeTrail stores the session's first events as the first piece of
// its trail, as the leader's journal would have.
func (a *Alone) storeTrail(ctx context.Context, info Info, took time.Duration, steps map[string]any) error {
	if a.Trails == nil {
		return nil
	}
	created := map[string]any{"kind": info.Kind, "runtime": info.Runtime, "record": info.Record,
		"created_by": "a gateway replica, while none led"}
	tag := scopeTagOf(a.Scope)
	if tag != "" {
		created["scope"] = tag
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.Encode(Event{Time: info.CreatedAt, Type: "created", Fields: created})
	enc.Encode(Event{Time: time.Now().UTC(), Type: "started", Fields: map[string]any{"took_ms": took.Milliseconds(), "steps_ms": steps}})
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if m, ok := a.Trails.(TrailMarker); ok && tag != "" {
		return m.PutScopedTrail(sctx, info.Tenant, info.ID, tag, 0, b.Bytes())
	}
	return a.Trails.PutTrail(sctx, info.Tenant, info.ID, 0, b.Bytes())
}

// markRunning stores the session's state, running, unless a stop was
// asked meanwhile (a delete by another replica): the leader that adopts
// it carries the stop out, and the create is answered with a conflict.
func (a *Alone) markRunning(ctx context.Context, sb Sandbox) error {
	u, ok := sb.(RecordUpdater)
	if !ok {
		return fmt.Errorf("the %s backend's records cannot be changed by a conditional write", a.Backend.Name())
	}
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stopped := false
	_, err := u.UpdateRecord(mctx, func(rec map[string]string) (map[string]string, error) {
		stopped = State(rec[labelState]) != StateStarting
		if stopped {
			return nil, nil
		}
		return map[string]string{labelState: string(StateRunning)}, nil
	})
	switch {
	case err != nil:
		return err
	case stopped:
		return publicf(ErrConflict, "the session was deleted while it started", nil)
	}
	return nil
}

// startingAlone says whether rec is of a session a replica created
// while no leader answered and may still be starting (by its creation,
// with the manager's ready timeout): the leader leaves it to its creator
// until it runs (then adopts it) or is overdue (then removes it).
func (m *Manager) startingAlone(rec map[string]string, now time.Time) (time.Time, bool) {
	if rec[RecordCreatedAlone] == "" || State(rec[labelState]) != StateStarting {
		return time.Time{}, false
	}
	created, err := time.Parse(time.RFC3339Nano, rec[labelCreated])
	if err != nil {
		return time.Time{}, false
	}
	due := created.Add(m.cfg.ReadyTimeout + aloneSlack + 10*time.Second)
	return due, now.Before(due)
}

// whyStartingAlone is adopt's reason for a session startingAlone.
const whyStartingAlone = "being started by a gateway replica"

// SandboxFinder is a Backend that finds one sandbox by its session's
// id, without a list of all.
type SandboxFinder interface {
	Sandbox(id string) Sandbox
}

// adoptCreatedAlone takes over a session a replica created while no
// leader answered, once its record says it runs (or that a stop was
// asked as it started), apart from the caller: as recover does at the
// start, and told to the observer as a fresh session's start is.
func (m *Manager) adoptCreatedAlone(id string) {
	f, ok := m.backend.(SandboxFinder)
	if !ok || m.base.Err() != nil {
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		ctx, cancel := context.WithTimeout(m.base, time.Minute)
		defer cancel()
		if !m.takeOver(ctx, f.Sandbox(id)) {
			return
		}
		m.mu.Lock()
		s, o := m.sessions[id], m.observer
		if s == nil || o == nil || s.told || s.info.State != StateRunning {
			m.mu.Unlock()
			return
		}
		s.told = true
		info, ep := copyInfo(s.info), s.ep
		m.mu.Unlock()
		o.SessionRunning(info, ep)
	}()
}

// overdueAlone looks at a session startingAlone again once it is due:
// one that runs by then is adopted (should its record's change have
// been missed), one still starting is removed (its creator died), as
// takeOver removes what it cannot adopt.
func (m *Manager) overdueAlone(id string) {
	f, ok := m.backend.(SandboxFinder)
	if !ok {
		return
	}
	var look func()
	look = func() {
		if m.base.Err() != nil {
			return
		}
		ctx, cancel := context.WithTimeout(m.base, 30*time.Second)
		defer cancel()
		rec, err := f.Sandbox(id).Record(ctx)
		if err != nil {
			if !errors.Is(err, ErrSandboxGone) {
				// Asked again: the store may be away a moment.
				time.AfterFunc(10*time.Second, look)
			}
			return
		}
		if due, starting := m.startingAlone(rec, time.Now()); starting {
			time.AfterFunc(time.Until(due), look)
			return
		}
		m.adoptCreatedAlone(id)
	}
	time.AfterFunc(m.cfg.ReadyTimeout+aloneSlack+11*time.Second, look)
}
