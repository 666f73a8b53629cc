package kube

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	coordlisters "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/client-go/tools/cache"
)

// Shared spreads one kind of work on sessions (their recordings) over a
// namespace's gateway replicas, each piece owned by one replica through a
// Lease of its own. The replica that leads places a piece (Place): a
// lease that nobody holds, with what the work needs in its annotations.
// Every replica, the leader and those standing by, looks for such leases
// and takes one while it has room; one that holds fewer waits less, so
// the work spreads. The holder renews its lease while it works. When it
// dies, its lease runs out and another replica takes the work over. When
// the session ends, the leader asks for the work to stop (Collect): the
// holder stops, stores what it has, writes its result on the lease and
// gives it back; the leader then removes the lease.
//
// The holder reports to the leader through the lease too: that the work
// has begun (Ready) and what happened on the way (Note), which the
// leader adds to the session's audit trail.
type Shared struct {
	leases *Leases
	kind   string
	run    func(ctx context.Context, w Work) string
	log    *slog.Logger

	mu      sync.Mutex
	held    map[string]*heldWork   // by lease name
	placed  map[string]*placedWork // by lease name: placed here, followed here
	free    map[string]time.Time
	stopped bool
	wg      sync.WaitGroup
	wake    chan struct{} // a piece was placed here, or a lease changed: look at once
	// The watch's cache of the kind's leases (while Serve runs).
	lister coordlisters.LeaseNamespaceLister
	synced func() bool
	// Used by Serve's loop only: when this replica's presence was last
	// renewed, and the free leases (when first seen free).
	presentAt time.Time
}

// Work is one piece a replica holds.
type Work struct {
	// Session is the session the work is on; Params what Place was given.
	Session string
	Params  map[string]string
	// TakenOver: another replica held the work before and stopped
	// renewing its lease (it died).
	TakenOver bool
	// Ready tells the replica that placed the work that it has begun.
	Ready func()
	// Note sends an event to the replica that placed the work, for the
	// session's audit trail.
	Note func(typ string, fields map[string]any)
}

type heldWork struct {
	cancel   context.CancelFunc
	stop     bool      // the leader asked for the work to stop: write the result
	renewed  time.Time // the last renewal that succeeded was sent
	tried    time.Time // the last renewal was tried
	renewing bool
	failed   bool // the last renewal failed
	// deadline stops the work here two thirds of the lease's duration
	// after the last renewal that succeeded was sent, whatever the API
	// server does meanwhile: another replica may take the lease over
	// from its full duration on, and two must not do it at once.
	deadline *time.Timer
}

type placedWork struct {
	ready    chan struct{}
	once     sync.Once
	note     func(typ string, at time.Time, replayed bool, f map[string]any)
	seen     int    // notes delivered, by sequence number
	replayTo int    // notes written before this replica placed the piece
	version  string // of the lease as last delivered
}

// Annotations and labels of shared work's leases.
const (
	labelWork        = "sandgate.io/work"
	labelReplica     = "sandgate.io/work-replica"
	annotationParams = "sandgate.io/work-params"
	annotationStop   = "sandgate.io/work-stop"
	annotationReady  = "sandgate.io/work-ready"
	annotationNotes  = "sandgate.io/work-notes"
	annotationResult = "sandgate.io/work-result"
	// annotationPlaced marks a lease with the call of Place that made it.
	annotationPlaced = "sandgate.io/work-placed"
)

// How the work spreads: leases are looked for every shareTick; a free one
// is taken after spreadDelay for each piece this replica holds already,
// counted from when this replica first saw it free. Of a piece's notes
// the lease keeps the last maxNotes, each of at most maxNoteBytes.
var (
	shareTick   = 500 * time.Millisecond
	spreadDelay = time.Second
)

