package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Policy is what one session may reach and which credentials its requests
// get. The gateway builds it from the session's create request.
type Policy struct {
	Session  string
	Tenant   string
	Allow    []Pattern
	Bindings []Binding
}

// Policies finds the session behind a source address on the bridge.
type Policies interface {
	Policy(src netip.Addr) (Policy, bool)
}

// Secrets opens a tenant's credential; the proxy is its only reader. It
// also names a session's placeholder for a credential (see
// MaxPlaceholderBody), or "" when there is none.
type Secrets interface {
	Credential(ctx context.Context, tenant, id string) (Credential, error)
	Placeholder(session, credential string) string
}

// Config holds the proxy's knobs.
type Config struct {
	Resolver *Resolver
	// Exempt are networks an operator trusts although they are private,
	// e.g. a staging network; empty by default.
	Exempt []netip.Prefix
	// UpstreamRoots verify intercepted hosts; nil means the system's.
	UpstreamRoots *x509.CertPool
	// CASecret derives each session's CA; without it the proxy tunnels
	// everything and adds no credentials to HTTPS.
	CASecret []byte
	// Limits bound each session's connections, new connections, bytes
	// and idle time, and all sessions' connections together.
	Limits Limits
	// Audit receives every allowed and denied destination, credential
	// use and, once per burst, refusals by the limits.
	Audit func(session, typ string, fields map[string]any)
	Log   *slog.Logger
}

// Proxy is an HTTP forward proxy (absolute-form requests and CONNECT) for
// the sessions on one bridge. It identifies a session by its source
// address: bridge ports are isolated and sessions hold no capability to
// forge addresses.
type Proxy struct {
	cfg      Config
	policies Policies
	secrets  Secrets
	srv      *http.Server
	lim      *limiter

	mu       sync.Mutex
	sessions map[string]*sessionState
	// tunnels: the CONNECT connections taken from the HTTP server,
	// which its Close does not end; closed: Close has run.
	tunnels map[net.Conn]struct{}
	closed  bool
}

// sessionState is what the proxy keeps per session: its CA and its own
// upstream connection pool, shared with no other session.
type sessionState struct {
	ca        *CA
	transport *http.Transport
	used      time.Time
}

// New returns a proxy; Serve starts it.
func New(cfg Config, policies Policies, secrets Secrets) *Proxy {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Audit == nil {
		cfg.Audit = func(string, string, map[string]any) {}
	}
	if cfg.Resolver == nil {
		cfg.Resolver = NewResolver("", nil)
	}
	p := &Proxy{cfg: cfg, policies: policies, secrets: secrets, sessions: map[string]*sessionState{}, tunnels: map[net.Conn]struct{}{}}
	p.lim = newLimiter(cfg.Limits, cfg.Audit, cfg.Log)
	p.srv = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       p.lim.lim.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(cfg.Log.Handler(), slog.LevelDebug),
	}
	return p
}

// Serve accepts session connections on l, within their limits, until
// Close.
func (p *Proxy) Serve(l net.Listener) error {
	err := p.srv.Serve(newLimitListener(l, p))
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the proxy and drops its connections, its tunnels too: no
// connection goes on under settings the proxy no longer runs with.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for _, st := range p.sessions {
		st.transport.CloseIdleConnections()
	}
	for c := range p.tunnels {
		c.Close()
	}
	p.mu.Unlock()
	return p.srv.Close()
}

// tunnel keeps c, a connection taken from the HTTP server, for Close
// to end (false: the proxy is closed; c is closed); the returned func
// lets it go.
func (p *Proxy) tunnel(c net.Conn) (func(), bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return nil, false
	}
	p.tunnels[c] = struct{}{}
	return func() {
		p.mu.Lock()
		delete(p.tunnels, c)
		p.mu.Unlock()
	}, true
}

type vettedKey struct{}
type secretKey struct{}

