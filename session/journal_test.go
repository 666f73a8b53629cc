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
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// pieceStore is a TrailStore in memory, for the manager's side of the
// journal; TestAuditTrailOutlivesHost (test/) runs it against MinIO.
type pieceStore struct {
	mu     sync.Mutex
	pieces map[string]map[int][]byte
	fail   error
	// lost: a put is stored, and its answer lost (an error all the
	// same: a timeout, a connection reset).
	lost error
	// written is when each trail's newest piece was put.
	written map[string]time.Time
	// scopes: the scope each trail's pieces were marked with, by
	// start; reads: how often each trail was read.
	scopes map[string]map[int]string
	reads  map[string]int
	// onRead, if set, is called as a trail (tenant/id) is read, before
	// the store's lock is taken.
	onRead func(key string)
}

func (p *pieceStore) PutTrail(_ context.Context, tenant, id string, start int, lines []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail != nil {
		return p.fail
	}
	if p.pieces == nil {
		p.pieces = map[string]map[int][]byte{}
	}
	if p.pieces[tenant+"/"+id] == nil {
		p.pieces[tenant+"/"+id] = map[int][]byte{}
	}
	p.pieces[tenant+"/"+id][start] = append([]byte(nil), lines...)
	delete(p.scopes[tenant+"/"+id], start) // (PutScopedTrail marks it)
	if p.written == nil {
		p.written = map[string]time.Time{}
	}
	p.written[tenant+"/"+id] = time.Now()
	return p.lost
}

func (p *pieceStore) ReadTrail(_ context.Context, tenant, id string, each func(int, io.Reader) error) error {
	if p.onRead != nil {
		p.onRead(tenant + "/" + id)
	}
	p.mu.Lock()
	if p.fail != nil {
		p.mu.Unlock()
		return p.fail
	}
	got := p.pieces[tenant+"/"+id]
	if p.reads == nil {
		p.reads = map[string]int{}
	}
	p.reads[tenant+"/"+id]++
	var starts []int
	for s := range got {
		starts = append(starts, s)
	}
	p.mu.Unlock()
	sort.Ints(starts)
	for _, s := range starts {
		if err := each(s, bytes.NewReader(got[s])); err != nil {
			return err
		}
	}
	return nil
}

// count is how many pieces of trail key (tenant/id) are stored.
func (p *pieceStore) count(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pieces[key])
}

func (p *pieceStore) DropTrail(_ context.Context, tenant, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pieces, tenant+"/"+id)
	delete(p.scopes, tenant+"/"+id)
	return nil
}

func journalManager(t *testing.T, store *pieceStore) *Manager {
	m := testManager(t)
	m.cfg.Trails = store
	m.base, m.journalCtx = context.Background(), context.Background()
	m.journalKick = make(chan struct{}, 1)
	return m
}

// journalSession is a session of tenant acme the manager holds, with a
// live trail (fresh: a new session's; else an adopted one's).
func journalSession(m *Manager, id string, fresh bool) *sess {
	s := newSess(Info{ID: id, Tenant: "acme"})
	s.trail = m.liveTrail("acme", id, fresh)
	m.sessions[id] = s
	return s
}

func types(evs []Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Type)
	}
	return out
}

