package session

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Trails lists the sessions the store holds pieces of (TrailLister).
func (p *pieceStore) PutScopedTrail(ctx context.Context, tenant, id, scope string, start int, lines []byte) error {
	if err := p.PutTrail(ctx, tenant, id, start, lines); err != nil && p.lost == nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.scopes == nil {
		p.scopes = map[string]map[int]string{}
	}
	if p.scopes[tenant+"/"+id] == nil {
		p.scopes[tenant+"/"+id] = map[int]string{}
	}
	p.scopes[tenant+"/"+id][start] = scope
	return p.lost
}

// Trails reports a trail's scope as recordings.Store does: the mark all
// its pieces carry, "" when one carries none or they differ.
func (p *pieceStore) Trails(_ context.Context, each func(tenant, id, scope string, newest time.Time) bool) error {
	p.mu.Lock()
	if p.fail != nil {
		p.mu.Unlock()
		return p.fail
	}
	var keys []string
	newest, scopes := map[string]time.Time{}, map[string]string{}
	for k, pieces := range p.pieces {
		keys = append(keys, k)
		newest[k] = p.written[k]
		first := true
		for start := range pieces {
			mark := p.scopes[k][start]
			if first {
				scopes[k], first = mark, false
			} else if mark != scopes[k] {
				scopes[k] = ""
			}
		}
	}
	p.mu.Unlock()
	sort.Strings(keys)
	for _, k := range keys {
		tenant, id, _ := strings.Cut(k, "/")
		if !each(tenant, id, scopes[k], newest[k]) {
			return nil
		}
	}
	return nil
}

// boxesBackend is a backend whose List has sandboxes of these ids; the
// manager calls nothing else of it here.
type boxesBackend struct {
	Backend
	ids []string
}

type idBox struct {
	Sandbox
	id string
}

func (b boxesBackend) List(context.Context) ([]Sandbox, error) {
	var out []Sandbox
	for _, id := range b.ids {
		out = append(out, idBox{id: id})
	}
	return out, nil
}

func (b idBox) ID() string { return b.id }

// logKeeper finalises as the gateway does, and reads back the logs it
// stored (LogReader); logs are those stored before it started.
type logKeeper struct {
	mu     sync.Mutex
	logs   map[string][]Event
	handed map[string][]Event // the last events handed to finalise
	infos  map[string]Info    // the last info handed to finalise
	calls  map[string]int
	// onFinalise, if set, is called as a finalisation begins.
	onFinalise func()
	fail       error
}

func (k *logKeeper) SessionRunning(Info, Endpoint) {}
func (k *logKeeper) SessionEnded(Info, []Event)    {}

func (k *logKeeper) FinaliseSession(_ context.Context, info Info, events []Event) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls[info.ID]++
	if k.onFinalise != nil {
		k.onFinalise()
	}
	if k.handed != nil {
		k.handed[info.ID] = events
	}
	if k.infos != nil {
		k.infos[info.ID] = info
	}
	if k.fail != nil {
		return k.fail
	}
	k.logs[info.ID] = append(k.logs[info.ID], events...)
	return nil
}

// StoreTrail adds to the log the events it lacks, known by time and
// type, as the gateway's merge does (TrailRestorer).
func (k *logKeeper) StoreTrail(_ context.Context, info Info, events []Event) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	have := map[string]bool{}
	for _, ev := range k.logs[info.ID] {
		have[ev.Time.String()+ev.Type] = true
	}
	for _, ev := range events {
		if !have[ev.Time.String()+ev.Type] {
			k.logs[info.ID] = append(k.logs[info.ID], ev)
		}
	}
	return nil
}

func (k *logKeeper) StoredLog(_ context.Context, _, id string) ([]Event, bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	evs, ok := k.logs[id]
	return evs, ok, nil
}

// storePieces stores a trail: created, with the scope tag given (none
// if empty), then events of these types.
func storePieces(t *testing.T, store *pieceStore, id, tag string, typs ...string) {
	t.Helper()
	if err := store.PutTrail(context.Background(), "acme", id, 0, trailLines(tag, typs...)); err != nil {
		t.Fatal(err)
	}
}