func (p *Proxy) state(pol Policy) (*sessionState, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st, ok := p.sessions[pol.Session]; ok {
		st.used = time.Now()
		return st, nil
	}
	st := &sessionState{used: time.Now()}
	if len(p.cfg.CASecret) > 0 {
		ca, err := NewCA(p.cfg.CASecret, pol.Session)
		if err != nil {
			return nil, err
		}
		st.ca = ca
	}
	st.transport = &http.Transport{
		// Every upstream connection goes to the address vetted for the
		// request, never to a name resolved again (DNS rebinding).
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			ap, ok := ctx.Value(vettedKey{}).(netip.AddrPort)
			if !ok {
				return nil, errors.New("no vetted address")
			}
			return p.dialUpstream(ctx, ap)
		},
		TLSClientConfig:     &tls.Config{RootCAs: p.cfg.UpstreamRoots},
		TLSHandshakeTimeout: 15 * time.Second,
		MaxIdleConns:        16,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
		// Bodies come as the server sent them; the proxy never inflates
		// them (and asks bound hosts for identity, see forward).
		DisableCompression:     true,
		MaxResponseHeaderBytes: 256 << 10,
	}
	// Keep the table bounded: drop sessions idle for an hour.
	for id, o := range p.sessions {
		if time.Since(o.used) > time.Hour {
			o.transport.CloseIdleConnections()
			delete(p.sessions, id)
		}
	}
	p.sessions[pol.Session] = st
	return st, nil
}

// dialUpstream connects to a vetted address, counted against MaxConns.
func (p *Proxy) dialUpstream(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
	if !p.lim.takeUpstream() {
		return nil, errLimited
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", ap.String())
	if err != nil {
		p.lim.release(nil)
		return nil, err
	}
	return &upstreamConn{Conn: c, l: p.lim}, nil
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	src, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		http.Error(w, "sandgate egress: unknown source", http.StatusForbidden)
		return
	}
	pol, ok := p.policies.Policy(src.Addr().Unmap())
	if !ok {
		http.Error(w, "sandgate egress: not a session", http.StatusForbidden)
		return
	}
	if r.Method == http.MethodConnect {
		p.connect(w, r, pol)
		return
	}
	if !r.URL.IsAbs() {
		http.Error(w, "sandgate egress: this is the session's egress proxy; send absolute-form requests or CONNECT", http.StatusBadRequest)
		return
	}
	if r.URL.Scheme != "http" {
		p.deny(pol, r.URL.Scheme+"://"+r.URL.Host, 0, "only http:// and CONNECT go through the proxy")
		http.Error(w, "sandgate egress: scheme "+r.URL.Scheme+" is not allowed", http.StatusForbidden)
		return
	}
	host, port, ok := target(r.URL.Host, 80)
	if !ok {
		http.Error(w, "sandgate egress: bad host", http.StatusBadRequest)
		return
	}
	ap, ok := p.vetOrRefuse(w, r, pol, host, port)
	if !ok {
		return
	}
	p.allow(pol, host, port, ap, "http")
	st, err := p.state(pol)
	if err != nil {
		http.Error(w, "sandgate egress: internal error", http.StatusInternalServerError)
		return
	}
	p.forward(w, r, pol, st, "http", host, port, ap)
}

// target splits an authority into a normalised host and port.
func target(authority string, defPort uint16) (string, uint16, bool) {
	h, ps, err := net.SplitHostPort(authority)
	port := defPort
	if err != nil {
		h = authority
	} else {
		n, err := strconv.ParseUint(ps, 10, 16)
		if err != nil || n == 0 {
			return "", 0, false
		}
		port = uint16(n)
	}
	h, ok := NormalizeHost(h)
	return h, port, ok && port != 0
}

