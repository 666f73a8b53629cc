package egress

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Limits bound what one session may take of the proxy, and what all
// sessions together may take of the gateway's open files. Zero fields
// get the defaults of DefaultLimits.
type Limits struct {
	// SessionConns is how many connections to the proxy one session may
	// hold at once.
	SessionConns int
	// SessionConnRate is how many new connections per second one session
	// may open, in bursts of up to SessionConns.
	SessionConnRate float64
	// SessionBytesPerSecond bounds one session's bytes through the proxy
	// in each direction, over all its connections: tunnels, requests and
	// responses.
	SessionBytesPerSecond int64
	// IdleTimeout closes a session's connection (a tunnel, a keep-alive
	// connection, a request whose upstream stalls) that moved no byte in
	// either direction for this long.
	IdleTimeout time.Duration
	// MaxConns bounds the proxy's connections of all sessions together,
	// the sessions' own and the upstream ones, each an open file. The
	// default is FilesForConns(DefaultFileReserve): the gateway keeps a
	// reserve of open files that no session can reach.
	MaxConns int
}

// Defaults of Limits.
const (
	DefaultSessionConns          = 64
	DefaultSessionConnRate       = 50
	DefaultSessionBytesPerSecond = 8 << 20
	DefaultIdleTimeout           = 60 * time.Second
	// DefaultFileReserve is how many of the gateway's open files the
	// proxy leaves for everything else.
	DefaultFileReserve = 1024
)

// DefaultLimits returns the defaults; MaxConns is derived from the open
// file limit of this process.
func DefaultLimits() Limits {
	return Limits{
		SessionConns:          DefaultSessionConns,
		SessionConnRate:       DefaultSessionConnRate,
		SessionBytesPerSecond: DefaultSessionBytesPerSecond,
		IdleTimeout:           DefaultIdleTimeout,
		MaxConns:              ConnsForFiles(DefaultFileReserve),
	}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.SessionConns <= 0 {
		l.SessionConns = d.SessionConns
	}
	if l.SessionConnRate <= 0 {
		l.SessionConnRate = d.SessionConnRate
	}
	if l.SessionBytesPerSecond <= 0 {
		l.SessionBytesPerSecond = d.SessionBytesPerSecond
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = d.IdleTimeout
	}
	if l.MaxConns <= 0 {
		l.MaxConns = d.MaxConns
	}
	return l
}

// ConnsForFiles is how many connections the proxy may hold when reserve
// of this process's open files (RLIMIT_NOFILE, soft) stay for the rest
// of the gateway; at least 16.
func ConnsForFiles(reserve int) int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 1024
	}
	return max(int(min(rl.Cur, 1<<30))-reserve, 16)
}

// auditWindow is how often a session's refusals are reported: the first
// refusal at once, the rest of a burst as one count per window.
const auditWindow = 10 * time.Second

// errLimited is returned by upstream dials when the proxy holds MaxConns
// connections.
var errLimited = errors.New("the proxy's connections are exhausted")

// limiter counts connections per session and in all, and holds each
// session's rate buckets. Entries of sessions without connections are
// dropped after a minute, so it grows only with live sessions.
type limiter struct {
	lim    Limits
	audit  func(session, typ string, fields map[string]any)
	log    *slog.Logger
	window time.Duration // auditWindow; shorter in tests

	mu       sync.Mutex
	total    int
	sessions map[string]*sessionLimit
	lastLog  time.Time
}

type sessionLimit struct {
	id      string
	conns   int
	newConn bucket // new connections
	in, out bucket // bytes from and to the session
	idleAt  time.Time

	// refusals not yet reported, and the open report window
	refused int
	reason  string
	window  *time.Timer
}

func newLimiter(lim Limits, audit func(string, string, map[string]any), log *slog.Logger) *limiter {
	return &limiter{lim: lim.withDefaults(), audit: audit, log: log, window: auditWindow, sessions: map[string]*sessionLimit{}}
}