func eq(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The store holds what was flushed, in pieces that follow on; a store
// that refuses keeps the events pending, and the next flush writes them
// after what is already there.
func TestJournalFlush(t *testing.T) {
	store := &pieceStore{}
	m := journalManager(t, store)
	s := journalSession(m, "s-0123456789abcdef", true)
	s.record("created", nil)
	s.record("exec", nil)
	select {
	case <-m.journalKick:
	default:
		t.Fatal("an event did not ask for a flush")
	}
	if err := m.flushTrails(context.Background()); err != nil {
		t.Fatal(err)
	}
	stored, err := m.readStoredTrail(context.Background(), "acme", s.info.ID)
	if err != nil || !eq(types(stored), []string{"created", "exec"}) {
		t.Fatalf("stored %v, %v", types(stored), err)
	}
	store.fail = errors.New("away")
	s.record("download", nil)
	if m.flushTrails(context.Background()) == nil {
		t.Fatal("a refused flush said it was done")
	}
	store.fail = nil
	s.record("preview", nil)
	if err := m.flushTrails(context.Background()); err != nil {
		t.Fatal(err)
	}
	stored, _ = m.readStoredTrail(context.Background(), "acme", s.info.ID)
	if want := []string{"created", "exec", "download", "preview"}; !eq(types(stored), want) {
		t.Fatalf("stored %v, want %v", types(stored), want)
	}
	// One piece: the first was small, so the later flush stored it
	// again, extended.
	if len(store.pieces["acme/"+s.info.ID]) != 1 {
		t.Errorf("want 1 piece, got %d", len(store.pieces["acme/"+s.info.ID]))
	}
	m.dropStoredTrail(s, true)
	s.record("late", nil)
	m.flushTrails(context.Background())
	if len(store.pieces["acme/"+s.info.ID]) != 0 {
		t.Errorf("pieces left or written after the drop: %d", len(store.pieces["acme/"+s.info.ID]))
	}
}

// An adopted session's trail is matched with the store: a host file that
// holds more than the store (the interval before a gateway died) has the
// rest flushed; a host that lost the file gets the store's events back,
// with what was recorded since after them.
func TestJournalSync(t *testing.T) {
	ctx := context.Background()
	const id = "s-0123456789abcdef"
	put := func(store *pieceStore, start int, typs ...string) {
		var b bytes.Buffer
		for _, typ := range typs {
			json.NewEncoder(&b).Encode(Event{Time: time.Now(), Type: typ})
		}
		store.PutTrail(ctx, "acme", id, start, b.Bytes())
	}
	t.Run("host holds more", func(t *testing.T) {
		store := &pieceStore{}
		m := journalManager(t, store)
		old := m.openTrail("acme", id)
		for _, typ := range []string{"created", "exec", "download"} {
			old.record(time.Now(), typ, nil)
		}
		// The gateway that died had stored the first two.
		var b bytes.Buffer
		for _, ev := range old.events()[:2] {
			json.NewEncoder(&b).Encode(ev)
		}
		store.PutTrail(ctx, "acme", id, 0, b.Bytes())
		s := journalSession(m, id, false)
		if err := m.syncTrail(ctx, s); err != nil {
			t.Fatal(err)
		}
		s.record("adopted", nil)
		m.flushTrails(ctx)
		stored, _ := m.readStoredTrail(ctx, "acme", id)
		if want := []string{"created", "exec", "download", "adopted"}; !eq(types(stored), want) {
			t.Fatalf("stored %v, want %v", types(stored), want)
		}
		if got := types(s.trail.events()); !eq(got, []string{"created", "exec", "download", "adopted"}) {
			t.Fatalf("host trail %v", got)
		}
	})
	t.Run("host file from another time", func(t *testing.T) {
		// A host file an earlier gateway left here while another ran
		// the session elsewhere: it is longer than the store, but not
		// what the store holds. The store is right.
		store := &pieceStore{}
		m := journalManager(t, store)
		old := m.openTrail("acme", id)
		for _, typ := range []string{"created", "exec", "a1", "a2", "a3"} {
			old.record(time.Now(), typ, nil)
		}
		put(store, 0, "created", "exec", "elsewhere")
		s := journalSession(m, id, false)
		if err := m.syncTrail(ctx, s); err != nil {
			t.Fatal(err)
		}
		if got, want := types(s.trail.events()), []string{"created", "exec", "elsewhere"}; !eq(got, want) {
			t.Fatalf("host trail %v, want the store's %v", got, want)
		}
	})
	t.Run("host lost the file", func(t *testing.T) {
		store := &pieceStore{}
		m := journalManager(t, store)
		put(store, 0, "created", "exec")
		put(store, 2, "download")
		s := journalSession(m, id, false)
		// The store did not answer at the adoption: the event recorded
		// meanwhile goes after what the store has, and the trail is not
		// finalised, nor its pieces dropped, until it is matched.
		store.fail = errors.New("away")
		s.record("adopted", nil)
		if m.ensureSynced(ctx, s) == nil {
			t.Fatal("a trail the store could not match says it is ready to finalise")
		}
		m.dropStoredTrail(s, true)
		if len(store.pieces["acme/"+id]) != 2 {
			t.Fatal("the pieces of a trail never matched were dropped")
		}
		s.trail.journal = true // dropStoredTrail ended the journal; the test goes on with it
		store.fail = nil
		m.flushTrails(ctx)
		want := []string{"created", "exec", "download", "adopted"}
		if got := types(s.trail.events()); !eq(got, want) {
			t.Fatalf("host trail %v, want %v", got, want)
		}
		if _, err := os.Stat(s.trail.path); err != nil {
			t.Fatalf("the host file was not made again: %v", err)
		}
		stored, _ := m.readStoredTrail(ctx, "acme", id)
		if !eq(types(stored), want) {
			t.Fatalf("stored %v, want %v", types(stored), want)
		}
	})
	t.Run("a gap", func(t *testing.T) {
		store := &pieceStore{}
		m := journalManager(t, store)
		put(store, 0, "created")
		put(store, 5, "far")
		stored, err := m.readStoredTrail(ctx, "acme", id)
		if err != nil || !eq(types(stored), []string{"created"}) {
			t.Fatalf("read past a gap: %v, %v", types(stored), err)
		}
	})
}

// An event too large to read back whole keeps its place with a note
// instead of its fields, so the host file and the store keep the same
// events at the same indexes; a line a dead gateway left half written is
// cut off when the trail is opened again, so the next one does not join it.
func TestJournalOddLines(t *testing.T) {
	ctx := context.Background()
	store := &pieceStore{}
	m := journalManager(t, store)
	const id = "s-0123456789abcdef"
	s := journalSession(m, id, true)
	huge := map[string]any{}
	for i := range 32 {
		inner := map[string]any{}
		for j := range 32 {
			inner[fmt.Sprintf("k%d", j)] = strings.Repeat("<", 512)
		}
		huge[fmt.Sprintf("f%d", i)] = inner
	}
	s.record("created", nil)
	s.record("exec", huge)
	s.record("after", nil)
	if err := m.flushTrails(ctx); err != nil {
		t.Fatal(err)
	}
	stored, _ := m.readStoredTrail(ctx, "acme", id)
	if want := []string{"created", "exec", "after"}; !eq(types(stored), want) || !eq(types(s.trail.events()), want) {
		t.Fatalf("stored %v, host %v, want %v in both", types(stored), types(s.trail.events()), want)
	}
	if stored[1].Fields["note"] == nil {
		t.Errorf("the oversized event kept fields of %v", stored[1].Fields)
	}

	// Half a line at the end, as a gateway killed mid-write leaves it.
	f, err := os.OpenFile(s.trail.path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"time":"2026-12-02T00:00:00Z","ty`)
	f.Close()
	again := m.openTrail("acme", id)
	again.record(time.Now(), "next", nil)
	if got, want := types(again.events()), []string{"created", "exec", "after", "next"}; !eq(got, want) {
		t.Fatalf("after a half-written line: %v, want %v", got, want)
	}
}

// Durable stores a session's new events at once, without the journal;
// while the journal finds the store away it does not wait for it.
func TestJournalDurable(t *testing.T) {
	store := &pieceStore{}
	m := journalManager(t, store)
	s := journalSession(m, "s-0123456789abcdef", true)
	s.record("created", nil)
	s.record("preview_issued", nil)
	// With no gateway elsewhere to take over, the host's file is what
	// outlives this one: Durable leaves the store to the journal.
	if err := m.Durable(context.Background(), s.info.ID); err != nil {
		t.Fatal(err)
	}
	if stored, _ := m.readStoredTrail(context.Background(), "acme", s.info.ID); len(stored) != 0 {
		t.Fatalf("stored at once on one host: %v", types(stored))
	}
	if got := types(readTrail(s.trail.path)); len(got) != 2 {
		t.Fatalf("the host's file holds %v", got)
	}
	// An event the file did not take is in memory only: stored at once.
	other := journalSession(m, "s-0123456789abcdee", true)
	other.trail.path = ""
	other.record("created", nil)
	if err := m.Durable(context.Background(), other.info.ID); err != nil {
		t.Fatal(err)
	}
	if stored, _ := m.readStoredTrail(context.Background(), "acme", other.info.ID); len(stored) != 1 {
		t.Fatalf("an event in memory only, after Durable: the store holds %v", types(stored))
	}
	m.cfg.TakenOverElsewhere = true
	// The control: nothing is stored until someone flushes.
	if stored, _ := m.readStoredTrail(context.Background(), "acme", s.info.ID); len(stored) != 0 {
		t.Fatalf("stored before any flush: %v", types(stored))
	}
	if err := m.Durable(context.Background(), s.info.ID); err != nil {
		t.Fatal(err)
	}
	stored, err := m.readStoredTrail(context.Background(), "acme", s.info.ID)
	if err != nil || !eq(types(stored), []string{"created", "preview_issued"}) {
		t.Fatalf("after Durable: %v, %v", types(stored), err)
	}
	// Nothing new: nothing written.
	m.Durable(context.Background(), s.info.ID)
	if n := len(store.pieces["acme/"+s.info.ID]); n != 1 {
		t.Errorf("%d pieces after a Durable with nothing new", n)
	}
	if err := m.Durable(context.Background(), "s-ffffffffffffffff"); err != nil {
		t.Errorf("a session this gateway does not hold: %v", err)
	}
	// The store away, as the journal found: Durable answers at once.
	store.fail = errors.New("away")
	m.journalFailing.Store(true)
	s.record("preview_revoked", nil)
	if err := m.Durable(context.Background(), s.info.ID); err != nil {
		t.Errorf("Durable while the journal finds the store away: %v", err)
	}
	store.fail = nil
	m.journalFailing.Store(false)
	if err := m.Durable(context.Background(), s.info.ID); err != nil {
		t.Fatal(err)
	}
	if stored, _ := m.readStoredTrail(context.Background(), "acme", s.info.ID); !eq(types(stored), []string{"created", "preview_issued", "preview_revoked"}) {
		t.Errorf("once the store is back: %v", types(stored))
	}
}

// A trail flushed at every request (Durable after each exec, say) is
// stored in few pieces, each extended while it is small, and the store
// holds every event in order after each flush. Puts stored whose answer
// was lost, while the trail grows past the size at which a piece is no
// longer extended, leave no two pieces overlapping.
func TestJournalCoalesce(t *testing.T) {
	store := &pieceStore{}
	m := journalManager(t, store)
	m.cfg.TakenOverElsewhere = true
	s := journalSession(m, "s-0123456789abcdef", true)
	ctx := context.Background()
	const requests = 2000
	pad := strings.Repeat("x", 200) // an exec event's command and digest, about
	check := func(upTo int) {
		t.Helper()
		stored, err := m.readStoredTrail(ctx, "acme", s.info.ID)
		if err != nil || len(stored) != upTo {
			t.Fatalf("the store holds %d events of %d (%v)", len(stored), upTo, err)
		}
		for i, ev := range stored {
			if ev.Fields["n"] != float64(i) {
				t.Fatalf("event %d of the store is %v", i, ev.Fields["n"])
			}
		}
	}
	for i := 0; i < requests; i++ {
		s.record("exec", map[string]any{"n": i, "cmd": pad})
		// Now and then, answers lost for a while (each stored).
		store.mu.Lock()
		if i%300 == 250 {
			store.lost = errors.New("connection reset")
		} else if i%300 == 0 {
			store.lost = nil
		}
		lost := store.lost != nil
		store.mu.Unlock()
		if err := m.Durable(ctx, s.info.ID); (err != nil) != lost {
			t.Fatalf("request %d: %v", i, err)
		}
		m.journalFailing.Store(false) // as the journal would find, once it flushed
		if i%20 == 0 && !lost {
			check(i + 1)
		}
	}
	check(requests)
	var lineBytes int
	var starts []int
	for start, b := range store.pieces["acme/"+s.info.ID] {
		lineBytes += len(b)
		starts = append(starts, start)
	}
	sort.Ints(starts)
	for i, start := range starts {
		b := store.pieces["acme/"+s.info.ID][start]
		if i+1 < len(starts) && start+bytes.Count(b, []byte("\n")) != starts[i+1] {
			t.Errorf("the piece at %d holds %d events, the next starts at %d", start, bytes.Count(b, []byte("\n")), starts[i+1])
		}
	}
	pieces := len(starts)
	// The control of the count: one piece a request without extending.
	most := lineBytes/(pieceCoalesce/2) + 2
	t.Logf("%d requests, %d bytes of trail, %d pieces (at most %d)", requests, lineBytes, pieces, most)
	if pieces > most || pieces < 2 {
		t.Errorf("%d pieces for %d flushes of %d bytes, want 2 to %d", pieces, requests, lineBytes, most)
	}
}

// Pieces that overlap (a piece extended by a put whose answer was lost,
// then a piece written after it by another path) read as one trail; a
// gap still ends it.
func TestJournalOverlap(t *testing.T) {
	store := &pieceStore{}
	m := journalManager(t, store)
	ctx := context.Background()
	id := "s-0123456789abcdef"
	piece := func(from, to int) []byte {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		for i := from; i < to; i++ {
			enc.Encode(Event{Type: fmt.Sprintf("e%d", i)})
		}
		return b.Bytes()
	}
	store.PutTrail(ctx, "acme", id, 0, piece(0, 15))
	store.PutTrail(ctx, "acme", id, 10, piece(10, 20))
	store.PutTrail(ctx, "acme", id, 20, piece(20, 22))
	stored, err := m.readStoredTrail(ctx, "acme", id)
	if err != nil || len(stored) != 22 {
		t.Fatalf("overlapping pieces: %d events, %v", len(stored), err)
	}
	for i, ev := range stored {
		if ev.Type != fmt.Sprintf("e%d", i) {
			t.Fatalf("event %d is %s", i, ev.Type)
		}
	}
	// The control: a gap ends what is read.
	store.PutTrail(ctx, "acme", id, 30, piece(30, 31))
	if stored, _ := m.readStoredTrail(ctx, "acme", id); len(stored) != 22 {
		t.Errorf("past a gap: %d events, want 22", len(stored))
	}
}

// endedObserver keeps the trails of the sessions it is told ended.
type endedObserver struct{ trails map[string][]Event }

func (o *endedObserver) SessionRunning(Info, Endpoint) {}
func (o *endedObserver) SessionEnded(info Info, events []Event) {
	o.trails[info.ID] = events
}

// A trail whose session ended while no gateway ran is matched with the
// store before it is reported and its pieces dropped: an event only the
// store holds (the file did not take it) is in the reported trail. While
// the store cannot be read, nothing is reported and nothing dropped.
func TestOrphanTrailMatched(t *testing.T) {
	ctx := context.Background()
	const id = "s-0123456789abcdef"
	for _, tc := range []struct {
		name   string
		stored []string // the store's events; the file holds the first two
		want   []string
	}{
		{"the store holds more", []string{"created", "exec", "download"}, []string{"created", "exec", "download", "ended_unobserved"}},
		// The control: a store that holds a prefix adds nothing.
		{"the file holds more", []string{"created"}, []string{"created", "exec", "ended_unobserved"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &pieceStore{}
			m := journalManager(t, store)
			old := m.openTrail("acme", id)
			for _, typ := range []string{"created", "exec"} {
				old.record(time.Now(), typ, nil)
			}
			file := old.events()
			var b bytes.Buffer
			for i, typ := range tc.stored {
				ev := Event{Time: time.Now(), Type: typ}
				if i < len(file) {
					ev = file[i]
				}
				json.NewEncoder(&b).Encode(ev)
			}
			store.PutTrail(ctx, "acme", id, 0, b.Bytes())

			store.fail = errors.New("away")
			o := &endedObserver{trails: map[string][]Event{}}
			m.endOrphanTrails(o)
			if _, told := o.trails[id]; told {
				t.Fatal("a trail the store could not match was reported")
			}
			if _, err := os.Stat(old.path); err != nil {
				t.Fatalf("the trail file did not stay for the next start: %v", err)
			}
			store.fail = nil
			m.endOrphanTrails(o)
			got, told := o.trails[id]
			if !told {
				t.Fatal("the orphan trail was not reported")
			}
			if g := types(got); !eq(g, tc.want) {
				t.Fatalf("reported %v, want %v", g, tc.want)
			}
			if len(store.pieces["acme/"+id]) != 0 {
				t.Error("the pieces of a finalised trail were kept")
			}
			if _, err := os.Stat(old.path); !os.IsNotExist(err) {
				t.Errorf("the trail file was kept after it was reported: %v", err)
			}
		})
	}
}

// An adopted session's events recorded before the manager held it (its
// adopted event) are stored once it is held, not left for its next
// event: the flush their record asked for found no session to flush.
// The control: before the hold, nothing is stored.
func TestAdoptedHeldFlushed(t *testing.T) {
	const id = "s-00000000000000c1"
	store := &pieceStore{}
	m := journalManager(t, store)
	m.cfg.TrailFlush = 20 * time.Millisecond
	m.byAddr = map[netip.Addr]*sess{}
	ctx, cancel := context.WithCancel(context.Background())
	m.wg.Add(1)
	go m.journal(ctx)
	defer func() { cancel(); m.wg.Wait() }()

	s := newSess(Info{ID: id, Tenant: "acme"})
	s.trail = m.liveTrail("acme", id, false)
	if err := m.syncTrail(ctx, s); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	s.record("adopted", nil)
	m.mu.Unlock()
	time.Sleep(10 * m.cfg.TrailFlush) // the flush the record asked for
	if n := store.count("acme/" + id); n != 0 {
		t.Fatalf("%d pieces stored of a session not held yet", n)
	}
	m.mu.Lock()
	m.holdAdoptedLocked(s, m.log)
	m.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for store.count("acme/"+id) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the adopted event was not stored within 10 s of the hold")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