// vet decides a destination: on the allow list (or bound to a credential),
// resolved here, and only to addresses that are not forbidden. It returns
// the address to dial or why not.
func (p *Proxy) vet(ctx context.Context, pol Policy, host string, port uint16) (netip.AddrPort, string) {
	allowed := Allowed(pol.Allow, host, port)
	for _, b := range pol.Bindings {
		allowed = allowed || b.pattern().Matches(host, port)
	}
	if !allowed {
		p.deny(pol, host, port, "not on the session's allow list")
		return netip.AddrPort{}, "not on the session's allow list"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addrs, err := p.cfg.Resolver.Lookup(ctx, host)
	if err != nil || len(addrs) == 0 {
		p.deny(pol, host, port, "the name does not resolve")
		return netip.AddrPort{}, "the name does not resolve"
	}
	why := ""
	for _, a := range addrs {
		if w := Forbidden(a, p.cfg.Exempt); w != "" {
			why = w
			continue
		}
		return netip.AddrPortFrom(a.Unmap(), port), ""
	}
	reason := "it resolves to a " + why + " address"
	p.deny(pol, host, port, reason)
	return netip.AddrPort{}, reason
}

// vetOrRefuse vets a destination and answers 403 with the reason when it
// is refused.
func (p *Proxy) vetOrRefuse(w http.ResponseWriter, r *http.Request, pol Policy, host string, port uint16) (netip.AddrPort, bool) {
	ap, why := p.vet(r.Context(), pol, host, port)
	if why != "" {
		http.Error(w, fmt.Sprintf("sandgate egress: %s:%d is not allowed: %s", host, port, why), http.StatusForbidden)
		return netip.AddrPort{}, false
	}
	return ap, true
}

func (p *Proxy) deny(pol Policy, host string, port uint16, why string) {
	f := map[string]any{"host": host, "reason": why}
	if port != 0 {
		f["port"] = port
	}
	p.cfg.Audit(pol.Session, "egress_denied", f)
}

func (p *Proxy) allow(pol Policy, host string, port uint16, ap netip.AddrPort, via string) {
	p.cfg.Audit(pol.Session, "egress_allowed", map[string]any{"host": host, "port": port, "address": ap.Addr().String(), "via": via})
}

func (p *Proxy) connect(w http.ResponseWriter, r *http.Request, pol Policy) {
	host, port, ok := target(r.Host, 0)
	if !ok {
		http.Error(w, "sandgate egress: CONNECT needs host:port", http.StatusBadRequest)
		return
	}
	ap, ok := p.vetOrRefuse(w, r, pol, host, port)
	if !ok {
		return
	}
	st, err := p.state(pol)
	if err != nil {
		http.Error(w, "sandgate egress: internal error", http.StatusInternalServerError)
		return
	}
	intercept := st.ca != nil && len(bindingsFor(pol.Bindings, "https", host, port)) > 0
	var upstream net.Conn
	if !intercept {
		ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
		upstream, err = p.dialUpstream(ctx, ap)
		cancel()
		if err != nil {
			p.cfg.Audit(pol.Session, "egress_failed", map[string]any{"host": host, "port": port, "address": ap.Addr().String()})
			http.Error(w, "sandgate egress: could not connect", http.StatusBadGateway)
			return
		}
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "sandgate egress: cannot tunnel", http.StatusInternalServerError)
		return
	}
	c, brw, err := hj.Hijack()
	if err != nil {
		if upstream != nil {
			upstream.Close()
		}
		return
	}
	forget, ok := p.tunnel(c)
	if !ok {
		if upstream != nil {
			upstream.Close()
		}
		return
	}
	defer forget()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		c.Close()
		if upstream != nil {
			upstream.Close()
		}
		return
	}
	client := bufferedConn{Conn: c, r: brw.Reader}
	if !intercept {
		p.allow(pol, host, port, ap, "tunnel")
		splice(client, upstream)
		return
	}
	p.allow(pol, host, port, ap, "intercept")
	p.intercept(client, pol, st, host, port, ap)
}

// splice copies both ways until either side ends, then closes both.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	a.Close()
	b.Close()
	<-done
}