// trailLines is a trail's piece: created (with the scope tag, if any),
// then events of typs.
func trailLines(tag string, typs ...string) []byte {
	var b bytes.Buffer
	created := Event{Time: time.Now().UTC(), Type: "created", Fields: map[string]any{"runtime": "runc", "record": true}}
	if tag != "" {
		created.Fields["scope"] = tag
	}
	json.NewEncoder(&b).Encode(created)
	for _, typ := range typs {
		json.NewEncoder(&b).Encode(Event{Time: time.Now().UTC(), Type: typ})
	}
	return b.Bytes()
}

// scopedManagers is a manager of scope kubernetes/sandgate whose journal
// writes to store and whose backend has sandboxes of the ids boxed, and
// a manager of another scope (for its tag).
func scopedManagers(t *testing.T, boxed ...string) (store *pieceStore, m, other *Manager) {
	store = &pieceStore{}
	m = journalManager(t, store)
	m.backend = boxesBackend{ids: boxed}
	m.cfg.Scope = "kubernetes/sandgate"
	return store, m, &Manager{cfg: Config{Scope: "kubernetes/elsewhere"}}
}

// passEnds runs the pass over the stored trails to its end, within 30 s.
func passEnds(t *testing.T, m *Manager, k *logKeeper, why string) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); m.endStoredOrphans(k) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal(why)
	}
}

// Trails whose pieces another gateway marked (PutScopedTrail) are passed
// over unread, and do not count against a look's bound: this gateway's
// orphan, listed after more of them than the bound, is finalised. So is
// one whose first piece another scope marked and whose next this one did
// (a host that lost its scope and adopted the session): it is read. The
// controls: an unmarked trail (pieces from before the mark) is still
// read for the tag in its events, and left alone by it; the journal
// marks the pieces it writes with this gateway's tag.
func TestStoredOrphansMarked(t *testing.T) {
	defer func(n int) { maxStoredOrphans = n }(maxStoredOrphans)
	maxStoredOrphans = 3
	foreign := []string{"s-0000000000000001", "s-0000000000000002", "s-0000000000000003"}
	const (
		mixed  = "s-0000000000000004"
		orphan = "s-0000000000000005"
		old    = "s-0000000000000006"
		live   = "s-0000000000000007"
	)
	store, m, other := scopedManagers(t)
	ctx := context.Background()
	for _, id := range foreign {
		if err := store.PutScopedTrail(ctx, "acme", id, other.scopeTag(), 0, trailLines(other.scopeTag(), "exec")); err != nil {
			t.Fatal(err)
		}
	}
	storePieces(t, store, old, other.scopeTag(), "exec")
	var adopted bytes.Buffer
	json.NewEncoder(&adopted).Encode(Event{Time: time.Now().UTC(), Type: "adopted", Fields: map[string]any{"scope": m.scopeTag()}})
	store.PutScopedTrail(ctx, "acme", mixed, other.scopeTag(), 0, trailLines(other.scopeTag()))
	store.PutScopedTrail(ctx, "acme", mixed, m.scopeTag(), 1, adopted.Bytes())
	s := journalSession(m, live, false)
	s.trail.record(time.Now(), "created", m.createdFields(Info{}))
	if err := m.flushTrail(ctx, s); err != nil {
		t.Fatal(err)
	}
	if got := store.scopes["acme/"+live][0]; got != m.scopeTag() {
		t.Fatalf("the journal marked a live session's pieces %q, want this gateway's tag %q", got, m.scopeTag())
	}
	delete(m.sessions, live)
	store.PutScopedTrail(ctx, "acme", orphan, m.scopeTag(), 0, trailLines(m.scopeTag(), "exec"))
	// (live, now held by nothing, is an orphan too: its sandbox is gone.)

	k := &logKeeper{logs: map[string][]Event{}, infos: map[string]Info{}, calls: map[string]int{}}
	passEnds(t, m, k, "the pass did not end")
	if got := types(k.logs[orphan]); !eq(got, []string{"created", "exec", "ended_unobserved"}) {
		t.Errorf("this gateway's orphan, listed after %d trails of another, gave the log %v; want it finalised", len(foreign), got)
	}
	if got := types(k.logs[mixed]); !eq(got, []string{"created", "adopted", "ended_unobserved"}) {
		t.Errorf("the orphan adopted by this scope after another marked its first piece gave the log %v; want it finalised", got)
	}
	for _, id := range foreign {
		if store.reads["acme/"+id] != 0 || k.calls[id] != 0 || len(store.pieces["acme/"+id]) == 0 {
			t.Errorf("%s, marked by another gateway, was read %d times or finalised", id, store.reads["acme/"+id])
		}
	}
	if store.reads["acme/"+old] == 0 || k.calls[old] != 0 || len(store.pieces["acme/"+old]) == 0 {
		t.Errorf("the unmarked trail was read %d times, finalised %d: want read, and left alone by its events' tag", store.reads["acme/"+old], k.calls[old])
	}
}

