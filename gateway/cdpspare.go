package gateway

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/session"
)

// spares hold, per browser session, one CDP connection to its Chromium's
// browser target, dialled and upgraded before any client asks for it.
// A client that connects to that target through the gateway gets it, so
// its first answer does not wait for a TCP connect and a WebSocket
// handshake into the sandbox (under gVisor's netstack each is slow), and
// another is dialled for the next client. A pooled browser gets its spare
// while it waits, so a claimant's connect is bytes on a ready connection.
//
// A spare is the session's browser and nothing else: it is taken only by
// a client whose token grants that session's browser target (checked at
// the upgrade, as for a dialled connection), and it is closed when its
// session stops, before the session's address can go to another session:
// a dial under way then is cancelled and waited for. Nothing is sent on
// it before a client has it. Page targets get none.
//
// Lock order: spares.mu, then the session manager's lock (live asks it).
type spares struct {
	mu sync.Mutex
	m  map[string]*spare // by session id
	// used counts spares handed to clients; discarded those found closed
	// or not idle when a client came (it dialled instead).
	used, discarded int64
	// wakes are the claimed browsers being woken (wakeBrowser), by
	// session id.
	wakes map[string]*wake
}

// A wake is one request into a claimed session, under way.
type wake struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Bounds of a wake: the whole request, and the answer's headers and
// body (read and dropped).
const (
	wakeLimit = 2 * time.Second
	wakeBytes = 16 << 10
)

// wakeBrowser asks a claimed browser for its /json/version and drops the
// answer. A pooled session has idled since it settled: the first packet
// into it wakes the sandbox's network stack and Chromium's threads,
// which took most of a claimant's first answer (a wake alone took 3-5
// ms under runc and 8-13 ms under gVisor here). Asked as the claim
// answers, that wake runs while the client reads the answer and
// connects. Like a spare's dial, it is made only while the session runs
// (live, asked under the spares' lock) and is cancelled and waited for
// by dropSpare.
func (s *Server) wakeBrowser(id string, ep session.Endpoint, live func() bool) {
	s.spares.mu.Lock()
	if s.spares.wakes[id] != nil || !live() {
		s.spares.mu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), wakeLimit)
	w := &wake{cancel: cancel, done: make(chan struct{})}
	if s.spares.wakes == nil {
		s.spares.wakes = map[string]*wake{}
	}
	s.spares.wakes[id] = w
	s.spares.mu.Unlock()
	go func() {
		defer close(w.done)
		defer func() {
			cancel()
			s.spares.mu.Lock()
			if s.spares.wakes[id] == w {
				delete(s.spares.wakes, id)
			}
			s.spares.mu.Unlock()
		}()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ep.CDP.String()+"/json/version", nil)
		if err != nil {
			return
		}
		req.Host = session.CDPHost
		// No proxy, no connection kept (the address goes to another
		// session after this one), nothing inflated.
		tr := &http.Transport{DisableKeepAlives: true, DisableCompression: true, MaxResponseHeaderBytes: wakeBytes}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, wakeBytes))
		resp.Body.Close()
	}()
}

type spare struct {
	target string // ws://addr:port/devtools/browser/<id>
	conn   net.Conn
	br     *bufio.Reader      // nil while the dial is under way
	cancel context.CancelFunc // ends the dial
	dialed chan struct{}      // closed when the dial has ended
}

// spareDial bounds the dial of a spare.
const spareDial = 10 * time.Second

// spareTarget is the browser target a session's spare connects to, from
// its readiness answer; "" when that does not name one.
func spareTarget(ep session.Endpoint) string {
	bid, err := browser.VersionID(ep.Version)
	if err != nil {
		return ""
	}
	return devtoolsTarget(ep, "browser", bid)
}

// isBrowserTarget: spares are for the browser target only.
func isBrowserTarget(target string) bool {
	return strings.Contains(target, "/devtools/browser/")
}

