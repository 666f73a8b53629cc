package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/recordings"
)

// Front owns a gateway replica's listener from the start. While another
// replica leads the namespace's sessions, it forwards each connection,
// bytes as they come, to the leader (so a client may address any
// replica; the first request says so: ForwardedHeader) and answers /healthz (alive, standing by) and /readyz itself
// (ready while a leader answers: a Service may send here too), and
// hands /metrics to its relay (the replica's own). While
// this replica takes the lead and adopts the sessions, it answers 503,
// with a Retry-After. Once Lead is called, the connections go to the gateway,
// through Listener; the forwarded ones, to a leader that stopped, are
// cut.
type Front struct {
	ln  net.Listener
	log *slog.Logger
	// leader is where the leading replica serves: "" while nobody
	// leads, or while this replica takes over.
	leader func(context.Context) (addr string, relays Relays, err error)

	mu        sync.Mutex
	leading   bool
	taking    bool
	forwarded map[net.Conn]struct{}
	cached    string
	// cachedRelays: what the cached leader answers relaying replicas.
	cachedRelays Relays
	cachedAt     time.Time

	// lookup lets one read of the leader run at a time: the others
	// wait for it and take its answer (or its error) from the cache.
	lookup  sync.Mutex
	lastErr error

	slots chan struct{} // connections being answered or forwarded
	conns chan net.Conn
	// relay takes the preview connections while this replica stands by
	// (RelayListener); nil: they are forwarded too. relayDone is closed
	// once the relay stops serving.
	relay       chan net.Conn
	relayDone   chan struct{}
	relayOnce   sync.Once
	relayUsable func(kind Relays) bool // false: forward those of kind for now
	closed      chan struct{}
	once        sync.Once
	// served is closed once the gateway stops serving (it closed
	// Listener): connections get 503 until Close.
	served    chan struct{}
	serveOnce sync.Once
}

// Bounds of what a replica standing by reads before it forwards: the
// request line, within frontHeadTimeout.
const (
	frontMaxLine     = 8 << 10
	frontHeadTimeout = 10 * time.Second
	frontDial        = 3 * time.Second
	frontProbeDial   = 500 * time.Millisecond
	frontLeaderCache = time.Second
	// frontMaxConns bounds the connections a replica standing by
	// answers or forwards at once; past it, new ones are closed.
	frontMaxConns = 4096
	// frontLinger: once one direction of a forwarded connection has
	// ended, the other gets this long to finish.
	frontLinger = 30 * time.Second
)

// ForwardedHeader is the header a replica standing by adds to the first
// request of a connection it forwards to the leader, which closes such a
// connection after its answer (but for an upgrade): each request of a
// client that keeps its connection is routed on its own. It is no
// credential: a client that sends it only has its own connection
// closed.
const ForwardedHeader = "Sandgate-Forwarded"

// Relays is what a leader admits of the connections replicas that
// stand by carry themselves.
type Relays struct {
	Previews  bool // CDP and VNC
	Exec      bool // shells and commands (the Pod exec API)
	Files     bool // file uploads and downloads (the Pod exec API too)
	Actions   bool // actions and screenshots
	Snapshots bool // workspace snapshots (the Pod exec API, and the store)
}

// NewFront serves ln; leader reads where the leading replica serves,
// and what it admits of replicas that relay.
func NewFront(ln net.Listener, leader func(context.Context) (addr string, relays Relays, err error), log *slog.Logger) *Front {
	f := &Front{ln: ln, log: log, leader: leader, forwarded: map[net.Conn]struct{}{},
		slots: make(chan struct{}, frontMaxConns), conns: make(chan net.Conn), closed: make(chan struct{}), served: make(chan struct{})}
	go f.accept()
	return f
}

// TakingOver says this replica has the lead and is adopting the
// sessions: connections get 503 until Lead.
func (f *Front) TakingOver() {
	f.mu.Lock()
	f.taking = true
	f.mu.Unlock()
}

// Lead hands the connections to the gateway (Listener) from now on and
// cuts those forwarded to the replica that led before.
func (f *Front) Lead() {
	f.mu.Lock()
	f.leading = true
	cut := f.forwarded
	f.forwarded = map[net.Conn]struct{}{}
	f.mu.Unlock()
	for c := range cut {
		c.Close()
	}
}

