package session

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"slices"
	"time"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/tenant"
)

// LogReader is an Observer that reads a session's stored audit log: its
// events, and whether there is one.
type LogReader interface {
	StoredLog(ctx context.Context, tenant, id string) ([]Event, bool, error)
}

// maxStoredOrphans bounds the trails one look takes: those this gateway
// marked, or none did (another gateway's are passed over uncounted). A
// variable for the tests.
var maxStoredOrphans = 10000

// endStoredOrphans finalises the sessions that only the store's trail
// pieces remember: no sandbox, no trail file on this host, not among the
// manager's. Their sandbox went while no gateway ran or led (a Pod
// deleted, evicted or drained while a leader died, or after it died
// stopping it; a container gone with the host's trail file). Only the
// sessions of this gateway's scope (ownTrail). Each is finalised as one
// with a trail file is (endOrphanTrail), from a file made from the
// pieces: its log stored, with ended_unobserved, its recording
// collected and finished, its pieces removed. One whose stored log
// already holds its end has what its pieces hold added to the log, then
// loses them. What cannot be done yet is tried again with backoff until
// the manager closes.
func (m *Manager) endStoredOrphans(o Observer) {
	lister, ok := m.cfg.Trails.(TrailLister)
	if !ok || m.scopeTag() == "" {
		return
	}
	left := map[[2]string]bool{}
	list := true // again while a trail was too fresh to take
	for wait := finaliseBackoff; ; wait = min(2*wait, maxFinaliseBackoff) {
		pause := wait
		if list {
			found, next, err := m.storedOrphans(lister)
			if err != nil {
				m.log.Warn("the stored audit trails could not be listed to find the sessions that ended while no gateway ran; trying again", "err", err)
			} else {
				for _, t := range found {
					left[t] = true
				}
				list = !next.IsZero()
				if list {
					pause = max(pause, time.Until(next))
				}
			}
		}
		for t := range left {
			if m.base.Err() != nil {
				return
			}
			if m.endStoredOrphan(o, t[0], t[1]) {
				delete(left, t)
			}
		}
		if len(left) == 0 && !list {
			return
		}
		select {
		case <-m.base.Done():
			return
		case <-time.After(pause):
		}
	}
}

// storedOrphans lists the tenant and id of the sessions whose trail the
// store holds pieces of and that nothing else holds: the manager, a
// sandbox (read now, not at the start: one made since is spared) or a
// trail file on this host (endOrphanTrails' own). A trail written to
// within Config.OrphanQuiet is left for a later look, from next on: a
// leader that was paused, not dead, may be writing it still, or making
// its sandbox.
func (m *Manager) storedOrphans(lister TrailLister) (found [][2]string, next time.Time, err error) {
	ctx, cancel := context.WithTimeout(m.base, time.Minute)
	defer cancel()
	type stored struct {
		tenant, id string
		newest     time.Time
	}
	var all []stored
	own, listed := m.scopeTag(), 0
	err = lister.Trails(ctx, func(tn, id, scope string, newest time.Time) bool {
		// They name a file on this host: only well-formed names. Those
		// marked by another gateway are passed over unread and not
		// counted against maxStoredOrphans (but against 10 times it:
		// the listing too has its bound); those without one mark (from
		// before the mark, or adopted by a host that lost its scope)
		// are read, by endStoredOrphan, for the tags in their events.
		listed++
		if ids.IsSession(id) && tenant.ValidName(tn) && (scope == "" || scope == own) {
			all = append(all, stored{tn, id, newest})
		}
		return len(all) < maxStoredOrphans && listed < 10*maxStoredOrphans
	})
	if err != nil || len(all) == 0 {
		return nil, time.Time{}, err
	}
	boxes, err := m.backend.List(ctx)
	if err != nil {
		return nil, time.Time{}, err
	}
	held := map[string]bool{}
	for _, sb := range boxes {
		held[sb.ID()] = true
	}
	now := time.Now()
	for _, t := range all {
		m.mu.Lock()
		_, live := m.sessions[t.id]
		m.mu.Unlock()
		if _, err := os.Stat(m.trailPath(t.tenant, t.id)); live || held[t.id] || err == nil {
			continue
		}
		if ripe := t.newest.Add(m.cfg.OrphanQuiet); ripe.After(now) {
			if next.IsZero() || ripe.Before(next) {
				next = ripe
			}
			continue
		}
		found = append(found, [2]string{t.tenant, t.id})
	}
	return found, next, nil
}