// prepareSpare dials a spare to target for a session that has none to
// it, in the background. live, when set, is asked under the spares' lock
// whether the session still runs: a session stops (its state changes)
// before dropSpare runs, so no spare is made for one that stopped.
func (s *Server) prepareSpare(id, target string, live func() bool) {
	if !isBrowserTarget(target) {
		return
	}
	s.spares.mu.Lock()
	if live != nil && !live() {
		s.spares.mu.Unlock()
		return
	}
	if old := s.spares.m[id]; old != nil {
		if old.target == target {
			s.spares.mu.Unlock()
			return
		}
		closeSpare(old) // the browser restarted: its old target is gone
	}
	ctx, cancel := context.WithTimeout(context.Background(), spareDial)
	sp := &spare{target: target, cancel: cancel, dialed: make(chan struct{})}
	s.spares.m[id] = sp
	s.spares.mu.Unlock()
	go func() {
		defer close(sp.dialed)
		defer cancel()
		conn, br, err := dialBrowser(ctx, target)
		s.spares.mu.Lock()
		defer s.spares.mu.Unlock()
		if s.spares.m[id] != sp {
			// Dropped or replaced meanwhile.
			if err == nil {
				conn.Close()
			}
			return
		}
		if err != nil {
			delete(s.spares.m, id)
			return
		}
		sp.conn, sp.br = conn, br
	}()
}

// takeSpare hands over the session's spare to target, when it has a
// ready one that is still open, and starts the next while the session
// runs (live). ok false: dial.
func (s *Server) takeSpare(id, target string, live func() bool) (net.Conn, *bufio.Reader, bool) {
	if !isBrowserTarget(target) {
		return nil, nil, false
	}
	s.spares.mu.Lock()
	sp := s.spares.m[id]
	switch {
	case sp != nil && sp.target == target && sp.br == nil:
		s.spares.mu.Unlock()
		return nil, nil, false // still dialling: the client dials too
	case sp == nil || sp.target != target:
		// None yet, or one to a browser that has since restarted: the
		// next client gets one to this target.
		s.spares.mu.Unlock()
		s.prepareSpare(id, target, live)
		return nil, nil, false
	}
	delete(s.spares.m, id)
	s.spares.mu.Unlock()
	defer s.prepareSpare(id, target, live)
	ok := idleOpen(sp.conn, sp.br)
	s.spares.mu.Lock()
	if ok {
		s.spares.used++
	} else {
		s.spares.discarded++
	}
	s.spares.mu.Unlock()
	if !ok {
		sp.conn.Close()
		return nil, nil, false
	}
	return sp.conn, sp.br, true
}

// idleOpen says whether a spare is as it was left: open, with nothing
// received. Chromium sends nothing unasked on a browser connection; a
// closed one (a browser that restarted or went away) has its end queued,
// and one that sent anything is not handed to a client mid-stream.
func idleOpen(conn net.Conn, br *bufio.Reader) bool {
	if br.Buffered() > 0 {
		return false
	}
	_, err := peekNow(conn)
	return errors.Is(err, unix.EAGAIN)
}

// dropSpare closes the session's spare. One still dialling is cancelled
// and waited for (a cancelled dial ends at once), so that no connection
// into the session's address is made after this returns.
func (s *Server) dropSpare(id string) {
	s.spares.mu.Lock()
	sp := s.spares.m[id]
	delete(s.spares.m, id)
	w := s.spares.wakes[id]
	delete(s.spares.wakes, id)
	s.spares.mu.Unlock()
	if sp != nil {
		closeSpare(sp)
		<-sp.dialed
	}
	if w != nil {
		w.cancel()
		<-w.done
	}
}

// closeSpare ends a spare: its dial is cancelled, and a ready one is
// closed (a dial that ends after this finds the spare is no longer the
// session's, and closes what it made).
func closeSpare(sp *spare) {
	sp.cancel()
	if sp.conn != nil {
		sp.conn.Close()
	}
}

// spareCounts are the spares open, used and discarded, for /metrics.
func (s *Server) spareCounts() (open int, used, discarded int64) {
	s.spares.mu.Lock()
	defer s.spares.mu.Unlock()
	for _, sp := range s.spares.m {
		if sp.conn != nil {
			open++
		}
	}
	return open, s.spares.used, s.spares.discarded
}
