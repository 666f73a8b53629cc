package session

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sandgate/sandgate/ids"
)

// Event is one entry of a session's audit trail. Fields never hold
// secrets: callers record names and sizes, not values.
type Event struct {
	Time   time.Time      `json:"time"`
	Type   string         `json:"type"`
	Fields map[string]any `json:"fields,omitempty"`
}

// Bounds of a session's audit trail. The trail never loses an event
// silently: past a bound, events of that type are counted, the first
// drop writes an audit_truncated marker, and the end of the session
// writes an audit_summary with the counts. Noisy events, those a session
// makes by itself once per request (egress, preview connections), have a
// bound per type of their own, so a flood of them never pushes out the
// rest (exec, downloads, fill_credential...).
const (
	maxEvents     = 10000 // other events kept per session
	maxNoisy      = 1000  // noisy events kept per session and type
	maxDropTypes  = 64    // types counted apart in audit_summary; others as "other"
	maxFields     = 32    // fields kept per event (and items per list)
	maxFieldBytes = 512   // bytes kept per string field
	maxKeyBytes   = 64
	maxTrailLine  = 1 << 20 // longest line read back from a trail file
	// maxEventLine bounds one event as written: the fields of one that
	// would be longer (escaped lists of long strings add up) are replaced
	// by a note, so every line is read back whole.
	maxEventLine = 256 << 10
)

// noisyEvents are the types a session produces at its own pace.
var noisyEvents = map[string]bool{
	"egress_allowed": true, "egress_denied": true, "egress_failed": true,
	"credential_used": true, "credential_unavailable": true,
	"preview_connected": true, "preview_closed": true,
	"review_opened": true, "review_fetched": true,
}

// trail is a session's audit trail: appended to a host file under the
// state dir (so a restarted gateway keeps the trail of sessions it
// adopts), kept in memory only for what that file could not take.
type trail struct {
	path    string         // host file; empty if it could not be made
	kept    int            // other events kept
	noisy   map[string]int // noisy events kept, by type
	dropped map[string]int // events counted, not kept, by type
	mem     []Event        // events the file could not take
	// inFile counts the events in the host file; fileBase is how many it
	// had when the trail was opened.
	inFile   int
	fileBase int
	writes   int // events written since it was opened, file or memory
	// With a TrailStore (journal.go): journal is set while the trail is
	// stored as it is written; the first stored events are in the store,
	// those of the file up to byte storedOff and then storedMem of mem;
	// synced says the store was matched (an adopted trail's is not until
	// syncTrail); kick asks for a flush.
	journal   bool
	synced    bool
	stored    int
	storedOff int64
	storedMem int
	kick      func()
	// tail is the last piece this gateway stored, while it is small
	// (pieceCoalesce): the next flush stores it again, extended, rather
	// than a piece of its own, so that a trail flushed at every request
	// is not thousands of pieces to read back. It holds events from
	// tailStart, tailN of them. Only a flush or a sync (s.journalMu)
	// uses these and unsure.
	tail      []byte
	tailStart int
	tailN     int
	// unsure: a put at unsureAt failed, and the store may hold it all
	// the same; the next put goes to the same key, with at least what
	// that one held, so that no two stored pieces overlap.
	unsure   bool
	unsureAt int
}

// Record appends an event to the audit trail of a session the manager
// knows; events for unknown or forgotten sessions are ignored, so no one
// makes a trail for a session that is not there. It says whether the
// session had one.
func (m *Manager) Record(id, typ string, fields map[string]any) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return false
	}
	s.record(typ, fields)
	if s.finalised {
		m.lateEvent(s)
	}
	return true
}

// record appends an event within the trail's bounds; the caller holds
// m.mu.
func (s *sess) record(typ string, fields map[string]any) {
	s.trail.record(time.Now().UTC(), typ, fields)
}