// intercept terminates the session's TLS with a certificate from its own
// CA and serves its requests through the forwarder, which adds the bound
// credentials.
func (p *Proxy) intercept(c net.Conn, pol Policy, st *sessionState, host string, port uint16, ap netip.AddrPort) {
	cert, err := st.ca.Certificate(host)
	if err != nil {
		c.Close()
		return
	}
	tc := tls.Server(c, &tls.Config{
		Certificates: []tls.Certificate{*cert},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	authority := net.JoinHostPort(host, strconv.Itoa(int(port)))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The request must be for the host the tunnel was vetted for.
		if rh, rp, ok := target(r.Host, port); !ok || rh != host || rp != port {
			http.Error(w, "sandgate egress: the request's host does not match the tunnel's", http.StatusMisdirectedRequest)
			return
		}
		r.URL.Scheme, r.URL.Host = "https", authority
		p.forward(w, r, pol, st, "https", host, port, ap)
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: p.lim.lim.IdleTimeout, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(p.cfg.Log.Handler(), slog.LevelDebug)}
	srv.Serve(newOneConnListener(tc))
}

// forward sends one request upstream to the vetted address. Requests to
// a host with bound credentials are matched on their cleaned path (and
// sent with it), get the credentials whose bindings cover them, have
// their placeholders swapped for secrets, and their responses scrubbed of
// every secret bound to the host.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, pol Policy, st *sessionState, scheme, host string, port uint16, ap netip.AddrPort) {
	if r.Method == "TRACE" || r.Method == "TRACK" {
		// They echo the request, credentials and all.
		p.deny(pol, host, port, "method "+r.Method+" echoes requests")
		w.Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		http.Error(w, "sandgate egress: "+r.Method+" is not allowed", http.StatusMethodNotAllowed)
		return
	}
	ctx := context.WithValue(r.Context(), vettedKey{}, ap)
	bound := bindingsFor(pol.Bindings, scheme, host, port)
	var ns [][]byte
	if len(bound) > 0 {
		var header *Credential
		var ok bool
		if ns, header, ok = p.bind(w, r, ctx, pol, bound, host, port); !ok {
			return
		}
		if header != nil {
			ctx = context.WithValue(ctx, secretKey{}, header)
		}
	}
	rp := &httputil.ReverseProxy{
		Transport: st.transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.Header.Del("Proxy-Authorization")
			pr.Out.Header.Del("Proxy-Connection")
			if c, ok := pr.Out.Context().Value(secretKey{}).(*Credential); ok {
				c.apply(pr.Out)
			}
			if ns != nil {
				// Bodies the proxy can read, to scrub them.
				pr.Out.Header.Set("Accept-Encoding", "identity")
				// A partial answer could start inside an echoed secret,
				// where no whole form of it matches: ask for whole ones.
				pr.Out.Header.Del("Range")
				pr.Out.Header.Del("If-Range")
			}
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			status, msg := http.StatusBadGateway, "upstream failed"
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				status = http.StatusGatewayTimeout
			case errors.Is(err, errLimited):
				status, msg = http.StatusServiceUnavailable, err.Error()
			case errors.Is(err, errUnscrubbable):
				msg = err.Error()
			}
			http.Error(w, "sandgate egress: "+msg, status)
		},
		ErrorLog: slog.NewLogLogger(p.cfg.Log.Handler(), slog.LevelDebug),
	}
	if ns != nil {
		// 1xx responses (103 Early Hints) would reach the session
		// unscrubbed; without a trace hook the transport drops them.
		rp.Transport = roundTripFunc(func(req *http.Request) (*http.Response, error) {
			return st.transport.RoundTrip(req.WithContext(untraced{req.Context()}))
		})
		rp.ModifyResponse = func(resp *http.Response) error {
			if resp.StatusCode == http.StatusSwitchingProtocols {
				return fmt.Errorf("%w: it switched protocols", errUnscrubbable)
			}
			if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
				return fmt.Errorf("%w: it answered %s-encoded", errUnscrubbable, ce)
			}
			scrubHeader(resp.Header, ns)
			resp.Trailer = nil
			resp.Body = newScrubReader(resp.Body, ns)
			return nil
		}
	}
	rp.ServeHTTP(w, r.WithContext(ctx))
}

// errUnscrubbable refuses a bound host's response the proxy cannot scrub.
var errUnscrubbable = errors.New("a host with bound credentials sent a response the proxy cannot check for secrets")