// Listener is what the gateway serves once this replica leads. Closing
// it (the gateway stops serving) leaves the socket to the Front, which
// answers 503 from then on, until Close: a replica holds its port until
// it has given its leases back, so the next run of its container knows
// it is gone (see kube.FreeDeadHold).
func (f *Front) Listener() net.Listener {
	return frontListener{f: f, conns: f.conns, done: f.served, once: &f.serveOnce}
}

// RelayListener is what a relay (NewRelay) serves: the connections
// this replica is sent while it stands by that it carries itself (see
// relayable) rather than forwarding them to the leader, while the
// leader admits their kind and usable says so. Call it once, before
// such connections come; until then they are forwarded.
func (f *Front) RelayListener(usable func(kind Relays) bool) net.Listener {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.relay == nil {
		f.relay, f.relayDone, f.relayUsable = make(chan net.Conn), make(chan struct{}), usable
	}
	return frontListener{f: f, conns: f.relay, done: f.relayDone, once: &f.relayOnce}
}

// relayable is which of what a relay carries a request is: a preview
// connection's (CDP, VNC; a view preview's page and its assets too), a
// session's shell or command (exec), a session's file, action,
// screenshot or snapshot taken, or neither (the zero Relays).
func relayable(method, path string) Relays {
	if path == "/cdp" || strings.HasPrefix(path, "/cdp/") || strings.HasPrefix(path, "/vnc/") ||
		method == "GET" && (strings.HasPrefix(path, "/view/") || strings.HasPrefix(path, "/viewer-assets/")) {
		return Relays{Previews: true}
	}
	rest, ok := strings.CutPrefix(path, "/v1/sessions/")
	id, tail, _ := strings.Cut(rest, "/")
	if !ok || !ids.IsSession(id) {
		return Relays{}
	}
	return Relays{Exec: method == "GET" && tail == "shell" || method == "POST" && tail == "exec",
		Files:     (method == "GET" || method == "PUT") && tail == "files",
		Actions:   method == "POST" && (tail == "actions" || tail == "screenshot"),
		Snapshots: method == "POST" && tail == "snapshots"}
}

// answersAlone: a request creates a session, reads one, lists them,
// reads the tenant's usage, the runtimes or the pools, extends or
// deletes a session, issues or revokes a session's preview, reads its
// trail, its artifacts, its snapshots or an artifact's link, is a
// review link's, stores, lists, reads or deletes a credential, creates,
// lists, reads, deletes or rolls back a profile, reads the admin API's
// tenants or keys, is the MCP endpoint's or reads the OpenAPI document,
// which a relay answers itself when no leader takes it.
func answersAlone(method, path string) bool {
	if path == "/v1/sessions" && method == "POST" {
		return true
	}
	if path == "/v1/credentials" {
		return method == "GET" || method == "POST"
	}
	if path == "/mcp" {
		return method == "POST" || method == "GET" || method == "DELETE"
	}
	if path == "/openapi.yaml" || path == "/openapi.json" {
		return method == "GET"
	}
	if pid, ok := strings.CutPrefix(path, "/v1/profiles/"); ok && method != "GET" {
		// (Any id: one that is none is the store's 404, as on a leader.)
		id, tail, more := strings.Cut(pid, "/")
		return id != "" && (method == "DELETE" && !more || method == "POST" && tail == "rollback")
	}
	if cid, ok := strings.CutPrefix(path, "/v1/credentials/"); ok {
		// (Any id: one that is none is the vault's 404, as on a leader.)
		return (method == "GET" || method == "DELETE") && cid != "" && !strings.Contains(cid, "/")
	}
	if path == "/v1/profiles" {
		return method == "GET" || method == "POST"
	}
	if method == "GET" {
		if pid, ok := strings.CutPrefix(path, "/v1/profiles/"); ok {
			// (Any id: one that is none is the store's 404, as on a leader.)
			return pid != "" && !strings.Contains(pid, "/")
		}
		if path == "/v1/sessions" || path == "/v1/usage" || path == "/v1/runtimes" || path == "/v1/pools" || path == "/admin/v1/tenants" {
			return true
		}
		if rest, ok := strings.CutPrefix(path, "/admin/v1/tenants/"); ok {
			// (Any name: one that is none is the copy's 404, as on a
			// leader.)
			name, tail, more := strings.Cut(rest, "/")
			return name != "" && (!more || tail == "keys")
		}
		if id, ok := strings.CutPrefix(path, "/v1/artifacts/"); ok {
			return recordings.IsArtifact(id)
		}
		if rest, ok := strings.CutPrefix(path, "/review/"); ok {
			token, tail, more := strings.Cut(rest, "/")
			id, artifact := strings.CutPrefix(tail, "artifacts/")
			return token != "" && (!more || artifact && recordings.IsArtifact(id))
		}
	}
	rest, ok := strings.CutPrefix(path, "/v1/sessions/")
	id, tail, _ := strings.Cut(rest, "/")
	if !ok || !ids.IsSession(id) {
		return false
	}
	preview, revokes := strings.CutPrefix(tail, "previews/")
	switch method {
	case "GET":
		return tail == "" && !strings.Contains(rest, "/") || tail == "events" || tail == "artifacts" || tail == "snapshots"
	case "POST":
		return tail == "previews" || tail == "extend"
	case "DELETE":
		return tail == "" && !strings.Contains(rest, "/") || revokes && ids.IsPreview(preview)
	}
	return false
}