// session returns a session's entry; l.mu is held.
func (l *limiter) session(id string) *sessionLimit {
	if sl, ok := l.sessions[id]; ok {
		return sl
	}
	now := time.Now()
	for k, o := range l.sessions {
		if o.conns == 0 && o.window == nil && now.Sub(o.idleAt) > time.Minute {
			delete(l.sessions, k)
		}
	}
	bytesBurst := float64(max(l.lim.SessionBytesPerSecond/8, 64<<10))
	sl := &sessionLimit{
		id:      id,
		newConn: newBucket(l.lim.SessionConnRate, float64(l.lim.SessionConns)),
		in:      newBucket(float64(l.lim.SessionBytesPerSecond), bytesBurst),
		out:     newBucket(float64(l.lim.SessionBytesPerSecond), bytesBurst),
		idleAt:  now,
	}
	l.sessions[id] = sl
	return sl
}

// admit takes a connection slot for a session, or says why not.
func (l *limiter) admit(id string) (*sessionLimit, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sl := l.session(id)
	why := ""
	switch {
	case l.total >= l.lim.MaxConns:
		why = "the gateway's egress connections are exhausted"
		if time.Since(l.lastLog) > l.window {
			l.lastLog = time.Now()
			l.log.Warn("egress proxy at its connection cap; refusing new connections", "max_conns", l.lim.MaxConns)
		}
	case sl.conns >= l.lim.SessionConns:
		why = "too many connections at once"
	case !sl.newConn.take(1):
		why = "too many new connections per second"
	}
	if why != "" {
		l.refuseLocked(sl, why)
		return nil, why
	}
	sl.conns++
	l.total++
	return sl, ""
}

func (l *limiter) release(sl *sessionLimit) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if sl != nil {
		sl.conns--
		if sl.conns == 0 {
			sl.idleAt = time.Now()
		}
	}
}

// takeUpstream counts an upstream connection against MaxConns.
func (l *limiter) takeUpstream() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total >= l.lim.MaxConns {
		return false
	}
	l.total++
	return true
}

// refuseLocked counts a refusal; the first of a burst is reported at
// once, the others when the window closes. l.mu is held.
func (l *limiter) refuseLocked(sl *sessionLimit, why string) {
	sl.refused++
	sl.reason = why
	if sl.window != nil {
		return
	}
	f := map[string]any{"reason": why, "refused": sl.refused}
	sl.refused = 0
	go l.audit(sl.id, "egress_limited", f)
	sl.window = time.AfterFunc(l.window, func() { l.closeWindow(sl) })
}

func (l *limiter) closeWindow(sl *sessionLimit) {
	l.mu.Lock()
	if sl.refused == 0 {
		sl.window = nil
		l.mu.Unlock()
		return
	}
	f := map[string]any{"reason": sl.reason, "refused": sl.refused}
	sl.refused = 0
	sl.window.Reset(l.window)
	l.mu.Unlock()
	l.audit(sl.id, "egress_limited", f)
}

// bucket is a token bucket; reserve may take it below zero, and the
// caller waits the debt off.
type bucket struct {
	mu     sync.Mutex
	rate   float64 // tokens per second
	burst  float64
	tokens float64
	last   time.Time
}

func newBucket(rate, burst float64) bucket {
	return bucket{rate: rate, burst: burst, tokens: burst, last: time.Now()}
}

func (b *bucket) refill(now time.Time) {
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
}

// take takes n tokens if there are.
func (b *bucket) take(n float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(time.Now())
	if b.tokens < n {
		return false
	}
	b.tokens -= n
	return true
}

// reserve takes n tokens and returns how long to wait for them.
func (b *bucket) reserve(n int) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(time.Now())
	b.tokens -= float64(n)
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

// limitListener admits a session's connection only within its limits;
// a refused one gets a 429 (403 for a stranger) and is closed at once.
// The policy of a connection's source is asked beside the accepting
// (a replica that stands by reads it from the session's Pod, which may
// take a while), by at most maxAdmitting at once; past that, accepting
// waits. A refused connection costs its admission's goroutine only.
type limitListener struct {
	net.Listener
	p        *Proxy
	admitted chan net.Conn
	failed   chan error
	once     *sync.Once
	done     chan struct{} // closed by Close
	closing  *sync.Once
}

// maxAdmitting bounds the connections whose admission is under way.
const maxAdmitting = 64

func newLimitListener(l net.Listener, p *Proxy) limitListener {
	return limitListener{Listener: l, p: p, admitted: make(chan net.Conn), failed: make(chan error, 1), once: &sync.Once{},
		done: make(chan struct{}), closing: &sync.Once{}}
}