const (
	// maxSpread bounds the wait: however many pieces every replica
	// holds, a free one is taken within maxSpread*spreadDelay.
	maxSpread    = 3
	maxNotes     = 32
	maxNoteBytes = 1 << 10
	// shareStopWait bounds how long a replica that stops waits for its
	// pieces to store what they have before it gives their leases back.
	shareStopWait = 90 * time.Second
)

// ShareDuration is how long a piece's lease holds without a renewal.
var ShareDuration = 10 * time.Second

// NewShared spreads work of kind (a word: "recording") over the
// replicas; run does one piece on this replica until its ctx ends (the
// work was asked to stop, its lease was lost or this replica stops) and
// returns its result; a run that ends on its own has its result final
// too. With run nil, this replica takes no work: its Serve only follows
// what it placed (readiness, notes). identity names this replica, as
// for Hold.
func (b *Backend) NewShared(identity, kind string, run func(ctx context.Context, w Work) string, log *slog.Logger) *Shared {
	s := &Shared{kind: kind, run: run, log: log,
		held: map[string]*heldWork{}, placed: map[string]*placedWork{}, free: map[string]time.Time{}, wake: make(chan struct{}, 1)}
	s.leases = &Leases{Client: b.client, Namespace: b.cfg.Namespace, Identity: identity, Duration: ShareDuration, Existing: true,
		Refuse: func(le *coordinationv1.Lease) bool { return le.Annotations[annotationStop] != "" }}
	return s
}

// HoldersDead names holders known to be dead (an earlier run of this
// replica's container, Predecessor): their pieces are taken over at
// once, not once their leases run out. Call it before Serve.
func (s *Shared) HoldersDead(dead func(holder string) bool) { s.leases.Dead = dead }

func (s *Shared) name(session string) string { return "sandgate-" + s.kind + "-" + session }

// Place puts a piece of work on the session up for a replica to take,
// with params for it, unless it is there already (a replica that took
// the lead places again what its predecessor placed). note receives the
// holder's notes, with when each was written: all of them, for a piece
// placed before (the predecessor may have died before it had them),
// those marked replayed; the channel is closed once the holder says the
// work has begun. before says the piece was placed before: its lease
// was there already, and not made by this call (whose mark it would
// bear, should the create's answer have been lost).
func (s *Shared) Place(ctx context.Context, session string, params map[string]string, note func(typ string, at time.Time, replayed bool, f map[string]any)) (ready <-chan struct{}, before bool, err error) {
	raw, err := json.Marshal(params)
	if err != nil {
		return nil, false, err
	}
	name := s.name(session)
	secs := int32(ShareDuration / time.Second)
	var word [8]byte
	rand.Read(word[:])
	mark := hex.EncodeToString(word[:])
	leases := s.leases.Client.CoordinationV1().Leases(s.leases.Namespace)
	_, err = leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels:      map[string]string{LabelManaged: managedBy, labelLeaseFor: session, labelWork: s.kind},
			Annotations: map[string]string{annotationParams: string(raw), annotationPlaced: mark}},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: &secs},
	}, metav1.CreateOptions{})
	p := &placedWork{ready: make(chan struct{}), note: note}
	if err != nil && !apierrors.IsAlreadyExists(err) {
		// The answer may be what was lost: a lease that is there was
		// placed (by this call or another).
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, gerr := leases.Get(gctx, name, metav1.GetOptions{})
		cancel()
		if gerr == nil {
			err = apierrors.NewAlreadyExists(coordinationv1.Resource("leases"), name)
		}
	}
	if apierrors.IsAlreadyExists(err) {
		cur, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, false, fmt.Errorf("read %s lease %s: %w", s.kind, name, err)
		}
		if cur.Annotations[annotationStop] != "" {
			return nil, false, fmt.Errorf("the %s of session %s is being stopped", s.kind, session)
		}
		before = cur.Annotations[annotationPlaced] != mark
		if cur.Annotations[annotationReady] != "" {
			p.once.Do(func() { close(p.ready) })
		}
		// Its notes so far may or may not have reached the replica
		// that placed it: handed over as replayed.
		if notes := readNotes(cur); len(notes) > 0 {
			p.replayTo = notes[len(notes)-1].Seq
		}
	} else if err != nil {
		return nil, false, fmt.Errorf("place the %s of session %s: %w", s.kind, session, err)
	}
	s.mu.Lock()
	s.placed[name] = p
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return p.ready, before, nil
}