// Close stops accepting and cuts the forwarded connections.
func (f *Front) Close() error {
	f.once.Do(func() { close(f.closed) })
	err := f.ln.Close()
	f.mu.Lock()
	cut := f.forwarded
	f.forwarded = map[net.Conn]struct{}{}
	f.mu.Unlock()
	for c := range cut {
		c.Close()
	}
	return err
}

type frontListener struct {
	f     *Front
	conns chan net.Conn
	done  chan struct{} // closed by Close
	once  *sync.Once
}

func (l frontListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.f.closed:
		return nil, net.ErrClosed
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close ends what the listener's server takes; the Front keeps the
// socket (Front.Close lets it go).
func (l frontListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}
func (l frontListener) Addr() net.Addr { return l.f.ln.Addr() }

func (f *Front) accept() {
	var delay time.Duration
	for {
		c, err := f.ln.Accept()
		if err != nil {
			select {
			case <-f.closed:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				f.once.Do(func() { close(f.closed) })
				return
			}
			// Out of descriptors, say: wait a little, as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			f.log.Warn("accept", "err", err)
			time.Sleep(delay)
			continue
		}
		delay = 0
		f.mu.Lock()
		leading := f.leading
		f.mu.Unlock()
		if !leading {
			select {
			case f.slots <- struct{}{}:
				go func() {
					defer func() { <-f.slots }()
					f.standBy(c)
				}()
			default:
				c.Close() // as many as it takes: the client retries
			}
			continue
		}
		select {
		case f.conns <- c:
		case <-f.served:
			// The gateway has stopped; this replica gives its leases
			// back before it lets the port go.
			select {
			case f.slots <- struct{}{}:
				go func() {
					defer func() { <-f.slots }()
					frontAnswer(c, 503, "unavailable", "this gateway replica is stopping; retry", 2)
				}()
			default:
				c.Close()
			}
		case <-f.closed:
			c.Close()
			return
		}
	}
}

// standBy answers or forwards one connection while another replica
// leads (or this one takes over).
func (f *Front) standBy(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(frontHeadTimeout))
	br := bufio.NewReaderSize(c, frontMaxLine)
	line, err := br.ReadSlice('\n')
	// Empty lines before a request line are skipped, as the gateway's
	// server skips them (a few).
	for skipped := 0; err == nil && len(bytes.TrimRight(line, "\r\n")) == 0 && skipped < 8; skipped++ {
		line, err = br.ReadSlice('\n')
	}
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			frontAnswer(c, 431, "invalid_argument", "the request line is too long", 0)
		} else {
			c.Close()
		}
		return
	}
	if len(bytes.TrimRight(line, "\r\n")) == 0 {
		// More than a few: refused, never passed on unmarked.
		frontAnswer(c, 400, "invalid_argument", "no request line after the empty lines", 0)
		return
	}
	method, path := requestTarget(line)
	kind := relayable(method, path)
	f.mu.Lock()
	taking, leading, relay, relayDone := f.taking, f.leading, f.relay, f.relayDone
	f.mu.Unlock()
	switch {
	case leading:
		// The lead came while this request was read: the gateway gets
		// it whole, what was read first.
		c.SetReadDeadline(time.Time{})
		f.handOver(c, br, line, f.conns, f.served)
		return
	case relay != nil && !taking && kind != (Relays{}) && f.relayUsable(kind) && f.leaderRelays(kind):
		c.SetReadDeadline(time.Time{})
		f.handOver(c, br, line, relay, relayDone)
		return
	case method == "GET" && path == "/metrics":
		// Each replica's own (its process, what it carries): a scrape
		// of every replica's Pod counts the sessions once, at the
		// leader. Not the leader's while this replica starts its relay
		// or takes over.
		if relay == nil || taking {
			frontAnswer(c, 503, "unavailable", "this gateway replica's metrics are not served yet (it starts, or takes over the sessions)", 0)
			return
		}
		c.SetReadDeadline(time.Time{})
		f.handOver(c, br, line, relay, relayDone)
		return
	case method == "GET" && path == "/healthz":
		status := "standby"
		if taking {
			status = "taking over"
		}
		frontJSON(c, 200, map[string]any{"status": status})
		return
	case method == "GET" && path == "/readyz":
		// Ready while there is a leader that answers, to forward to,
		// so that a Service may send here too and a rolling update goes
		// on; not while nobody leads, the leader does not answer (it
		// died; its lease has yet to run out) or this replica takes
		// over.
		if !taking && f.leaderAnswers() {
			frontJSON(c, 200, map[string]any{"status": "standby"})
		} else {
			frontAnswer(c, 503, "unavailable", "no gateway replica that answers leads the sessions", 0)
		}
		return
	case taking:
		frontAnswer(c, 503, "unavailable", "this gateway replica is taking over the sessions; retry", 2)
		return
	}
	// A session read, or a preview's issue or revocation, no leader
	// takes, the relay answers by the sessions' Pods (NewRelay,
	// RelayAlone).
	aloneAnswers := func() bool {
		if relay == nil || !answersAlone(method, path) {
			return false
		}
		c.SetReadDeadline(time.Time{})
		f.handOver(c, br, line, relay, relayDone)
		return true
	}
	addr, err := f.leaderAddr()
	if err != nil || addr == "" {
		if !aloneAnswers() {
			frontAnswer(c, 503, "unavailable", "no gateway replica leads the sessions yet; retry", 2)
		}
		return
	}
	up, err := net.DialTimeout("tcp", addr, frontDial)
	if err != nil {
		f.forget(addr)
		if !aloneAnswers() {
			frontAnswer(c, 503, "unavailable", "the leading gateway replica does not answer; retry (another takes over)", 2)
		}
		return
	}
	// Tracked before anything is sent, so that a lead that comes now
	// cuts the connection before the old leader has seen a request. A
	// lead that came while the leader was looked up or dialled gets the
	// request, whole.
	if !f.track(c, up) {
		up.Close()
		f.mu.Lock()
		leading := f.leading
		f.mu.Unlock()
		if !leading {
			c.Close()
			return
		}
		c.SetReadDeadline(time.Time{})
		f.handOver(c, br, line, f.conns, f.served)
		return
	}
	defer func() {
		f.untrack(c, up)
		c.Close()
		up.Close()
	}()
	c.SetReadDeadline(time.Time{})
	// What was read goes first, then the rest as it comes. The request
	// says it was forwarded (ForwardedHeader, after its request line),
	// so that the leader closes the connection once it has answered: a
	// client that keeps its connection sends its next request on a new
	// one, which this replica routes afresh (relays, say, a command).
	head := append(append([]byte(nil), line...), ForwardedHeader+": standby\r\n"...)
	if method == "" || bytes.HasPrefix(line, []byte("PRI ")) {
		head = head[:len(line)] // no request line (or HTTP/2's preface): as it came
	}
	head = append(head, peekAll(br)...)
	if _, err := up.Write(head); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, br); closeWrite(up); done <- struct{}{} }()
	go func() { io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
	<-done
	// One way has ended: the other gets a while to finish, no longer
	// (a client that never closes does not hold the pair for good).
	linger := time.Now().Add(frontLinger)
	c.SetDeadline(linger)
	up.SetDeadline(linger)
	<-done
}