func (l limitListener) Accept() (net.Conn, error) {
	l.once.Do(func() { go l.accept() })
	select {
	case c := <-l.admitted:
		return c, nil
	case err := <-l.failed:
		l.failed <- err // for the next caller too
		return nil, err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops the accepting at once, admissions under way too.
func (l limitListener) Close() error {
	l.closing.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// accept takes connections until the listener fails or is closed,
// admitting each in its own goroutine.
func (l limitListener) accept() {
	slots := make(chan struct{}, maxAdmitting)
	var backoff time.Duration
	for {
		select {
		case slots <- struct{}{}:
		case <-l.done:
			return
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-slots
			if errors.Is(err, net.ErrClosed) {
				l.failed <- err
				return
			}
			// Out of files, say: tried again, waiting longer each
			// time, as the HTTP server does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.p.cfg.Log.Warn("egress proxy: accept failed; trying again", "err", err, "in", backoff)
			select {
			case <-time.After(backoff):
			case <-l.done:
				return
			}
			continue
		}
		backoff = 0
		go func() {
			defer func() { <-slots }()
			if sc := l.p.admit(c); sc != nil {
				select {
				case l.admitted <- sc:
				case <-l.done:
					sc.Close()
				}
			}
		}()
	}
}

const (
	refused429 = "HTTP/1.1 429 Too Many Requests\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 47\r\n\r\nsandgate egress: too many connections; refused\n"
	refused403 = "HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 32\r\n\r\nsandgate egress: not a session\n\n"
)

// admit wraps an accepted connection in its session's limits, or
// refuses it.
func (p *Proxy) admit(c net.Conn) net.Conn {
	refuse := func(msg string) net.Conn {
		c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		io.WriteString(c, msg)
		c.Close()
		return nil
	}
	src, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return refuse(refused403)
	}
	pol, ok := p.policies.Policy(src.Addr().Unmap())
	if !ok {
		return refuse(refused403)
	}
	sl, why := p.lim.admit(pol.Session)
	if why != "" {
		return refuse(refused429)
	}
	sc := &sessionConn{Conn: c, l: p.lim, sl: sl, closed: make(chan struct{})}
	sc.touch()
	sc.idle.Store(time.AfterFunc(p.lim.lim.IdleTimeout, sc.checkIdle))
	return sc
}

// sessionConn is a session's connection to the proxy: its bytes are
// paced by the session's buckets and it closes when idle.
type sessionConn struct {
	net.Conn
	l      *limiter
	sl     *sessionLimit
	last   atomic.Int64 // unix nanoseconds of the last byte
	idle   atomic.Pointer[time.Timer]
	closed chan struct{}
	once   sync.Once
}

// ioChunk bounds one read or write, so sessions' connections take turns.
const ioChunk = 32 << 10

func (c *sessionConn) touch() { c.last.Store(time.Now().UnixNano()) }

func (c *sessionConn) checkIdle() {
	since := time.Since(time.Unix(0, c.last.Load()))
	if since >= c.l.lim.IdleTimeout {
		c.Close()
		return
	}
	if t := c.idle.Load(); t != nil {
		t.Reset(c.l.lim.IdleTimeout - since)
	}
}

// wait sleeps d, or until the connection closes.
func (c *sessionConn) wait(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.closed:
		return false
	}
}

func (c *sessionConn) Read(p []byte) (int, error) {
	if len(p) > ioChunk {
		p = p[:ioChunk]
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.touch()
		c.wait(c.sl.in.reserve(n))
	}
	return n, err
}

func (c *sessionConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		chunk := p[done:min(len(p), done+ioChunk)]
		if !c.wait(c.sl.out.reserve(len(chunk))) {
			return done, net.ErrClosed
		}
		n, err := c.Conn.Write(chunk)
		done += n
		if n > 0 {
			c.touch()
		}
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func (c *sessionConn) Close() error {
	c.once.Do(func() {
		close(c.closed)
		if t := c.idle.Load(); t != nil {
			t.Stop()
		}
		c.l.release(c.sl)
	})
	return c.Conn.Close()
}

// upstreamConn is a connection the proxy opened for a session; it counts
// against MaxConns until closed.
type upstreamConn struct {
	net.Conn
	l    *limiter
	once sync.Once
}

func (c *upstreamConn) Close() error {
	c.once.Do(func() { c.l.release(nil) })
	return c.Conn.Close()
}
