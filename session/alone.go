package session

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
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
// What it does not start alone: a create that waits in line for room
// (the line is the leader's: one that does not fit is refused at once),
// and one from a warm pool (the pools are the leader's: it starts
// cold). One that records, or starts from a snapshot or a profile, is
// started alone: its creator unpacks the snapshot, writes the profile
// in and places the recording with the replicas (in extra), as a
// leader would. A profile's hold is admitted by the records as the
// quota is (a session that writes its profile back holds it alone;
// those that only read it share it); a create that would wait for the
// profile to be free is not made (the wait is the leader's).

// RecordCreatedAlone, in a session's record, names the replica that
// created the session while no leader answered; the leader clears it as
// it adopts the session.
const RecordCreatedAlone = "sandgate.created-alone"

// RecordMade, in a record as a backend reads it, is when the backend
// made the sandbox, as the backend itself says (a Pod's creation time):
// not a value the record's writers set.
const RecordMade = "sandgate.sandbox-made"

// RecordAloneDue, in the record of a session created alone, is when its
// creator is done with its start at the latest (RFC 3339): a leader
// removes it if it is still starting then (its creator died).
const RecordAloneDue = "sandgate.alone-due"

// aloneSlack is how long past its ready timeout a create made alone may
// go on (the Pod's making, the trail, the record); aloneMargin how much
// earlier than its due time its creator gives up; aloneFinish what it
// keeps of that for the steps after extra (the trail, the gate, the
// record: 10, 5 and 10 s at most, a second or less as a rule), but
// extra has extraFloor at least.
const (
	aloneSlack  = 30 * time.Second
	aloneMargin = 10 * time.Second
	aloneFinish = 25 * time.Second
	extraFloor  = 15 * time.Second
)

// extraDue is when extra is done at the latest, called at now in a
// create due then: before aloneFinish, or after extraFloor from now
// if that is later, and before its creator gives up in any case.
func extraDue(due, now time.Time) time.Time {
	at := due.Add(-aloneMargin - aloneFinish)
	if floor := now.Add(extraFloor); floor.After(at) {
		at = floor
	}
	if last := due.Add(-aloneMargin); at.After(last) {
		at = last
	}
	return at
}

// maxAloneStart bounds how long after its sandbox was made a leader
// leaves a session starting alone to its creator, whatever its record
// says.
const maxAloneStart = 10 * time.Minute

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
	// Lock makes the admission exclusive among the creates made alone,
	// of every replica; unlock is called once the sandbox exists (or
	// the create failed before). lost says whether another create took
	// it over meanwhile (this one could not keep it): the create fails.
	Lock func(ctx context.Context) (unlock func(), lost func() bool, err error)
	// Records is every session's record, read fresh.
	Records func(ctx context.Context) ([]RecordSeen, error)
	// Update changes session id's record as a write conditional on what
	// change read of it, and whether its sandbox runs (not being
	// deleted).
	Update func(ctx context.Context, id string, change func(rec map[string]string, running bool) (map[string]string, error)) (map[string]string, bool, error)
	// Adopts says whether the last leader adopts sessions created alone
	// (a leader of an earlier version does not: creates wait for a
	// leader then).
	Adopts func(ctx context.Context) (bool, error)
	// Capacity is the leader's Config.MaxSessions (0: none).
	Capacity int
	Log      *slog.Logger
}