// leaderAnswers: a leader is known and takes a connection, within
// frontProbeDial (a readiness probe's own timeout is a second).
func (f *Front) leaderAnswers() bool {
	addr, err := f.leaderAddr()
	if err != nil || addr == "" {
		return false
	}
	c, err := net.DialTimeout("tcp", addr, frontProbeDial)
	if err != nil {
		f.forget(addr)
		return false
	}
	c.Close()
	return true
}

// handOver gives the gateway (or the relay: to) a connection whose
// request line (and what else was read) this replica has read already.
func (f *Front) handOver(c net.Conn, br *bufio.Reader, line []byte, to chan net.Conn, gone chan struct{}) {
	rc := &replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(append(append([]byte(nil), line...), peekAll(br)...)), c)}
	select {
	case to <- rc:
	case <-gone:
		frontAnswer(c, 503, "unavailable", "this gateway replica is stopping; retry", 2)
	case <-f.closed:
		c.Close()
	}
}

// track registers a forwarded pair, to be cut at Lead or Close; false
// when that has happened already (the caller closes them).
func (f *Front) track(c, up net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.closed:
		return false
	default:
	}
	if f.leading {
		return false
	}
	f.forwarded[c], f.forwarded[up] = struct{}{}, struct{}{}
	return true
}