// Leave stops following here the session's piece that Place gave ready
// for (its readiness, its notes), without changing the piece: a replica
// that placed it while standing by leaves it to the leader that adopts
// the session, which places it again (and is replayed its notes). A
// piece placed here again since is followed on.
func (s *Shared) Leave(session string, ready <-chan struct{}) {
	name := s.name(session)
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.placed[name]; p != nil && p.ready == ready {
		delete(s.placed, name)
	}
}

// Stop asks the session's piece to stop, without waiting: the session
// is stopping, and its holder must not go on (nor connect again to an
// address the session is about to give up). No lease: nothing to do.
func (s *Shared) Stop(ctx context.Context, session string) error {
	_, err := s.askStop(ctx, session)
	return err
}

// askStop writes the stop on the session's piece, once, and returns the
// lease as it is then (nil: there is none).
func (s *Shared) askStop(ctx context.Context, session string) (*coordinationv1.Lease, error) {
	name := s.name(session)
	leases := s.leases.Client.CoordinationV1().Leases(s.leases.Namespace)
	for {
		cur, err := leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read %s lease %s: %w", s.kind, name, err)
		}
		if cur.Annotations[annotationStop] != "" {
			return cur, nil
		}
		next := cur.DeepCopy()
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		next.Annotations[annotationStop] = "true"
		if _, err := leases.Update(ctx, next, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
			return nil, fmt.Errorf("stop the %s of session %s: %w", s.kind, session, err)
		}
	}
}