// A session only the store's trail pieces remember (its sandbox went
// while no gateway ran or led) is finalised from them: its log has the
// trail and ended_unobserved, its pieces go, and no trail file is left.
// Spared, the controls: a session the manager holds, one whose sandbox
// is there (the adoption's), one with a trail file on the host
// (endOrphanTrails'), one another gateway sharing the store made (its
// scope is not this one's), and one from before scopes that no gateway
// of this scope adopted (one that one did adopt is its own). One whose
// stored log already ends is not finalised again: its pieces (kept when
// the store could not be read as it ended: audit_store_unmatched) go
// into its log, then go. A finalisation that fails is tried again.
func TestStoredOrphansFinalised(t *testing.T) {
	const (
		orphan   = "s-000000000000000a"
		live     = "s-000000000000000b"
		boxed    = "s-000000000000000c"
		filed    = "s-000000000000000d"
		ended    = "s-000000000000000e"
		foreign  = "s-000000000000000f"
		old      = "s-0000000000000010"
		upgraded = "s-0000000000000011"
	)
	store, m, other := scopedManagers(t, boxed)
	for _, id := range []string{orphan, live, boxed, filed, ended} {
		storePieces(t, store, id, m.scopeTag(), "exec")
	}
	storePieces(t, store, foreign, other.scopeTag(), "exec")
	storePieces(t, store, old, "", "exec")
	// Made before created events carried the tag, then adopted by a
	// gateway of this scope: this gateway's.
	var b bytes.Buffer
	for _, ev := range []Event{{Type: "created"}, {Type: "adopted", Fields: map[string]any{"scope": m.scopeTag()}}} {
		ev.Time = time.Now().UTC()
		json.NewEncoder(&b).Encode(ev)
	}
	store.PutTrail(context.Background(), "acme", upgraded, 0, b.Bytes())
	if got := m.createdFields(Info{})["scope"]; got != m.scopeTag() || m.scopeTag() == other.scopeTag() || strings.Contains(m.scopeTag(), "sandgate") {
		t.Fatalf("the created event's scope %v, tags %q and %q: want this gateway's own, opaque", got, m.scopeTag(), other.scopeTag())
	}

	journalSession(m, live, false)
	f := m.openTrail("acme", filed)
	f.record(time.Now(), "created", nil)
	k := &logKeeper{logs: map[string][]Event{ended: {{Type: "stopped"}, {Type: "audit_store_unmatched"}}}, infos: map[string]Info{}, calls: map[string]int{}}

	// The first finalisation fails: tried again after a backoff.
	k.fail = errors.New("the store is away")
	done := make(chan struct{})
	go func() { defer close(done); m.endStoredOrphans(k) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		k.mu.Lock()
		calls := k.calls[orphan]
		if calls > 0 {
			k.fail = nil
		}
		k.mu.Unlock()
		if calls > 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the pass did not end once the orphan was finalised")
	}

	if got := types(k.logs[orphan]); !eq(got, []string{"created", "exec", "ended_unobserved"}) {
		t.Errorf("the orphan's log: %v, want its trail and ended_unobserved (finalised %d times)", got, k.calls[orphan])
	}
	if got := types(k.logs[upgraded]); !eq(got, []string{"created", "adopted", "ended_unobserved"}) {
		t.Errorf("the session adopted by a gateway of this scope: log %v, want it finalised", got)
	}
	if !k.infos[orphan].Record {
		t.Error("the orphan made recorded was finalised as unrecorded: its recording's holder gets too little time")
	}
	if k.calls[orphan] != 2 {
		t.Errorf("the orphan was finalised %d times, want 2 (a failure, then its retry)", k.calls[orphan])
	}
	if _, err := os.Stat(m.trailPath("acme", orphan)); !os.IsNotExist(err) {
		t.Errorf("the orphan's trail file was left on the host: %v", err)
	}
	for _, id := range []string{live, boxed, filed, foreign, old} {
		if k.calls[id] != 0 || len(store.pieces["acme/"+id]) == 0 {
			t.Errorf("%s, held elsewhere or not this gateway's, was finalised (%d) or lost its pieces", id, k.calls[id])
		}
	}
	if len(store.pieces["acme/"+orphan]) != 0 {
		t.Error("the finalised orphan's pieces were kept")
	}
	if k.calls[ended] != 0 || len(store.pieces["acme/"+ended]) != 0 {
		t.Errorf("a session whose log had ended was finalised again (%d) or kept its pieces", k.calls[ended])
	}
	if got := types(k.logs[ended]); !eq(got, []string{"stopped", "audit_store_unmatched", "created", "exec"}) {
		t.Errorf("the ended session's log: %v, want what its pieces held added before they went", got)
	}
}