func (f *Front) untrack(c, up net.Conn) {
	f.mu.Lock()
	delete(f.forwarded, c)
	delete(f.forwarded, up)
	f.mu.Unlock()
}

// leaderAddr is the leader's address, read at most once a second
// however many connections ask (an error too is kept that long).
func (f *Front) leaderAddr() (string, error) {
	a, _, err := f.leaderRead()
	return a, err
}

// leaderRelays: a leader is known and admits the kind of connection
// (relayable's) that a replica carries.
func (f *Front) leaderRelays(kind Relays) bool {
	a, relays, err := f.leaderRead()
	return err == nil && a != "" && (kind.Previews && relays.Previews || kind.Exec && relays.Exec || kind.Files && relays.Files || kind.Actions && relays.Actions ||
		kind.Snapshots && relays.Snapshots)
}

func (f *Front) leaderRead() (string, Relays, error) {
	f.lookup.Lock()
	defer f.lookup.Unlock()
	f.mu.Lock()
	if !f.cachedAt.IsZero() && time.Since(f.cachedAt) < frontLeaderCache {
		a, relays, err := f.cached, f.cachedRelays, f.lastErr
		f.mu.Unlock()
		return a, relays, err
	}
	f.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), frontDial)
	defer cancel()
	a, relays, err := f.leader(ctx)
	if err != nil {
		f.log.Warn("cannot read which replica leads", "err", err)
		a, relays = "", Relays{}
	}
	f.mu.Lock()
	f.cached, f.cachedRelays, f.lastErr, f.cachedAt = a, relays, err, time.Now()
	f.mu.Unlock()
	return a, relays, err
}

// forget drops a cached address that did not answer.
func (f *Front) forget(addr string) {
	f.mu.Lock()
	if f.cached == addr {
		f.cachedAt = time.Time{}
	}
	f.mu.Unlock()
}

// replayConn reads r (what was read of the connection, then the
// connection) before anything else.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// SyscallConn is the socket of the connection under it (whether a
// waiting client hung up: peekNow), as eofConn's.
func (c *replayConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

func peekAll(br *bufio.Reader) []byte {
	b, _ := br.Peek(br.Buffered())
	out := append([]byte(nil), b...)
	br.Discard(len(b))
	return out
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// requestTarget is the method and path (without its query) of an HTTP
// request line, split as the gateway's server splits it (the method up
// to the first space, the target up to the last); empty when it is not
// one.
func requestTarget(line []byte) (method, path string) {
	line = bytes.TrimRight(line, "\r\n")
	i, j := bytes.IndexByte(line, ' '), bytes.LastIndexByte(line, ' ')
	if i <= 0 || j <= i+1 {
		return "", ""
	}
	p := line[i+1 : j]
	if k := bytes.IndexByte(p, '?'); k >= 0 {
		p = p[:k]
	}
	return string(line[:i]), string(p)
}

// frontAnswer writes the gateway's JSON error and closes c.
func frontAnswer(c net.Conn, status int, code, msg string, retryAfter int) {
	body, _ := json.Marshal(map[string]any{"error": map[string]string{"code": code, "message": msg}})
	extra := ""
	if retryAfter > 0 {
		extra = fmt.Sprintf("Retry-After: %d\r\n", retryAfter)
	}
	frontWrite(c, status, extra, body)
}

func frontJSON(c net.Conn, status int, v any) {
	body, _ := json.Marshal(v)
	frontWrite(c, status, "", body)
}

func frontWrite(c net.Conn, status int, extra string, body []byte) {
	c.SetWriteDeadline(time.Now().Add(frontHeadTimeout))
	text := map[int]string{200: "OK", 400: "Bad Request", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}[status]
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n%s",
		status, text, len(body), extra, body)
	// Whatever the client still sends is read (a little, briefly), so
	// that closing does not reset the connection before the client has
	// read the answer.
	closeWrite(c)
	c.SetReadDeadline(time.Now().Add(time.Second))
	io.CopyN(io.Discard, c, 64<<10)
	c.Close()
}