// bind prepares a request to a host with bound credentials: it refuses
// an ambiguous path, sends the cleaned one, opens the bound credentials,
// picks the first header credential whose binding covers the path, swaps
// placeholders, and returns what to scrub from the response.
func (p *Proxy) bind(w http.ResponseWriter, r *http.Request, ctx context.Context, pol Policy, bound []Binding, host string, port uint16) ([][]byte, *Credential, bool) {
	clean, ok := CleanPath(r.URL)
	if !ok {
		p.deny(pol, host, port, "an ambiguous path to a host with bound credentials")
		http.Error(w, "sandgate egress: the path is ambiguous (encoded slashes, backslashes or dressed dot segments) and the host has bound credentials", http.StatusBadRequest)
		return nil, nil, false
	}
	r.URL.Path, r.URL.RawPath = clean, ""
	opened := map[string]Credential{}
	var secrets []string
	var header *Credential
	var swaps []swap
	byPlaceholder := map[string]string{}
	for _, b := range bound {
		c, seen := opened[b.Credential]
		if !seen {
			var err error
			c, err = p.secrets.Credential(ctx, pol.Tenant, b.Credential)
			if err != nil {
				p.cfg.Audit(pol.Session, "credential_unavailable", map[string]any{"credential": b.Credential, "host": host})
				http.Error(w, "sandgate egress: a bound credential is unavailable", http.StatusBadGateway)
				return nil, nil, false
			}
			opened[b.Credential] = c
			secrets = append(secrets, c.Secret)
		}
		if !b.WithinAny(c.Destinations) {
			// The gateway refuses such a binding; a session bound before
			// credentials had destinations may still hold one.
			p.cfg.Audit(pol.Session, "credential_refused", map[string]any{"credential": b.Credential, "host": host, "reason": "outside the credential's destinations"})
			continue
		}
		if !PathUnder(clean, b.PathPrefix) {
			continue
		}
		if header == nil && c.Kind != KindForm {
			header = &c
			p.cfg.Audit(pol.Session, "credential_used", map[string]any{"credential": b.Credential, "host": host, "port": port, "via": "header"})
		}
		if ph := p.secrets.Placeholder(pol.Session, b.Credential); ph != "" && byPlaceholder[ph] == "" {
			byPlaceholder[ph] = b.Credential
			swaps = append(swaps, swap{placeholder: ph, secret: c.Secret})
		}
	}
	res, err := swapPlaceholders(r, swaps)
	if err != nil {
		http.Error(w, "sandgate egress: could not read the request body", http.StatusBadRequest)
		return nil, nil, false
	}
	for _, s := range swaps {
		if res.swapped[s.placeholder] {
			p.cfg.Audit(pol.Session, "credential_used", map[string]any{"credential": byPlaceholder[s.placeholder], "host": host, "port": port, "via": "placeholder"})
		}
	}
	if res.tooLarge {
		p.cfg.Audit(pol.Session, "placeholder_not_swapped", map[string]any{"host": host, "port": port, "reason": fmt.Sprintf("the request body is over %d bytes", MaxPlaceholderBody)})
	}
	return needles(secrets...), header, true
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// untraced is a request's context without its values (an httptrace hook
// among them), but for the vetted address.
type untraced struct{ context.Context }

func (u untraced) Value(key any) any {
	if _, ok := key.(vettedKey); ok {
		return u.Context.Value(key)
	}
	return nil
}

// bufferedConn reads what the HTTP server buffered before the hijack first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// oneConnListener hands out one connection, then waits for it to close.
type oneConnListener struct {
	conn   net.Conn
	once   sync.Once
	closed chan struct{}
}

func newOneConnListener(c net.Conn) *oneConnListener {
	l := &oneConnListener{closed: make(chan struct{})}
	l.conn = &notifyConn{Conn: c, l: l}
	return l
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.conn })
	if c != nil {
		return c, nil
	}
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }

type notifyConn struct {
	net.Conn
	l    *oneConnListener
	once sync.Once
}

func (c *notifyConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.l.closed) })
	return err
}