// endStoredOrphan finalises one session storedOrphans found, and says
// whether it is done with it.
func (m *Manager) endStoredOrphan(o Observer, tenant, id string) bool {
	log := m.log.With("session", id, "tenant", tenant)
	ctx, cancel := context.WithTimeout(m.base, 2*time.Minute)
	defer cancel()
	events, err := m.readStoredTrail(ctx, tenant, id)
	if err != nil {
		log.Warn("the stored audit trail of a session that ended while no gateway ran could not be read; trying again", "err", err)
		return false
	}
	if !m.ownTrail(events) {
		// Another gateway's that shares the store (its sandbox is not
		// this backend's to see), or one from before scopes were
		// recorded, or pieces after a gap: nothing here to finalise.
		log.Debug("a stored audit trail that this gateway did not make is left alone", "events", len(events))
		return true
	}
	ended, err := loggedEnd(ctx, o, tenant, id)
	if err != nil {
		log.Warn("the stored audit log of a session that ended while no gateway ran could not be read; trying again", "err", err)
		return false
	}
	if ended {
		// Finalised already: its pieces stayed because their removal
		// failed, or because the store could not be read as it ended
		// (audit_store_unmatched), when they hold what the log lacks.
		// The log takes what it lacks of them first (a merge adds only
		// that), then they go.
		r, ok := o.(TrailRestorer)
		if !ok {
			return true
		}
		if err := r.StoreTrail(ctx, Info{ID: id, Tenant: tenant}, events); err != nil {
			log.Warn("the stored pieces of a finalised audit trail could not be added to its log; trying again", "err", err)
			return false
		}
		if err := m.cfg.Trails.DropTrail(ctx, tenant, id); err != nil {
			log.Warn("the stored pieces of a finalised audit trail were not removed; trying again", "err", err)
			return false
		}
		return true
	}
	log.Info("finalising a session that ended while no gateway ran, from its stored audit trail", "events", len(events))
	t := m.openTrail(tenant, id)
	if t.path == "" || !t.rewrite(events) {
		log.Warn("the stored audit trail of a session that ended while no gateway ran could not be written on this host; trying again")
		return false
	}
	return m.endOrphanTrail(o, t.path, tenant, id, false) // (its log does not end: read above)
}

// loggedEnd tells whether the session's stored log holds its end, as o
// reads it (false when o reads no logs).
func loggedEnd(ctx context.Context, o Observer, tenant, id string) (bool, error) {
	lr, ok := o.(LogReader)
	if !ok {
		return false, nil
	}
	stored, _, err := lr.StoredLog(ctx, tenant, id)
	return slices.ContainsFunc(stored, func(ev Event) bool { return endEvents[ev.Type] }), err
}

// endEvents are the events a session's trail ends with once the session
// is over: its final state, or the note that it ended unobserved.
var endEvents = map[string]bool{string(StateStopped): true, string(StateFailed): true, "ended_unobserved": true}

// putPiece stores a piece of the trail, marked with this gateway's scope
// where the store keeps marks: the next gateway's pass over the store
// then passes over other gateways' trails without reading them.
func (m *Manager) putPiece(ctx context.Context, tenant, id string, start int, lines []byte) error {
	if mk, ok := m.cfg.Trails.(TrailMarker); ok && m.scopeTag() != "" {
		return mk.PutScopedTrail(ctx, tenant, id, m.scopeTag(), start, lines)
	}
	return m.cfg.Trails.PutTrail(ctx, tenant, id, start, lines)
}

// scopeTag is the tag of the gateway's Scope that its sessions' created
// events carry: a hash, so the trail a tenant reads names no host or
// namespace. Empty when there is no Scope.
func (m *Manager) scopeTag() string { return scopeTagOf(m.cfg.Scope) }

// scopeTagOf is the tag of the scope ("" for none).
func scopeTagOf(scope string) string {
	if scope == "" {
		return ""
	}
	h := sha256.Sum256([]byte(scope))
	return hex.EncodeToString(h[:8])
}

// createdFields are a session's created event's fields.
func (m *Manager) createdFields(info Info) map[string]any {
	f := map[string]any{"kind": info.Kind, "runtime": info.Runtime, "record": info.Record}
	if tag := m.scopeTag(); tag != "" {
		f["scope"] = tag
	}
	return f
}

// ownTrail tells whether a trail is of a session of this gateway's
// scope: its created event carries the gateway's tag, or, for one made
// before created events carried it, an adopted event does. Another
// gateway's sharing the store is not, nor one no tagged gateway held.
func (m *Manager) ownTrail(events []Event) bool {
	tag := m.scopeTag()
	return tag != "" && slices.ContainsFunc(events, func(ev Event) bool {
		return (ev.Type == "created" || ev.Type == "adopted") && ev.Fields["scope"] == tag
	})
}