func (t *trail) record(now time.Time, typ string, fields map[string]any) {
	if t.noisy == nil {
		t.noisy = map[string]int{}
	}
	if noisyEvents[typ] {
		if t.noisy[typ] >= maxNoisy {
			t.drop(now, typ, maxNoisy)
			return
		}
		t.noisy[typ]++
	} else {
		if t.kept >= maxEvents {
			t.drop(now, typ, maxEvents)
			return
		}
		t.kept++
	}
	t.write(Event{Time: now, Type: cut(typ, maxKeyBytes), Fields: boundFields(fields, 2)})
}

// drop counts an event that is not kept; the first of its type leaves a
// marker in the trail.
func (t *trail) drop(now time.Time, typ string, bound int) {
	if t.dropped == nil {
		t.dropped = map[string]int{}
	}
	if _, seen := t.dropped[typ]; !seen && len(t.dropped) >= maxDropTypes {
		typ = "other"
	}
	n, seen := t.dropped[typ]
	t.dropped[typ] = n + 1
	if !seen {
		t.write(Event{Time: now, Type: "audit_truncated", Fields: map[string]any{
			"type": cut(typ, maxKeyBytes), "kept": bound,
			"note": "further events of this type are counted, not kept; audit_summary has the count",
		}})
	}
}

// summarise writes the counts of what was not kept, if anything was.
func (t *trail) summarise(now time.Time) {
	if len(t.dropped) == 0 {
		return
	}
	total := 0
	counts := make(map[string]any, len(t.dropped))
	for typ, n := range t.dropped {
		counts[typ] = n
		total += n
	}
	t.write(Event{Time: now, Type: "audit_summary", Fields: map[string]any{"dropped": counts, "dropped_total": total}})
}

func (t *trail) write(ev Event) {
	t.writes++
	if t.journal && t.kick != nil {
		t.kick()
	}
	if line, err := json.Marshal(ev); err == nil && len(line) > maxEventLine {
		ev.Fields = map[string]any{"note": "the event's fields were too large to keep", "bytes": len(line)}
	}
	if t.path != "" {
		if line, err := json.Marshal(ev); err == nil && appendLine(t.path, line) == nil {
			t.inFile++
			return
		}
	}
	if len(t.mem) < maxEvents {
		t.mem = append(t.mem, ev)
		return
	}
	// Neither the file nor memory takes it: it is counted all the same.
	if t.dropped == nil {
		t.dropped = map[string]int{}
	}
	t.dropped["unwritable"]++
}

// appendLine appends a line whole or not at all: a write cut short (a
// full disk) is cut back off, so the next line does not join it.
func appendLine(path string, line []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err == nil {
		if _, err = f.Write(append(line, '\n')); err != nil {
			f.Truncate(size)
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// cutPartialLine cuts a trail file back to its last whole line (a
// gateway that died in the middle of a write left the rest).
func cutPartialLine(path string) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil || size == 0 {
		return
	}
	buf := make([]byte, 1)
	if _, err := f.ReadAt(buf, size-1); err != nil || buf[0] == '\n' {
		return
	}
	// Back to the last newline, reading backwards in blocks.
	const block = 64 << 10
	for end := size; end > 0; {
		start := max(end-block, 0)
		b := make([]byte, end-start)
		if _, err := f.ReadAt(b, start); err != nil {
			return
		}
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			f.Truncate(start + int64(i) + 1)
			return
		}
		end = start
	}
	f.Truncate(0)
}

// events reads the trail back, oldest first.
func (t *trail) events() []Event {
	var out []Event
	if t.path != "" {
		out = readTrail(t.path)
	}
	return append(out, t.mem...)
}

// readTrail reads a trail file, as many events as a trail may hold.
func readTrail(path string) []Event {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	return readEvents(f)
}

func readEvents(f *os.File) []Event { return readEventsFrom(f, trailLimit()) }

// readEventsFrom reads at most limit events, a JSON object a line; lines
// that do not parse are skipped.
func readEventsFrom(r io.Reader, limit int) []Event {
	var out []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxTrailLine)
	for sc.Scan() && len(out) < limit {
		var ev Event
		if json.Unmarshal(sc.Bytes(), &ev) == nil {
			out = append(out, ev)
		}
	}
	return out
}

