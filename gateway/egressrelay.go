package gateway

import (
	"net/netip"
	"time"

	"github.com/sandgate/sandgate/ids"
)

// The egress proxy of a replica that stands by (backend kubernetes:
// every replica serves the sessions' egress, the leader's knows its
// sessions, the others read them from their Pods) reports its events
// as the relay reports its connections': each is kept for the next
// report, named by a ticket of the session's (scopeShell) signed here,
// and the leader records it as its own proxy's, with fields it makes
// from bounded values (egressFields).

// egressEvents are the types the proxy records.
var egressEvents = map[string]bool{
	"egress_allowed": true, "egress_denied": true, "egress_failed": true, "egress_limited": true,
	"credential_used": true, "credential_refused": true, "credential_unavailable": true,
	"placeholder_not_swapped": true,
	// How many of a session's were dropped here (the relay's own).
	"egress_dropped": true,
}

// maxEgressHost bounds a host as an event carries it: a name is at most
// 253 bytes, and a refused destination says its scheme too.
const maxEgressHost = 300

// egressTicket is the ticket a session's egress events are reported
// by, and until when it lasts.
type egressTicket struct {
	tenant string
	ticket string
	until  time.Time
}

// maxEgressKept bounds the egress events kept for the reports (those of
// a browser that opens connections by the thousand, while no leader
// answers), and maxEgressSession a session's: past them, its events are
// dropped (not the other events, nor the other sessions'), and counted
// in an egress_dropped of the session, which the leader records.
const (
	maxEgressKept    = maxRelayEvents / 4
	maxEgressSession = maxEgressKept / 8
)

// egressCount: a session's egress events kept, and dropped.
type egressCount struct{ kept, dropped int }

// maxEgressTickets bounds the tickets kept; past it, they are signed
// afresh.
const maxEgressTickets = 4096

// EgressSession makes ready to report the egress events of session id,
// tenant's, which expires at expires (its proxy has found it): its
// ticket, signed again once the session outlasts the one signed before.
func (s *Server) EgressSession(tenantName, id string, expires time.Time) {
	l, ok := s.live.(*relayLive)
	if !ok || !ids.IsSession(id) {
		return
	}
	if err := l.egressTicket(tenantName, id, expires); err != nil {
		l.log.Warn("the session's egress events will not be reported: their ticket cannot be signed", "session", id, "err", err)
	}
}

// EgressEvent keeps an event of this replica's egress proxy for the
// next report to the leader, if its session is one EgressSession made
// ready (a replica that leads records its proxy's events itself).
func (s *Server) EgressEvent(id, typ string, fields map[string]any) {
	l, ok := s.live.(*relayLive)
	if !ok || !egressEvents[typ] {
		return
	}
	if typ == "egress_dropped" {
		return // (counted here, not by the proxy)
	}
	l.mu.Lock()
	t, ok := l.egressTickets[id]
	if !ok {
		l.mu.Unlock()
		return
	}
	c := l.egressBy[id]
	if c == nil {
		c = &egressCount{}
		l.egressBy[id] = c
	}
	if l.egressKept >= maxEgressKept || c.kept >= maxEgressSession {
		l.egressDropped++
		c.dropped++
		l.mu.Unlock()
		return
	}
	c.kept++ // (before event counts it among all: it may be dropped at once)
	l.mu.Unlock()
	ev := relayEvent{Token: t.ticket, Type: typ, egress: id}
	ev.Host, _ = fields["host"].(string)
	ev.Host = truncate(ev.Host, maxEgressHost)
	ev.Address, _ = fields["address"].(string)
	ev.Via, _ = fields["via"].(string)
	ev.Credential, _ = fields["credential"].(string)
	ev.Reason, _ = fields["reason"].(string)
	ev.Reason = truncate(ev.Reason, 200)
	switch v := fields["port"].(type) {
	case uint16:
		ev.Port = int(v)
	case int:
		ev.Port = v
	}
	if v, ok := fields["refused"].(int); ok {
		ev.Refused = v
	}
	l.event(ev)
}