// Collect asks the session's piece to stop and waits, within ctx, until
// its holder has stored what it had and written its result, or until its
// lease holds nothing that can still change (nobody took it after the
// stop; its holder died). It then removes the lease and returns the
// result: "" when no holder wrote one. No lease: "" and no error. The
// API server's failures are tried again until ctx ends.
func (s *Shared) Collect(ctx context.Context, session string) (string, error) {
	name := s.name(session)
	leases := s.leases.Client.CoordinationV1().Leases(s.leases.Namespace)
	defer func() {
		s.mu.Lock()
		delete(s.placed, name)
		s.mu.Unlock()
	}()
	var last error
	for {
		cur, err := s.askStop(ctx, session)
		if err == nil && cur == nil {
			return "", nil
		}
		if err == nil {
			s.deliver(name, cur)
			result, holder := cur.Annotations[annotationResult], deref(cur.Spec.HolderIdentity)
			// Since the stop, a lease nobody holds cannot be taken
			// (Refuse), and a holder that stopped renewing has died.
			if result != "" || holder == "" || s.leases.runOut(cur) {
				if holder != "" && result == "" {
					s.log.Warn("the replica that held this work stopped renewing its lease; what it had not stored stays on its host", "kind", s.kind, "session", session)
				}
				rv := cur.ResourceVersion
				err = leases.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
				if apierrors.IsConflict(err) {
					continue // the holder wrote since
				}
				if err == nil || apierrors.IsNotFound(err) {
					return result, nil
				}
				err = fmt.Errorf("remove %s lease %s: %w", s.kind, name, err)
			}
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for the %s of session %s to stop: %w", s.kind, session, errors.Join(ctx.Err(), last))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Params is the parameters of the session's work, from the API server:
// nil when it is not placed (no lease).
func (s *Shared) Params(ctx context.Context, session string) (map[string]string, error) {
	le, err := s.leases.Client.CoordinationV1().Leases(s.leases.Namespace).Get(ctx, s.name(session), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	params := map[string]string{}
	json.Unmarshal([]byte(le.Annotations[annotationParams]), &params)
	return params, nil
}

// Placed is a piece of work as the leases show it.
type Placed struct {
	Session string
	Params  map[string]string
	Created time.Time
}

// List reads the pieces placed, from the API server.
func (s *Shared) List(ctx context.Context) ([]Placed, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelManaged: managedBy, labelWork: s.kind}).String()
	list, err := s.leases.Client.CoordinationV1().Leases(s.leases.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, err
	}
	var out []Placed
	for _, le := range list.Items {
		if le.Labels[labelReplica] != "" {
			continue
		}
		var params map[string]string
		json.Unmarshal([]byte(le.Annotations[annotationParams]), &params)
		out = append(out, Placed{Session: le.Labels[labelLeaseFor], Params: params, Created: le.CreationTimestamp.Time})
	}
	return out, nil
}

// Serve looks for work and does it until ctx ends; then the pieces held
// store what they have and their leases are given back, so that another
// replica takes them at once.
func (s *Shared) Serve(ctx context.Context) {
	// The leases as a watch keeps them (an informer): looking costs the
	// API server nothing, and a change is looked at as it comes.
	sel := labels.SelectorFromSet(labels.Set{LabelManaged: managedBy, labelWork: s.kind}).String()
	factory := informers.NewSharedInformerFactoryWithOptions(s.leases.Client, 0, informers.WithNamespace(s.leases.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	inf := factory.Coordination().V1().Leases()
	poke := func(any) {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke})
	wctx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	factory.Start(wctx.Done())
	defer func() {
		stopWatch()
		factory.Shutdown() // waits for the watch to end
	}()
	s.lister = inf.Lister().Leases(s.leases.Namespace)
	s.synced = inf.Informer().HasSynced
	t := time.NewTicker(shareTick)
	defer t.Stop()
	for {
		s.round(ctx)
		select {
		case <-ctx.Done():
			// Gone first: the others take what this one gives back at
			// once, not judging it still busy.
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s.leases.Release(rctx, s.presence())
			cancel()
			s.mu.Lock()
			s.stopped = true
			for _, h := range s.held {
				h.cancel()
			}
			s.mu.Unlock()
			// The pieces store what they have, their leases renewed
			// meanwhile, so that nobody takes them over as from a dead
			// replica; then they are given back.
			done := make(chan struct{})
			go func() { s.wg.Wait(); close(done) }()
			limit := time.After(shareStopWait)
			for {
				s.renewAll(context.Background())
				select {
				case <-done:
					return
				case <-limit:
					s.log.Warn("work still storing what it had as this replica stops", "kind", s.kind)
					return
				case <-t.C:
				}
			}
		case <-t.C:
		case <-s.wake:
		}
	}
}

// Held is how many pieces this replica holds.
func (s *Shared) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

func (s *Shared) round(ctx context.Context) {
	// Renewals first: they run on their own, and nothing below (a slow
	// API server) may hold them up.
	s.renewAll(ctx)
	if s.run != nil {
		s.bePresent(ctx)
	}
	if !s.synced() {
		return
	}
	// From the watch's cache: read, never changed.
	list, err := s.lister.List(labels.Everything())
	if err != nil {
		return
	}
	now := time.Now()
	seen := map[string]bool{}
	// The replicas alive, and how many pieces each holds.
	live := map[string]int{s.leases.Identity: 0}
	var work []*coordinationv1.Lease
	for _, le := range list {
		seen[le.Name] = true
		holder := deref(le.Spec.HolderIdentity)
		if le.Labels[labelReplica] == "" {
			work = append(work, le)
			continue
		}
		if holder == s.leases.Identity {
			continue
		}
		if !s.leases.runOut(le) {
			if _, ok := live[holder]; !ok {
				live[holder] = 0
			}
			continue
		}
		// A replica that died: its presence goes.
		rv := le.ResourceVersion
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s.leases.Client.CoordinationV1().Leases(s.leases.Namespace).Delete(dctx, le.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		cancel()
	}
	for _, le := range work {
		if h := deref(le.Spec.HolderIdentity); h != "" {
			if _, ok := live[h]; ok {
				live[h]++
			}
		}
	}
	least := func() int {
		n := live[s.leases.Identity]
		for _, m := range live {
			n = min(n, m)
		}
		return n
	}
	for _, le := range work {
		s.deliver(le.Name, le)
		holder := deref(le.Spec.HolderIdentity)
		s.mu.Lock()
		h := s.held[le.Name]
		if h != nil {
			// (The cache may not show this replica's take yet: a lease
			// taken by another is found by the renewal, which reads the
			// API. A stop, once written, stays.)
			if le.Annotations[annotationStop] != "" && !h.stop {
				h.stop = true
				h.cancel()
			}
			s.mu.Unlock()
			continue
		}
		mine := len(s.held)
		s.mu.Unlock()
		if s.run == nil || le.Annotations[annotationStop] != "" || le.Annotations[annotationResult] != "" || (holder != "" && !s.leases.runOut(le)) {
			delete(s.free, le.Name)
			continue
		}
		first, ok := s.free[le.Name]
		if !ok {
			s.free[le.Name], first = now, now
		}
		// The replica that holds least takes it at once; one that holds
		// more leaves it a while to them (in case they are slow).
		if now.Sub(first) < time.Duration(min(mine-least(), maxSpread))*spreadDelay {
			continue
		}
		s.renewAll(ctx)
		if s.take(ctx, le, holder != "") {
			live[s.leases.Identity]++
		}
	}
	for name := range s.free {
		if !seen[name] {
			delete(s.free, name)
		}
	}
	s.leases.mu.Lock()
	for name := range s.leases.seen {
		if strings.HasPrefix(name, s.name("")) && !seen[name] {
			delete(s.leases.seen, name)
		}
	}
	s.leases.mu.Unlock()
	s.mu.Lock()
	for name, h := range s.held {
		if !seen[name] {
			h.cancel() // removed
		}
	}
	s.mu.Unlock()
}

// presence names the lease by which this replica tells the others it
// is alive and takes work: how much each holds is judged among them.
func (s *Shared) presence() string {
	sum := sha256.Sum256([]byte(s.leases.Identity))
	return s.name("replica-" + hex.EncodeToString(sum[:6]))
}

// bePresent makes this replica's presence lease, or renews it every
// third of its duration.
func (s *Shared) bePresent(ctx context.Context) {
	if time.Since(s.presentAt) < ShareDuration/3 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, ShareDuration/3)
	defer cancel()
	sent := time.Now()
	err := s.leases.Renew(ctx, s.presence())
	if errors.Is(err, ErrLeaseLost) {
		secs := int32(ShareDuration / time.Second)
		now := metav1.NewMicroTime(sent)
		_, err = s.leases.Client.CoordinationV1().Leases(s.leases.Namespace).Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: s.presence(),
				Labels: map[string]string{LabelManaged: managedBy, labelLeaseFor: "replica", labelWork: s.kind, labelReplica: "true"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &s.leases.Identity, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{})
	}
	if err == nil {
		s.presentAt = sent
	} else if ctx.Err() == nil {
		s.log.Warn("cannot say this replica is present for shared work", "kind", s.kind, "err", err)
	}
}

// take acquires a free lease and starts its work; it reports whether
// it did.
func (s *Shared) take(ctx context.Context, le *coordinationv1.Lease, takenOver bool) bool {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	sent := time.Now()
	held, _, err := s.leases.Acquire(actx, le.Name, le.Labels[labelLeaseFor])
	cancel()
	if err != nil || !held {
		if err != nil && ctx.Err() == nil {
			s.log.Warn("cannot take shared work", "kind", s.kind, "lease", le.Name, "err", err)
		}
		return false
	}
	delete(s.free, le.Name)
	var params map[string]string
	if err := json.Unmarshal([]byte(le.Annotations[annotationParams]), &params); err != nil {
		params = nil // the work's run refuses what it lacks
	}
	wctx, wcancel := context.WithCancel(context.WithoutCancel(ctx))
	h := &heldWork{cancel: wcancel, renewed: sent, tried: sent}
	h.deadline = time.AfterFunc(time.Until(sent.Add(ShareDuration*2/3)), func() {
		if wctx.Err() == nil {
			s.log.Warn("shared work's lease not renewed in time; stopping it here", "kind", s.kind, "lease", le.Name)
		}
		wcancel()
	})
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		wcancel()
		s.giveBack(le.Name, "")
		return false
	}
	s.held[le.Name] = h
	s.wg.Add(1)
	s.mu.Unlock()
	name, session := le.Name, le.Labels[labelLeaseFor]
	s.log.Info("took shared work", "kind", s.kind, "session", session, "taken_over", takenOver)
	w := Work{Session: session, Params: params, TakenOver: takenOver,
		Ready: func() {
			s.annotate(name, func(a map[string]string) { a[annotationReady] = "true" })
			// Placed here: no need to wait for the next look.
			s.mu.Lock()
			p := s.placed[name]
			s.mu.Unlock()
			if p != nil {
				p.once.Do(func() { close(p.ready) })
			}
		},
		Note: func(typ string, f map[string]any) {
			s.annotate(name, func(a map[string]string) { a[annotationNotes] = addNote(a[annotationNotes], typ, f) })
		},
	}
	go func() {
		defer s.wg.Done()
		result := s.run(wctx, w)
		// Ended on its own (it refused the work, say): final, as if
		// stopped, or the next replica would take it and end it again.
		own := wctx.Err() == nil
		wcancel()
		h.deadline.Stop()
		s.mu.Lock()
		stop := h.stop
		delete(s.held, name)
		s.mu.Unlock()
		if !stop && !own {
			result = "" // lost, removed or this replica stops: the next holder goes on
		}
		s.giveBack(name, result)
	}()
	return true
}

// giveBack lets go of a lease this replica holds, with the work's result
// when it was asked to stop.
func (s *Shared) giveBack(name, result string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.change(ctx, name, func(le *coordinationv1.Lease) {
		le.Spec.HolderIdentity = nil
		if result != "" {
			le.Annotations[annotationResult] = result
		}
	})
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		s.log.Warn("cannot give shared work back; its lease runs out instead", "kind", s.kind, "lease", name, "err", err)
	}
}

// annotate changes a held lease's annotations (a note, ready), trying
// again while other writes come first.
func (s *Shared) annotate(name string, change func(map[string]string)) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.change(ctx, name, func(le *coordinationv1.Lease) { change(le.Annotations) }); err != nil && !errors.Is(err, ErrLeaseLost) {
		s.log.Warn("cannot write to shared work's lease", "kind", s.kind, "lease", name, "err", err)
	}
}