// boundFields copies fields with every string cut to maxFieldBytes, at
// most maxFields entries per map or list, and nesting to depth.
func boundFields(f map[string]any, depth int) map[string]any {
	if len(f) == 0 {
		return nil
	}
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make(map[string]any, min(len(keys), maxFields+1))
	for i, k := range keys {
		if i == maxFields {
			out["fields_truncated"] = len(keys) - maxFields
			break
		}
		out[cut(k, maxKeyBytes)] = boundValue(f[k], depth)
	}
	return out
}

func boundValue(v any, depth int) any {
	switch x := v.(type) {
	case nil, bool, int, int64, uint64, float64:
		return x
	case string:
		return cut(x, maxFieldBytes)
	case []string:
		l := make([]any, 0, min(len(x), maxFields))
		for _, e := range x[:min(len(x), maxFields)] {
			l = append(l, cut(e, maxFieldBytes))
		}
		return l
	case []any:
		l := make([]any, 0, min(len(x), maxFields))
		for _, e := range x[:min(len(x), maxFields)] {
			l = append(l, boundValue(e, depth-1))
		}
		return l
	case map[string]any:
		if depth <= 0 {
			return "(nested too deep)"
		}
		return boundFields(x, depth-1)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "(not encodable)"
	}
	if len(b) > maxFieldBytes {
		return cut(string(b), maxFieldBytes)
	}
	return json.RawMessage(b)
}

// cut shortens s to at most n bytes on a rune boundary, saying so.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…(cut)"
	i := n - len(mark)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + mark
}

func (m *Manager) trailPath(tenant, id string) string {
	return filepath.Join(m.cfg.StateDir, "audit", tenant, id+".jsonl")
}

// endedSuffix marks the trail file of a session that ended and was
// finalised: kept for GET .../events until the session is forgotten, and
// not reported again by a restarted gateway.
const endedSuffix = ".ended"

// openTrail makes the session's trail and takes up the counts of any
// events already in its file (an adopted session's).
func (m *Manager) openTrail(tenant, id string) trail {
	p := m.trailPath(tenant, id)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		m.log.Error("audit trail dir", "session", id, "err", err)
		return trail{}
	}
	t := trail{path: p, noisy: map[string]int{}}
	cutPartialLine(p)
	have := readTrail(p)
	t.count(have)
	t.fileBase, t.inFile = len(have), len(have)
	return t
}

// liveTrail opens the trail of a session the manager runs: stored as it
// is written when there is a TrailStore. A fresh session's trail is new,
// so the store has nothing of it; an adopted one's is matched with the
// store before its first flush (syncTrail).
func (m *Manager) liveTrail(tenant, id string, fresh bool) trail {
	t := m.openTrail(tenant, id)
	if m.journalOn() {
		t.journal, t.synced, t.kick = true, fresh, m.kickJournal
	}
	return t
}

// count takes up the counts of events already in the trail.
func (t *trail) count(events []Event) {
	for _, ev := range events {
		switch {
		case ev.Type == "audit_truncated":
			if typ, ok := ev.Fields["type"].(string); ok {
				if t.dropped == nil {
					t.dropped = map[string]int{}
				}
				t.dropped[typ] += 0
			}
		case noisyEvents[ev.Type]:
			t.noisy[ev.Type]++
		default:
			t.kept++
		}
	}
}

// dropEndedTrails removes the trail files of sessions a previous gateway
// had finalised: it does not know them any more, and the store has them.
// One with events the store's log lacks (relogSuffix) stays until
// Observe has stored it (relogLeft).
func (m *Manager) dropEndedTrails() {
	files, _ := filepath.Glob(filepath.Join(m.cfg.StateDir, "audit", "*", "s-*.jsonl"+endedSuffix))
	for _, f := range files {
		if _, err := os.Stat(strings.TrimSuffix(f, endedSuffix) + relogSuffix); err == nil {
			continue
		}
		os.Remove(f)
	}
}