// A trail file left on this host for a session whose stored log holds
// its end already (another replica's host finalised it from the store)
// hands over what the file has, without a second end. The control: with
// no such log, the end is added.
func TestOrphanFileAfterStoredEnd(t *testing.T) {
	for _, tc := range []struct {
		name string
		log  []Event
		want []string
	}{
		{"the log ended", []Event{{Type: "created"}, {Type: "ended_unobserved"}}, []string{"created", "exec"}},
		{"no log", nil, []string{"created", "exec", "ended_unobserved"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const id = "s-00000000000000f0"
			m := journalManager(t, &pieceStore{})
			f := m.openTrail("acme", id)
			f.record(time.Now(), "created", nil)
			f.record(time.Now(), "exec", nil)
			k := &logKeeper{logs: map[string][]Event{}, handed: map[string][]Event{}, calls: map[string]int{}}
			if tc.log != nil {
				k.logs[id] = tc.log
			}
			m.endOrphanTrails(k)
			if got := types(k.handed[id]); !eq(got, tc.want) {
				t.Errorf("handed %v, want %v", got, tc.want)
			}
		})
	}
}

// A trail written to within OrphanQuiet is not finalised from the store
// until it has been left that long (a paused leader may still write
// it); then it is, without a restart. The control: TestStoredOrphans-
// Finalised's trails, with no quiet, are finalised at once.
func TestStoredOrphanQuiet(t *testing.T) {
	const id = "s-00000000000000a0"
	store, m, _ := scopedManagers(t)
	m.cfg.OrphanQuiet = 700 * time.Millisecond
	storePieces(t, store, id, m.scopeTag(), "exec")
	written := store.written["acme/"+id]
	k := &logKeeper{logs: map[string][]Event{}, infos: map[string]Info{}, calls: map[string]int{}}
	var at time.Time
	k.onFinalise = func() { at = time.Now() }
	passEnds(t, m, k, "the pass did not end once the quiet trail was finalised")
	if k.calls[id] != 1 {
		t.Fatalf("the quiet trail was finalised %d times, want once", k.calls[id])
	}
	if at.Sub(written) < m.cfg.OrphanQuiet {
		t.Errorf("finalised %v after its last piece, within the quiet of %v", at.Sub(written), m.cfg.OrphanQuiet)
	}
}