// change rewrites a lease this replica holds, conditionally on the
// version read, renewing it on the way.
func (s *Shared) change(ctx context.Context, name string, do func(*coordinationv1.Lease)) error {
	leases := s.leases.Client.CoordinationV1().Leases(s.leases.Namespace)
	for {
		cur, err := s.leases.ours(ctx, name)
		if apierrors.IsNotFound(err) {
			return ErrLeaseLost
		}
		if err != nil {
			return err
		}
		next := cur.DeepCopy()
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		now := metav1.NewMicroTime(time.Now())
		next.Spec.RenewTime = &now
		do(next)
		_, err = leases.Update(ctx, next, metav1.UpdateOptions{})
		if err == nil || !apierrors.IsConflict(err) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// renewAll renews the leases held, each every third of its duration
// (after a failure, at each look), each on its own: one slow renewal
// holds no other up. The deadline, not the renewal, stops a piece whose
// lease could not be renewed in time. A renewal that reads a stop stops
// the piece; a piece whose lease another replica holds, or that is
// gone, stops here.
func (s *Shared) renewAll(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, h := range s.held {
		// After a failure, tried again at the next look.
		if h.renewing || (!h.failed && time.Since(h.tried) < ShareDuration/3) {
			continue
		}
		h.renewing, h.tried = true, time.Now()
		go s.renew(context.WithoutCancel(ctx), name, h)
	}
}

func (s *Shared) renew(ctx context.Context, name string, h *heldWork) {
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, ShareDuration/3)
	stop := false
	// Not Leases.Renew: a write of the leader's (the stop) or of this
	// piece's (a note) between its read and its write would count as
	// the lease lost.
	err := s.change(rctx, name, func(le *coordinationv1.Lease) { stop = le.Annotations[annotationStop] != "" })
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	h.renewing, h.failed = false, err != nil
	switch {
	case err == nil:
		h.renewed = sent
		h.deadline.Reset(time.Until(sent.Add(ShareDuration * 2 / 3)))
		if stop && !h.stop {
			h.stop = true
			h.cancel()
		}
	case errors.Is(err, ErrLeaseLost):
		h.cancel()
	default:
		s.log.Warn("shared work's lease not renewed; it stops here unless a renewal succeeds in time", "kind", s.kind, "lease", name, "err", err)
	}
}

// note is one note on a lease, numbered.
type note struct {
	Seq    int            `json:"seq"`
	Time   time.Time      `json:"time"`
	Type   string         `json:"type"`
	Fields map[string]any `json:"fields,omitempty"`
}

func readNotes(le *coordinationv1.Lease) []note {
	var notes []note
	json.Unmarshal([]byte(le.Annotations[annotationNotes]), &notes)
	return notes
}

// addNote adds one note to a lease's, keeping the last maxNotes; one
// whose fields are too long keeps its type only.
func addNote(raw, typ string, f map[string]any) string {
	var notes []note
	json.Unmarshal([]byte(raw), &notes)
	seq := 1
	if len(notes) > 0 {
		seq = notes[len(notes)-1].Seq + 1
	}
	n := note{Seq: seq, Time: time.Now().UTC(), Type: typ, Fields: maps.Clone(f)}
	if b, err := json.Marshal(n); err != nil || len(b) > maxNoteBytes {
		n.Fields = map[string]any{"truncated": true}
	}
	notes = append(notes, n)
	if len(notes) > maxNotes {
		notes = notes[len(notes)-maxNotes:]
	}
	b, _ := json.Marshal(notes)
	return string(b)
}

// deliver hands a placed piece's new notes to its note function, and
// its readiness.
func (s *Shared) deliver(name string, le *coordinationv1.Lease) {
	s.mu.Lock()
	p := s.placed[name]
	s.mu.Unlock()
	if p == nil {
		return
	}
	// Each look runs on every change to any lease: a lease unchanged
	// since it was last delivered is not read again.
	s.mu.Lock()
	same := p.version == le.ResourceVersion
	p.version = le.ResourceVersion
	s.mu.Unlock()
	if same {
		return
	}
	if le.Annotations[annotationReady] != "" || le.Annotations[annotationResult] != "" {
		p.once.Do(func() { close(p.ready) })
	}
	var fresh []note
	s.mu.Lock()
	for _, n := range readNotes(le) {
		if n.Seq > p.seen {
			fresh = append(fresh, n)
			p.seen = n.Seq
		}
	}
	s.mu.Unlock()
	for _, n := range fresh {
		if p.note != nil && len(n.Type) <= 64 {
			p.note(n.Type, n.Time, n.Seq <= p.replayTo, n.Fields)
		}
	}
}