// taken counts the egress events among evs, which leave the events
// kept. l.mu is held.
func (l *relayLive) taken(evs []relayEvent) {
	for _, ev := range evs {
		if !egressEvents[ev.Type] {
			continue
		}
		l.egressKept--
		if c := l.egressBy[ev.egress]; c != nil {
			c.kept--
			if c.kept <= 0 && c.dropped == 0 {
				delete(l.egressBy, ev.egress)
			}
		}
	}
}

// keepDropsLocked keeps, for each session whose egress events were
// dropped, an egress_dropped that counts them. l.mu is held.
func (l *relayLive) keepDropsLocked() {
	for id, c := range l.egressBy {
		t, ok := l.egressTickets[id]
		switch {
		case !ok && c.kept <= 0:
			delete(l.egressBy, id) // its ticket forgotten: nothing to say it by
			continue
		case c.dropped == 0 || !ok:
			continue
		}
		ev := relayEvent{Token: t.ticket, Type: "egress_dropped", Refused: c.dropped, egress: id}
		ev.measure()
		c.dropped = 0
		c.kept++
		l.keepLocked(ev)
	}
}

// egressTicket signs session id's ticket for its egress events, unless
// the one it has lasts past the session's expiry.
func (l *relayLive) egressTicket(tenantName, id string, expires time.Time) error {
	until := expires.Add(time.Minute)
	l.mu.Lock()
	t, ok := l.egressTickets[id]
	l.mu.Unlock()
	if ok && t.tenant == tenantName && !t.until.Before(until) {
		return nil
	}
	claims := shellClaims(tenantName, id, "")
	claims.ExpiresAt = jwtTime(until)
	ticket, err := l.signer.issue(*claims)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.egressTickets) >= maxEgressTickets {
		now := time.Now()
		for k, t := range l.egressTickets {
			if t.until.Before(now) {
				delete(l.egressTickets, k)
			}
		}
		if len(l.egressTickets) >= maxEgressTickets {
			clear(l.egressTickets) // signed again as their sessions are found
		}
	}
	l.egressTickets[id] = egressTicket{tenant: tenantName, ticket: ticket, until: until}
	return nil
}

// egressFields are the fields the leader records for an egress event a
// replica reported: those its own proxy records for the type, each
// checked (an address that is none, a port out of range, a credential
// id that cannot be, a way through the proxy it does not take are left
// out), or false when ev is no egress event.
func egressFields(ev relayEvent) (map[string]any, bool) {
	if !egressEvents[ev.Type] {
		return nil, false
	}
	f := map[string]any{}
	host := truncate(ev.Host, maxEgressHost)
	port := func() {
		if ev.Port > 0 && ev.Port <= 65535 {
			f["port"] = ev.Port
		}
	}
	address := func() {
		if a, err := netip.ParseAddr(ev.Address); err == nil {
			f["address"] = a.String()
		}
	}
	credential := func() {
		if ids.IsCredential(ev.Credential) {
			f["credential"] = ev.Credential
		}
	}
	reason := func() { f["reason"] = truncate(ev.Reason, 200) }
	switch ev.Type {
	case "egress_allowed":
		f["host"] = host
		port()
		address()
		if ev.Via == "http" || ev.Via == "tunnel" || ev.Via == "intercept" {
			f["via"] = ev.Via
		}
	case "egress_denied":
		f["host"] = host
		port()
		reason()
	case "egress_failed":
		f["host"] = host
		port()
		address()
	case "egress_limited":
		reason()
		f["refused"] = max(ev.Refused, 0)
	case "credential_used":
		credential()
		f["host"] = host
		port()
		if ev.Via == "header" || ev.Via == "placeholder" {
			f["via"] = ev.Via
		}
	case "credential_refused":
		credential()
		f["host"] = host
		reason()
	case "credential_unavailable":
		credential()
		f["host"] = host
	case "placeholder_not_swapped":
		f["host"] = host
		port()
		reason()
	case "egress_dropped":
		f["dropped"] = max(ev.Refused, 0)
		f["reason"] = "more egress events than a replica standing by keeps for the leader"
	}
	return f, true
}