// Observer hears of sessions that became ready and of sessions that
// ended, with their whole audit trail. The recorder, the download watcher
// and the audit log store hang off it. SessionEnded runs apart from the
// reaper, a few at a time; a DELETE answers once it has returned (or the
// request's deadline passed).
type Observer interface {
	SessionRunning(info Info, ep Endpoint)
	SessionEnded(info Info, events []Event)
}

// EarlyObserver is an Observer that hears two things sooner.
// SessionPooled: a warm pool session is ready and belongs to nobody yet
// (not frozen: freezing pools keep their sessions untouched); it comes
// before the session can be claimed, and SessionRunning follows at the
// claim with the tenant's info. The gateway readies there what needs no
// tenant (its download watcher's connection), so a claim does not wait
// for it and the claimant's first requests do not compete with it.
// SessionStopping: any session, pooled or not, is being torn down; it
// comes before the session's address is released (and may be given to
// another session), and before its finalisation, which may wait for a
// slot or for the store.
type EarlyObserver interface {
	SessionPooled(info Info, ep Endpoint)
	SessionStopping(id string)
}

// stopping tells an EarlyObserver that a session is being torn down.
func (m *Manager) stopping(id string) {
	m.mu.Lock()
	o := m.observer
	m.mu.Unlock()
	if eo, ok := o.(EarlyObserver); ok {
		eo.SessionStopping(id)
	}
}

// SessionFinaliser is an Observer whose end-of-session work can fail
// (the artifact store is away, say). The manager then calls
// FinaliseSession instead of SessionEnded, again with backoff until it
// succeeds or the manager closes, apart from the reaper; until then the
// session is not forgotten and its trail file stays on the host.
type SessionFinaliser interface {
	FinaliseSession(ctx context.Context, info Info, events []Event) error
}

// syncAttempts is how many finalisation attempts wait for an adopted
// trail to be matched with the store.
const syncAttempts = 5

// Backoff between attempts to finalise a session.
const (
	finaliseBackoff    = time.Second
	maxFinaliseBackoff = time.Minute
)

// Observe sets the observer and tells it of the sessions already running
// (those adopted after a restart).
func (m *Manager) Observe(o Observer) {
	m.mu.Lock()
	m.observer = o
	if m.observed != nil {
		select {
		case <-m.observed:
		default:
			close(m.observed)
		}
	}
	m.mu.Unlock()
	for _, s := range m.running() {
		m.mu.Lock()
		info, ep, pooled, told := copyInfo(s.info), s.ep, s.pool != nil, s.told
		s.told = s.told || !pooled
		m.mu.Unlock()
		if !pooled && !told { // a pooled session is observed from its claim
			o.SessionRunning(info, ep)
		}
	}
	m.endOrphanTrails(o)
	m.relogLeft(o)
	// Those only the store remembers are found apart: listing every
	// stored trail must not hold back a leader's first answers.
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.endStoredOrphans(o)
	}()
}

// endOrphanTrails reports the sessions that ended while no gateway ran:
// their trail files are left, their sessions are not. A session being
// adopted is not one: under Kubernetes a leader adopts a session a
// replica created alone apart from its start (adoptCreatedAlone), and
// the adoption writes the session's trail file before it holds it.
func (m *Manager) endOrphanTrails(o Observer) {
	files, _ := filepath.Glob(filepath.Join(m.cfg.StateDir, "audit", "*", "s-*.jsonl"))
	for _, f := range files {
		tenant := filepath.Base(filepath.Dir(f))
		id := strings.TrimSuffix(filepath.Base(f), ".jsonl")
		if !ids.IsSession(id) {
			continue
		}
		m.mu.Lock()
		_, live := m.sessions[id]
		claimed := !live && !m.adopting[id] && m.claimOrphanLocked(id)
		m.mu.Unlock()
		if claimed {
			m.endOrphanFile(o, tenant, id)
		}
	}
}