// Create starts a session for spec, of a tenant with the limits lim,
// under one of runtimes (as Offered gives them; def the default), and
// returns it running. extra, if set, is called with the session and its
// endpoint once it answers, before its trail is stored, within the
// start's deadline less what follows it (the trail and the record:
// aloneFinish), or extraFloor from its call if that is later: the
// events it returns (a snapshot's restore, a recording's start, a
// preview's issue) are stored with its first ones; its error fails the
// create. A browser started for a profile waits for it (its browser is
// held until the profile is in): extra writes the profile in, and waits
// for the browser (BrowserReady), as the leader's restore does.
func (a *Alone) Create(ctx context.Context, spec Spec, lim TenantLimits, runtimes map[string]*Runtime, def string, extra func(context.Context, Info, Endpoint) ([]Event, error)) (Info, error) {
	rt, err := normalizeFor(&spec, lim, runtimes, def, a.ProxyURL == "", a.Backend)
	if err != nil {
		return Info{}, err
	}
	if why := neverFits(lim, spec.Resources); why != "" {
		return Info{}, publicf(ErrInvalid, why, nil)
	}
	if spec.Profile != nil && extra == nil {
		return Info{}, errors.New("a session with a profile is created alone only with an extra that writes it in")
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	adopts, err := a.Adopts(actx)
	cancel()
	switch {
	case err != nil:
		return Info{}, &PublicError{Class: ErrUnavailable, Msg: "the gateway's lease could not be read; retry", Err: err, RetryAfter: 2}
	case !adopts:
		// (A rolling update: the next leader may be of that version.)
		return Info{}, &PublicError{Class: ErrUnavailable, Msg: "the last gateway replica to lead is of an earlier version: a create waits for a replica to lead; retry", RetryAfter: 2}
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
	unlock, lost, err := a.Lock(ctx)
	if err != nil {
		return Info{}, &PublicError{Class: ErrUnavailable, Msg: "the replicas' admission could not be taken; retry", Err: err, RetryAfter: 2}
	}
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	if err := a.admit(ctx, info, lim, spec.Wait > 0); err != nil {
		return Info{}, err
	}
	// From here on, the create is done by its due time, less a margin:
	// a leader removes the session if it still starts then.
	due := time.Now().Add(ready + aloneSlack)
	record[RecordAloneDue] = due.UTC().Format(time.RFC3339Nano)
	t0 := time.Now()
	lostLock := false
	steps := map[string]any{}
	last := t0
	host := Host{
		Env:      sandboxEnv(info, a.ProxyURL, a.Env),
		Deadline: info.CreatedAt.Add(lim.MaxTTL),
		Step: func(name string) {
			if locked {
				// The sandbox exists: its record counts from here on.
				locked = false
				lostLock = lost()
				unlock()
			}
			steps[name] = time.Since(last).Milliseconds()
			last = time.Now()
		},
	}
	startCtx, cancel := context.WithDeadline(ctx, due.Add(-aloneMargin))
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
		lostLock = lost()
		unlock()
	}
	fail := func(err error) (Info, error) {
		log.Error("session start failed (created while no leader answered)", "err", err)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if rerr := sb.Remove(rctx); rerr != nil {
			log.Error("removing the session's sandbox failed; a leader removes it once its start is overdue", "err", rerr, "due", due)
		}
		var pe *PublicError
		if errors.As(err, &pe) {
			return Info{}, pe
		}
		return Info{}, publicf(ErrUnavailable, "the session could not be started: "+failureText(startCtx, err), err)
	}
	if lostLock {
		// Another create may have counted without this one's Pod.
		return fail(&PublicError{Class: ErrUnavailable, Msg: "the replicas' admission was lost as the session was made; retry", RetryAfter: 2})
	}
	addr := sb.Addr()
	if !addr.IsValid() {
		return fail(fmt.Errorf("the %s backend gave the sandbox no address", a.Backend.Name()))
	}
	ep := endpointOf(addr)
	// A browser that waits for its profile answers CDP once extra has
	// written it in.
	waited, _, err := waitReady(startCtx, ep, info.Kind == KindBrowser && info.Profile == nil, exited, ready)
	if err != nil {
		return fail(err)
	}
	for name, d := range waited {
		steps[name] = d.Milliseconds()
	}
	took := time.Since(t0)
	var more []Event
	if extra != nil {
		xctx, cancel := context.WithDeadline(startCtx, extraDue(due, time.Now()))
		more, err = extra(xctx, info, ep)
		cancel()
		if err != nil {
			return fail(err)
		}
	}
	// The trail first: a leader adopts the session once it is marked
	// running, and reads the trail then.
	if err := a.storeTrail(startCtx, info, took, steps, more); err != nil {
		return fail(fmt.Errorf("store the session's audit trail: %w", err))
	}
	// The gate again: a leader of an earlier version that took over
	// meanwhile would never adopt the session.
	actx, cancel = context.WithTimeout(startCtx, 5*time.Second)
	adopts, err = a.Adopts(actx)
	cancel()
	if err != nil || !adopts {
		return fail(&PublicError{Class: ErrUnavailable, Msg: "the gateway's lease, read again as the session started, does not say that the next leader adopts it (one of an earlier version took the lead, or it could not be read): a create waits for a replica to lead; retry", Err: err, RetryAfter: 2})
	}
	if err := a.markRunning(startCtx, info.ID); err != nil {
		return fail(err)
	}
	info.State = StateRunning
	log.Info("session running (created while no leader answered)", "addr", addr.String(), "took", took.Round(time.Millisecond), "steps_ms", steps)
	return info, nil
}

// admit refuses a create that does not fit (ErrQuota), or whose profile
// another session holds (ErrConflict; ErrUnavailable for a create that
// would wait for it: waits asks for that), by the records as they are
// now.
func (a *Alone) admit(ctx context.Context, info Info, lim TenantLimits, waits bool) error {
	// (Well within the admission lease's hold, which is renewed all the
	// same.)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	seen, err := a.Records(rctx)
	if err != nil {
		return &PublicError{Class: ErrUnavailable, Msg: "the sessions could not be counted; retry", Err: err, RetryAfter: 2}
	}
	var u Usage
	creates, total := 0, 0
	now := time.Now()
	cut := now.Add(-time.Minute)
	retry, window := 30.0, 0.0
	profileHeld := false
	for _, r := range seen {
		held, err := InfoFromRecord(r.Record)
		if err != nil {
			continue // a pooled sandbox, or none of a session
		}
		total++
		if held.Tenant != info.Tenant {
			continue
		}
		if p, hp := info.Profile, held.Profile; p != nil && hp != nil && hp.ID == p.ID && (p.Persist || hp.Persist) {
			// (Stopping or not: a session holds its profile until it
			// is saved, its sandbox removed after that.)
			profileHeld = true
		}
		u.Hold(held.Resources, held.Record)
		if held.CreatedAt.After(cut) {
			creates++
			// The window has room once the oldest of them leaves it.
			if w := held.CreatedAt.Add(time.Minute).Sub(now).Seconds(); window == 0 || w < window {
				window = w
			}
		}
		retry = min(retry, held.ExpiresAt.Sub(now).Seconds())
	}
	if profileHeld {
		// The profile first, as the leader holds it before the quota.
		msg := fmt.Sprintf("profile %s is in use by another session (a session that writes a profile back holds it alone)", info.Profile.ID)
		if waits {
			return &PublicError{Class: ErrUnavailable, Msg: msg + "; a create that waits for it waits for a gateway replica to lead; retry", RetryAfter: 2}
		}
		return publicf(ErrConflict, msg+"; try again once it has ended, or set wait_seconds", nil)
	}
	why := fits(u, creates, lim, info.Resources, info.Record, total, a.Capacity)
	if why == "" {
		return nil
	}
	if lim.MaxCreatesPerMinute > 0 && creates >= lim.MaxCreatesPerMinute {
		retry = max(retry, window)
	}
	return &PublicError{Class: ErrQuota, Msg: "over quota: " + why, RetryAfter: int(max(1, math.Ceil(retry)))}
}

// storeTrail stores the session's first events as the first piece of
// its trail, as the leader's journal would have.
func (a *Alone) storeTrail(ctx context.Context, info Info, took time.Duration, steps map[string]any, more []Event) error {
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
	for _, ev := range more {
		if ev.Time.IsZero() {
			ev.Time = time.Now().UTC()
		}
		enc.Encode(ev)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if m, ok := a.Trails.(TrailMarker); ok && tag != "" {
		return m.PutScopedTrail(sctx, info.Tenant, info.ID, tag, 0, b.Bytes())
	}
	return a.Trails.PutTrail(sctx, info.Tenant, info.ID, 0, b.Bytes())
}

// markRunning stores the session's state, running, unless a stop was
// asked meanwhile (a delete by another replica) or its sandbox no
// longer runs (a leader removes it: it was overdue): the create fails,
// and its sandbox goes.
func (a *Alone) markRunning(ctx context.Context, id string) error {
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var refused error
	_, _, err := a.Update(mctx, id, func(rec map[string]string, running bool) (map[string]string, error) {
		switch {
		case !running:
			refused = publicf(ErrUnavailable, "the session's sandbox stopped as it started", nil)
		case State(rec[labelState]) != StateStarting:
			refused = publicf(ErrConflict, "the session was deleted while it started", nil)
		default:
			return map[string]string{labelState: string(StateRunning)}, nil
		}
		return nil, refused
	})
	if refused != nil {
		return refused
	}
	return err
}

// startingAlone says whether rec is of a session a replica created
// while no leader answered and may still be starting (its due time, as
// its record says it, bounded by maxAloneStart from the making of its
// sandbox), and when it is due: the leader leaves it to its creator
// until it runs (then adopts it) or is overdue (then removes it).
func (m *Manager) startingAlone(rec map[string]string, now time.Time) (time.Time, bool) {
	if rec[RecordCreatedAlone] == "" || State(rec[labelState]) != StateStarting {
		return time.Time{}, false
	}
	due, err := time.Parse(time.RFC3339Nano, rec[RecordAloneDue])
	if err != nil {
		return time.Time{}, false
	}
	// Not trusted past what a create may take, counted from when the
	// backend says it made the sandbox (the rest of a record is anyone's
	// with the API's rights), or else from its creation as the record
	// says.
	made, err := time.Parse(time.RFC3339Nano, rec[RecordMade])
	if err != nil {
		if made, err = time.Parse(time.RFC3339Nano, rec[labelCreated]); err != nil {
			return time.Time{}, false
		}
	}
	if due.After(made.Add(maxAloneStart)) {
		return time.Time{}, false
	}
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
	if !ok {
		return
	}
	// Under mu, as Close cancels base: a Close under way waits for it,
	// or it sees base ended.
	m.mu.Lock()
	if m.base.Err() != nil {
		m.mu.Unlock()
		return
	}
	m.wg.Add(1)
	m.mu.Unlock()
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

// overdueAlone looks at a session startingAlone once it is due (its
// record says when): one that runs by then is adopted (should its
// record's change have been missed), one still starting is removed (its
// creator died), as takeOver removes what it cannot adopt. One look is
// due per session at a time.
func (m *Manager) overdueAlone(id string) {
	f, ok := m.backend.(SandboxFinder)
	if !ok {
		return
	}
	m.mu.Lock()
	if m.overdue == nil {
		m.overdue = map[string]bool{}
	}
	if m.overdue[id] || m.base.Err() != nil {
		m.mu.Unlock()
		return
	}
	m.overdue[id] = true
	m.mu.Unlock()
	var look func()
	failed := 0 // reads of the record the API server did not answer, in a row
	look = func() {
		if m.base.Err() != nil {
			return
		}
		ctx, cancel := context.WithTimeout(m.base, 30*time.Second)
		defer cancel()
		rec, err := f.Sandbox(id).Record(ctx)
		gone := errors.Is(err, ErrSandboxGone)
		switch {
		case gone, errors.Is(err, ErrRecordUnreadable):
			// (One that cannot be read is removed by takeOver.)
		case err != nil:
			// Asked again, less often: the API server may be away.
			failed++
			time.AfterFunc(min(time.Duration(failed)*10*time.Second, time.Minute), look)
			return
		case err == nil:
			if due, starting := m.startingAlone(rec, time.Now()); starting {
				failed = 0
				time.AfterFunc(min(time.Until(due), maxAloneStart)+time.Second, look)
				return
			}
		}
		m.mu.Lock()
		delete(m.overdue, id)
		m.mu.Unlock()
		if gone {
			m.dropAloneHold(id)
			return
		}
		m.adoptCreatedAlone(id)
	}
	go look()
}

// holdStartingAlone takes the profile hold of session id, which a
// replica starts alone (rec is its record), as the hold of a create of
// this manager's own: nothing this leader admits takes the profile from
// it meanwhile (the replica admitted it by the records, which hold no
// create of a leader's before its sandbox exists). It is the session's
// once adopted (takeOver), and dropped if the session is not
// (dropAloneHold).
func (m *Manager) holdStartingAlone(id string, rec map[string]string) {
	if _, ok := m.backend.(SandboxFinder); !ok {
		return // (nothing would look at it again to drop the hold)
	}
	info, err := InfoFromRecord(rec)
	if err != nil || info.Profile == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.aloneHolds[id] != nil || m.sessions[id] != nil {
		return
	}
	if !m.takeProfileLocked(info.Tenant, info.Profile) {
		// Taken by a session of this leader's before this one was
		// seen (a partition between the two): the replica's admission
		// could not see that hold.
		m.log.Warn("a session a replica starts alone takes a profile that a session of this gateway holds", "session", id, "profile", info.Profile.ID)
		return
	}
	if m.aloneHolds == nil {
		m.aloneHolds = map[string]func(){}
	}
	tenant, use := info.Tenant, *info.Profile
	m.aloneHolds[id] = func() { m.dropProfileLocked(tenant, &use) }
}

// dropAloneHold drops the profile hold holdStartingAlone took for
// session id, if it holds one.
func (m *Manager) dropAloneHold(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if drop := m.aloneHolds[id]; drop != nil {
		delete(m.aloneHolds, id)
		drop()
	}
}