// A trail file of a session being adopted (under Kubernetes a leader
// adopts a session created alone apart from its start, and may observe
// the manager meanwhile) is not an orphan's: it is neither finalised
// nor removed, and keeps its events. The control: an orphan's file,
// beside it, is finalised.
func TestOrphanTrailsSpareAdopting(t *testing.T) {
	const adopting, orphan = "s-00000000000000a1", "s-00000000000000a2"
	m := journalManager(t, &pieceStore{})
	for _, id := range []string{adopting, orphan} {
		f := m.openTrail("acme", id)
		f.record(time.Now(), "created", nil)
		f.record(time.Now(), "adopted", nil)
	}
	m.adopting = map[string]bool{adopting: true}
	k := &logKeeper{logs: map[string][]Event{}, calls: map[string]int{}}
	m.endOrphanTrails(k)
	if k.calls[orphan] != 1 {
		t.Fatalf("the orphan's trail was finalised %d times, want once", k.calls[orphan])
	}
	if k.calls[adopting] != 0 {
		t.Errorf("the trail of the session being adopted was finalised %d times as an orphan's", k.calls[adopting])
	}
	if got := types(readTrail(m.trailPath("acme", adopting))); !eq(got, []string{"created", "adopted"}) {
		t.Errorf("the trail file of the session being adopted holds %v, want its events", got)
	}
}

// A session a leader's takeover removes once the gateway observes the
// manager (under Kubernetes, one a replica created alone, adopted apart
// from the start and not adoptable: here its runtime is not usable) is
// finalised there, from its stored trail: its log has the trail and
// ended_unobserved, its pieces and trail file go. The control: removed
// before the gateway observes the manager, it is left to Observe's pass,
// which finalises it once.
func TestRemovedAtTakeoverFinalised(t *testing.T) {
	for _, observed := range []bool{true, false} {
		t.Run(fmt.Sprintf("observed=%v", observed), func(t *testing.T) {
			const id = "s-00000000000000b1"
			store := &pieceStore{}
			m := journalManager(t, store)
			m.cfg.Tenants = map[string]TenantLimits{"acme": {MaxTTL: time.Hour}}
			storePieces(t, store, id, "", "exec")
			k := &logKeeper{logs: map[string][]Event{}, handed: map[string][]Event{}, calls: map[string]int{}}
			if observed {
				m.Observe(k)
			}
			box := unadoptableBox(t, id)
			if m.takeOver(context.Background(), idRecordBox{box}) || box.removed != 1 {
				t.Fatalf("a session that cannot be adopted was kept, or removed %d times", box.removed)
			}
			if !observed {
				if k.calls[id] != 0 {
					t.Fatalf("finalised %d times before the gateway observed the manager", k.calls[id])
				}
				m.Observe(k)
			}
			m.wg.Wait()
			if k.calls[id] != 1 {
				t.Fatalf("finalised %d times, want once", k.calls[id])
			}
			if got := types(k.handed[id]); !eq(got, []string{"created", "exec", "ended_unobserved"}) {
				t.Errorf("its log: %v, want its stored trail and ended_unobserved", got)
			}
			if _, err := os.Stat(m.trailPath("acme", id)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("its trail file after it was finalised: %v, want none", err)
			}
			if len(store.pieces["acme/"+id]) != 0 {
				t.Error("its stored pieces were kept after it was finalised")
			}
		})
	}
}

