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

// maxStoredOrphans bounds the trails one start looks through.
const maxStoredOrphans = 10000

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
	var left [][2]string
	listed := false
	for wait := finaliseBackoff; ; wait = min(2*wait, maxFinaliseBackoff) {
		if !listed {
			var err error
			if left, err = m.storedOrphans(lister); err != nil {
				m.log.Warn("the stored audit trails could not be listed to find the sessions that ended while no gateway ran; trying again", "err", err)
			} else {
				listed = true
			}
		}
		if listed {
			left = slices.DeleteFunc(left, func(t [2]string) bool { return m.base.Err() == nil && m.endStoredOrphan(o, t[0], t[1]) })
			if len(left) == 0 {
				return
			}
		}
		select {
		case <-m.base.Done():
			return
		case <-time.After(wait):
		}
	}
}

// storedOrphans lists the tenant and id of the sessions whose trail the
// store holds pieces of and that nothing else holds: the manager, a
// sandbox (read now, not at the start: one made since is spared) or a
// trail file on this host (endOrphanTrails' own).
func (m *Manager) storedOrphans(lister TrailLister) ([][2]string, error) {
	ctx, cancel := context.WithTimeout(m.base, time.Minute)
	defer cancel()
	var found [][2]string
	err := lister.Trails(ctx, func(tn, id string) bool {
		// They name a file on this host: only well-formed names.
		if ids.IsSession(id) && tenant.ValidName(tn) {
			found = append(found, [2]string{tn, id})
		}
		return len(found) < maxStoredOrphans
	})
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return nil, nil
	}
	boxes, err := m.backend.List(ctx)
	if err != nil {
		return nil, err
	}
	held := map[string]bool{}
	for _, sb := range boxes {
		held[sb.ID()] = true
	}
	return slices.DeleteFunc(found, func(t [2]string) bool {
		m.mu.Lock()
		_, live := m.sessions[t[1]]
		m.mu.Unlock()
		_, err := os.Stat(m.trailPath(t[0], t[1]))
		return live || held[t[1]] || err == nil
	}), nil
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
	return m.endOrphanTrail(o, t.path, tenant, id)
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

// scopeTag is the tag of the gateway's Scope that its sessions' created
// events carry: a hash, so the trail a tenant reads names no host or
// namespace. Empty when there is no Scope.
func (m *Manager) scopeTag() string {
	if m.cfg.Scope == "" {
		return ""
	}
	h := sha256.Sum256([]byte(m.cfg.Scope))
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

// ownTrail tells whether a trail is of a session this gateway's scope
// created: its created event carries the gateway's tag. A trail from
// before tags, or another gateway's sharing the store, is not.
func (m *Manager) ownTrail(events []Event) bool {
	tag := m.scopeTag()
	i := slices.IndexFunc(events, func(ev Event) bool { return ev.Type == "created" })
	return tag != "" && i >= 0 && events[i].Fields["scope"] == tag
}