// claimOrphanLocked claims the trail file of session id for its
// finalisation as an orphan's, unless it is claimed already; the
// caller holds mu, and endOrphanFile gives the claim up.
func (m *Manager) claimOrphanLocked(id string) bool {
	if m.orphaning[id] {
		return false
	}
	if m.orphaning == nil {
		m.orphaning = map[string]bool{}
	}
	m.orphaning[id] = true
	return true
}

// endOrphanFile finalises the trail file of session id (claimed,
// claimOrphanLocked), of a session that ended unobserved. A log that
// holds the end already (another replica's host finalised the session
// from the store) takes what the file adds, not a second end.
func (m *Manager) endOrphanFile(o Observer, tenant, id string) {
	defer func() {
		m.mu.Lock()
		delete(m.orphaning, id)
		m.mu.Unlock()
	}()
	if _, err := os.Stat(m.trailPath(tenant, id)); err != nil {
		// Finalised since it was listed (by a takeover's removal, while
		// Observe's pass was on other files): the file goes before the
		// claim is given up.
		return
	}
	ctx, cancel := context.WithTimeout(m.base, time.Minute)
	ended, err := loggedEnd(ctx, o, tenant, id)
	cancel()
	m.endOrphanTrail(o, m.trailPath(tenant, id), tenant, id, err == nil && ended)
}

// endOrphanTrail finalises the session of trail file f, which ended while
// no gateway ran, and removes the file once the store has the trail. It
// says whether it did. ended: its stored log holds its end already, and
// takes no second one.
func (m *Manager) endOrphanTrail(o Observer, f, tenant, id string, ended bool) bool {
	info := Info{ID: id, Tenant: tenant, State: StateStopped, Labels: map[string]string{},
		Failure: "the session ended while no gateway was running"}
	// The store may hold events the file lacks (one the file did not
	// take, stored at once), and its pieces are dropped once the log
	// is stored: the file is matched with them first, as an adopted
	// session's trail is, and kept for the next start while the store
	// cannot be read.
	s := newSess(info) // held by nobody else: not among m.sessions
	s.trail = m.liveTrail(tenant, id, false)
	if m.journalOn() {
		ctx, cancel := context.WithTimeout(m.base, 2*time.Minute)
		err := m.syncTrail(ctx, s)
		cancel()
		if err != nil {
			m.log.Error("the trail of a session that ended while no gateway ran could not be matched with the store; kept for the next start", "session", id, "err", err)
			return false
		}
	}
	t := &s.trail
	now := time.Now().UTC()
	if !ended {
		t.record(now, "ended_unobserved", map[string]any{"note": "the session ended while no gateway was running"})
	}
	t.summarise(now)
	events := t.events()
	// Made recorded, as its created event says: the replica that held
	// its recording gets the time to store what it has.
	if i := slices.IndexFunc(events, func(ev Event) bool { return ev.Type == "created" }); i >= 0 {
		info.Record, _ = events[i].Fields["record"].(bool)
	}
	if fin, ok := o.(SessionFinaliser); ok {
		ctx, cancel := context.WithTimeout(m.base, 2*time.Minute)
		err := fin.FinaliseSession(ctx, info, events)
		cancel()
		if err != nil {
			// The file stays: the next start reports it again.
			m.log.Error("the trail of a session that ended while no gateway ran was not stored; kept for the next start", "session", id, "err", err)
			return false
		}
	} else {
		o.SessionEnded(info, events)
	}
	if m.journalOn() {
		ctx, cancel := context.WithTimeout(m.base, 30*time.Second)
		if err := m.cfg.Trails.DropTrail(ctx, tenant, id); err != nil {
			m.log.Warn("the stored pieces of a finalised audit trail were not removed", "session", id, "err", err)
		}
		cancel()
	}
	os.Remove(f)
	return true
}