// A session whose trail file Observe's pass listed while a takeover
// adopted it, and which that takeover removed and finalised while the
// pass was on an earlier file, is not finalised a second time by the
// pass. The control: the earlier file, an orphan's, is finalised.
func TestOrphanPassAfterTakeover(t *testing.T) {
	const orphan, taken = "s-00000000000000d1", "s-00000000000000d2"
	store := &pieceStore{}
	m := journalManager(t, store)
	m.cfg.Tenants = map[string]TenantLimits{"acme": {MaxTTL: time.Hour}}
	for _, id := range []string{orphan, taken} {
		trailOnHost(t, m, store, id)
	}
	box := unadoptableBox(t, taken)
	k := &logKeeper{logs: map[string][]Event{}, handed: map[string][]Event{}, calls: map[string]int{}}
	m.mu.Lock()
	m.observer = k
	m.adopting = map[string]bool{taken: true} // (a takeover under way as the pass lists the files)
	m.mu.Unlock()
	var once atomic.Bool // (not sync.Once: the takeover reads trails too)
	store.onRead = func(key string) {
		if key != "acme/"+orphan || !once.CompareAndSwap(false, true) {
			return
		}
		func() {
			// The takeover goes on, finds the session not adoptable (its
			// runtime), removes it and finalises its trail.
			m.mu.Lock()
			delete(m.adopting, taken)
			m.mu.Unlock()
			if m.takeOver(context.Background(), idRecordBox{box}) {
				t.Error("the session that cannot be adopted was kept")
			}
		}()
	}
	m.endOrphanTrails(k)
	if k.calls[orphan] != 1 {
		t.Errorf("the orphan's trail was finalised %d times, want once", k.calls[orphan])
	}
	if k.calls[taken] != 1 {
		t.Errorf("the trail of the session the takeover removed was finalised %d times, want once", k.calls[taken])
	}
}

// trailOnHost stores a trail of session id (created, exec) and writes
// it to m's host file as well, as a takeover's removal would have.
func trailOnHost(t *testing.T, m *Manager, store *pieceStore, id string) {
	t.Helper()
	storePieces(t, store, id, "", "exec")
	var stored []Event
	store.ReadTrail(context.Background(), "acme", id, func(_ int, r io.Reader) error {
		stored = append(stored, readEventsFrom(r, trailLimit())...)
		return nil
	})
	f := m.openTrail("acme", id)
	if !f.rewrite(stored) {
		t.Fatal("the trail file could not be written")
	}
}

// unadoptableBox is the sandbox of a running session of tenant acme
// that a takeover cannot adopt: its runtime is not usable (none is).
func unadoptableBox(t *testing.T, id string) *recordBox {
	t.Helper()
	r, err := containerLabels(Info{ID: id, Tenant: "acme", Kind: KindBrowser, Runtime: "runc",
		CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}, "")
	if err != nil {
		t.Fatal(err)
	}
	r[labelState], r[labelAddr] = string(StateRunning), "10.0.0.9"
	return &recordBox{record: r}
}

// A takeover of a session whose trail file Observe's pass is finalising
// (its sandbox's removal failed before, and its record changed since)
// leaves it to the pass: it neither removes the sandbox nor finalises
// the trail a second time. The control: the pass finalises it once.
func TestTakeoverDuringOrphanPass(t *testing.T) {
	const id = "s-00000000000000e1"
	store := &pieceStore{}
	m := journalManager(t, store)
	m.cfg.Tenants = map[string]TenantLimits{"acme": {MaxTTL: time.Hour}}
	trailOnHost(t, m, store, id)
	box := unadoptableBox(t, id)
	k := &logKeeper{logs: map[string][]Event{}, handed: map[string][]Event{}, calls: map[string]int{}}
	m.mu.Lock()
	m.observer = k
	m.mu.Unlock()
	var once atomic.Bool // (not sync.Once: the takeover reads trails too)
	store.onRead = func(string) {
		if once.CompareAndSwap(false, true) {
			if !m.takeOver(context.Background(), idRecordBox{box}) || box.removed != 0 {
				t.Errorf("a takeover while the pass finalised the trail went on (removed %d times)", box.removed)
			}
		}
	}
	m.endOrphanTrails(k)
	if k.calls[id] != 1 {
		t.Errorf("the trail was finalised %d times, want once", k.calls[id])
	}
}