// trailEvents reads a session's trail without holding the manager's lock
// during the file read.
func (m *Manager) trailEvents(s *sess) []Event {
	m.mu.Lock()
	path, mem := s.trail.path, append([]Event(nil), s.trail.mem...)
	m.mu.Unlock()
	var out []Event
	if path != "" {
		out = readTrail(path)
	}
	return append(out, mem...)
}

// ended tells the observer a session is over, with its trail, and keeps
// the trail file, marked ended, until the session is forgotten.
func (m *Manager) ended(s *sess) {
	m.mu.Lock()
	if s.pool != nil {
		// A pooled session nobody claimed has no tenant, no trail and
		// no artifacts: it is forgotten at once.
		delete(m.sessions, s.info.ID)
		s.finalised = true
		m.mu.Unlock()
		m.kickRefill()
		return
	}
	s.trail.summarise(time.Now().UTC())
	o := m.observer
	info := copyInfo(s.info)
	m.mu.Unlock()
	f, retry := o.(SessionFinaliser)
	// An adopted trail is matched with the store first: its pieces may
	// hold what the host lacks. A store that cannot be read for a while
	// does not hold the end back for good: the log is stored without
	// them, says so, and the pieces stay.
	matched, told := false, false
	// handed is the trail's write count when it was read for the
	// finaliser: events recorded after that (a preview connection cut
	// as the session stopped, the recording's end) are stored again
	// once the session is finalised.
	var handed int
	events := func() []Event {
		m.mu.Lock()
		handed = s.trail.writes
		m.mu.Unlock()
		return m.trailEvents(s)
	}
	unmatched := func(err error) {
		if told {
			return
		}
		told = true
		m.log.Warn("the audit trail is finalised without what the store holds of it; its pieces stay", "session", info.ID, "err", err)
		m.Record(info.ID, "audit_store_unmatched", map[string]any{"note": "the trail's pieces in MinIO could not be read; they are kept there"})
	}
	switch {
	case retry:
		for attempt, wait := 1, finaliseBackoff; ; attempt, wait = attempt+1, min(2*wait, maxFinaliseBackoff) {
			err := m.ensureSynced(m.base, s)
			if err == nil {
				matched = true
			} else if attempt >= syncAttempts {
				unmatched(err)
				err = nil
			}
			if err == nil {
				err = f.FinaliseSession(m.base, info, events())
			}
			if err == nil {
				break
			}
			m.log.Warn("session not finalised yet; retrying", "session", info.ID, "tenant", info.Tenant, "in", wait, "err", err)
			select {
			case <-m.base.Done():
				// The trail file stays: the next gateway reports it.
				return
			case <-time.After(wait):
			}
		}
	case o != nil:
		if err := m.ensureSynced(m.base, s); err != nil {
			unmatched(err)
		} else {
			matched = true
		}
		o.SessionEnded(info, events())
	}
	// The log artifact has the whole trail: the pieces can go, if they
	// were matched with it.
	m.dropStoredTrail(s, matched)
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.trail.path != "" {
		if err := os.Rename(s.trail.path, s.trail.path+endedSuffix); err == nil {
			s.trail.path += endedSuffix
		}
	}
	s.finalised = true
	if s.trail.writes != handed {
		m.lateEvent(s)
	}
}

// Events returns the session's audit trail, oldest first.
func (m *Manager) Events(tenant, id string) ([]Event, error) {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return nil, err
	}
	// The file is read outside the lock; if it was renamed (the session
	// was finalised) meanwhile, read it again under its new name.
	for {
		m.mu.Lock()
		path, mem := s.trail.path, append([]Event(nil), s.trail.mem...)
		m.mu.Unlock()
		var out []Event
		if path != "" {
			f, err := os.Open(path)
			if err != nil {
				m.mu.Lock()
				moved := s.trail.path != path
				m.mu.Unlock()
				if moved {
					continue
				}
			} else {
				out = readEvents(f)
				f.Close()
			}
		}
		return append(out, mem...), nil
	}
}
