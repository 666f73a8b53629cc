// Package gateway is the Fiber app in front of sessions: API keys and
// tenants, the sessions API, preview tokens, the CDP ingress and the
// mapping of errors to the public contract. It never talks to containerd.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/profile"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/tenant"
	"github.com/sandgate/sandgate/vault"
)

// Config is what the gateway needs from the service's config file.
type Config struct {
	// PublicURL is how clients reach the gateway.
	PublicURL *url.URL
	// Hosts are the Host header values the gateway answers to.
	Hosts []string
	// APIKeys maps the hex SHA-256 of an API key to its tenant, when the
	// gateway runs without a tenant registry (WithTenants).
	APIKeys map[string]string
	// AdminKeys holds the hex SHA-256 of the admin API's keys; none
	// turns the admin API off.
	AdminKeys map[string]bool
	// TokenKeys sign preview tokens; ActiveKey signs new ones.
	TokenKeys map[string]string
	ActiveKey string
	// MaxPreviewTTL bounds a preview's lifetime.
	MaxPreviewTTL time.Duration
	// BodyLimit bounds request bodies.
	BodyLimit int
	// TrustedProxies are the addresses (IPs or CIDR prefixes) of reverse
	// proxies whose X-Forwarded-Host and X-Forwarded-Proto the gateway
	// believes. From anyone else those headers are ignored: the Host check
	// and the URLs the gateway builds use the request's own Host.
	TrustedProxies []string
	// ReadTimeout bounds reading one request, headers and body (default
	// 60s). File uploads get UploadTimeout instead (default 30 minutes),
	// once the request is authenticated.
	ReadTimeout   time.Duration
	UploadTimeout time.Duration
	// DrainTimeout bounds how long a stopping gateway waits for the
	// creates under way (default 2 minutes).
	DrainTimeout time.Duration
	// CDP bounds messages through the CDP proxy (DefaultCDPLimits where
	// zero).
	CDP CDPLimits
	// Downloads bounds what the download watcher takes from a session;
	// Downloads.Bytes also bounds the copy out of the session.
	Downloads browser.DownloadLimits
	// Keep bounds the profiles and workspace snapshots the gateway
	// keeps (their defaults where zero).
	Keep ProfileLimits
}

// Defaults of Config.
const (
	DefaultReadTimeout   = 60 * time.Second
	DefaultUploadTimeout = 30 * time.Minute
)

// Server is the gateway.
type Server struct {
	// logMerges bounds the stored audit logs read into memory at once
	// to be added to (StoreTrail); logReads, to be answered
	// (storedEvents).
	logMerges, logReads chan struct{}
	// reviews keeps review links' views from growing a log unbounded.
	reviews reviewNotes
	// trusted are cfg.TrustedProxies, parsed.
	trusted  []netip.Prefix
	cfg      Config
	app      *fiber.App
	sessions *session.Manager
	// live is what the preview routes use of the sessions: sessions,
	// or the leader's word on a replica that relays (NewRelay).
	live    previewLive
	shells  shellLive
	relayed relayed // the connections replicas that stand by carry
	// relayNonces: the signed relay requests taken lately.
	relayNonces relayNonces
	tenants     *tenant.Registry
	store       *recordings.Store
	tokens      *signer
	vault       *vault.Vault         // nil: no credentials
	recorder    *recordings.Recorder // nil: no recordings
	recShare    RecordingShare       // nil: recordings are made here
	// retention per tenant; the janitor enforces it.
	retention    map[string]time.Duration
	janitorEvery time.Duration
	watch        watchers
	versions     versions
	spares       spares
	exits        browserExits
	artifacts    artifactCounts
	profiles     *profile.Store // nil: no profiles
	keepLimits   ProfileLimits
	snapshotting tenantSlots
	// profileBytes counts a tenant's profiles where profiles is nil
	// (WithProfileBytes; nil: not counted).
	profileBytes func(ctx context.Context, tenant string) (int64, error)
	shots        chan struct{} // screenshots being taken (the route's)
	verified     verifiedProfiles
	mcp          http.Handler // nil: no /mcp
	log          *slog.Logger
	hosts        map[string]bool
	origin       string // scheme://host of PublicURL
	wsScheme     string
	openapiJSON  []byte // openapi.yaml as JSON
}

// New builds the gateway's routes.
func New(cfg Config, sessions *session.Manager, store *recordings.Store, log *slog.Logger, opts ...Option) (*Server, error) {
	s, err := newServer(cfg, sessions, store, log, opts...)
	if err != nil {
		return nil, err
	}
	s.routes()
	return s, nil
}

// newServer builds a gateway with no routes yet.
func newServer(cfg Config, sessions *session.Manager, store *recordings.Store, log *slog.Logger, opts ...Option) (*Server, error) {
	if cfg.PublicURL == nil || cfg.PublicURL.Host == "" {
		return nil, fmt.Errorf("gateway: public URL is required")
	}
	tokens, err := newSigner(cfg.ActiveKey, cfg.TokenKeys)
	if err != nil {
		return nil, err
	}
	if cfg.MaxPreviewTTL == 0 {
		cfg.MaxPreviewTTL = 24 * time.Hour
	}
	if cfg.BodyLimit == 0 {
		cfg.BodyLimit = 1 << 20
	}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.UploadTimeout == 0 {
		cfg.UploadTimeout = DefaultUploadTimeout
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 2 * time.Minute
	}
	var trusted []netip.Prefix
	for _, p := range cfg.TrustedProxies {
		pf, err := netip.ParsePrefix(p)
		if err != nil {
			a, err := netip.ParseAddr(p)
			if err != nil {
				return nil, fmt.Errorf("gateway: trusted proxy %q is not an IP address or CIDR prefix", p)
			}
			pf = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		trusted = append(trusted, pf.Masked())
	}
	s := &Server{logMerges: make(chan struct{}, maxLogMerges), logReads: make(chan struct{}, maxLogMerges), trusted: trusted, shots: make(chan struct{}, maxScreenshots),
		cfg: cfg, sessions: sessions, store: store, tokens: tokens, log: log,
		hosts:    map[string]bool{strings.ToLower(cfg.PublicURL.Host): true},
		origin:   cfg.PublicURL.Scheme + "://" + strings.ToLower(cfg.PublicURL.Host),
		wsScheme: "ws",
	}
	s.live, s.shells = managerLive{s}, managerLive{s}
	if cfg.PublicURL.Scheme == "https" {
		s.wsScheme = "wss"
	}
	for _, h := range cfg.Hosts {
		s.hosts[strings.ToLower(h)] = true
	}
	s.watch.cancel = map[string]context.CancelFunc{}
	s.watch.reassert = map[string]chan struct{}{}
	s.watch.done = map[string]chan struct{}{}
	s.watch.gen = map[string]uint64{}
	s.watch.owner = map[string]session.Info{}
	s.versions.m = map[string][]byte{}
	s.spares.m = map[string]*spare{}
	s.exits.reported = map[string]string{}
	s.artifacts.m = map[string]artifactCount{}
	s.exits.checking = map[string]bool{}
	s.keepLimits = cfg.Keep.withDefaults()
	s.watch.recorded = map[string]bool{}
	for _, o := range opts {
		o(s)
	}
	if s.tenants == nil {
		byTenant := map[string][]string{}
		for d, t := range cfg.APIKeys {
			byTenant[t] = append(byTenant[t], d)
		}
		var seeds []tenant.Seed
		for t, ds := range byTenant {
			seeds = append(seeds, tenant.Seed{Tenant: tenant.Tenant{Name: t}, Digests: ds})
		}
		if s.tenants, err = tenant.Open("", seeds, nil); err != nil {
			return nil, err
		}
	}
	if s.openapiJSON, err = openapiJSON(); err != nil {
		return nil, err
	}
	s.app = fiber.New(fiber.Config{
		AppName: "sandgate",
		// Values from a request outlive it (revocations, tracked
		// connections): without this Fiber hands out strings whose bytes
		// it reuses for the next request.
		Immutable: true,
		// Bodies over the limit reach the handler as a stream: file
		// uploads use it, limitBody refuses it everywhere else.
		BodyLimit:             cfg.BodyLimit,
		StreamRequestBody:     true,
		ErrorHandler:          errorHandler(log),
		DisableStartupMessage: true,
		// Forwarding headers count only from the configured proxies
		// (none by default): anyone else could name the gateway in
		// X-Forwarded-Host and pass the Host check.
		EnableTrustedProxyCheck: true,
		TrustedProxies:          cfg.TrustedProxies,
		// The upload route extends its own deadline (uploadBody).
		ReadTimeout: cfg.ReadTimeout,
		IdleTimeout: 120 * time.Second,
	})
	// Upload bodies always reach putFile as a stream, whatever their
	// size, so that none is read in full under the short read timeout
	// (or into memory) before the handler extends the deadline.
	s.app.Server().HeaderReceived = func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
		if isUpload(string(h.Method()), string(h.RequestURI())) {
			return fasthttp.RequestConfig{MaxRequestBodySize: 1}
		}
		return fasthttp.RequestConfig{}
	}
	return s, nil
}

// App is the Fiber app, for tests and for Listen.
func (s *Server) App() *fiber.App { return s.app }

// Listen serves until ctx ends, then drains and shuts down: no new
// sessions (503, and /readyz says draining), the creates under way
// finish and are answered, everything else is served meanwhile; then the
// listener closes. Running sessions stay for the next gateway to adopt.
func (s *Server) Listen(ctx context.Context, addr string) error {
	ln, err := net.Listen(s.app.Config().Network, addr) // as Fiber's own Listen (tcp4 by default)
	if err != nil {
		return err
	}
	return s.Serve(ctx, ln)
}

// Serve is Listen on a listener of the caller's.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, func() error { return s.app.Listener(eofListener{ln}) })
}

func (s *Server) serve(ctx context.Context, listen func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- listen() }()
	go s.janitor(ctx)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	t0 := time.Now()
	s.log.Info("draining: no new sessions; waiting for the creates under way", "limit", s.cfg.DrainTimeout)
	dctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
	err := s.sessions.Drain(dctx)
	cancel()
	if err != nil {
		s.log.Warn("drain cut short", "err", err)
	}
	s.log.Info("drained; closing the listener", "took", time.Since(t0).Round(time.Millisecond))
	return s.app.ShutdownWithTimeout(5 * time.Second)
}

func (s *Server) routes() {
	a := s.app
	// A request a replica standing by forwarded (ForwardedHeader) ends
	// its connection, but for an upgrade: the client's next request is
	// routed again by the replica it reaches.
	a.Use(func(c *fiber.Ctx) error {
		if c.Get(ForwardedHeader) == "" {
			return c.Next()
		}
		err := c.Next()
		if err != nil || c.Response().StatusCode() != fiber.StatusSwitchingProtocols {
			c.Context().SetConnectionClose()
		}
		return err
	})
	a.Use(s.limitBody)
	a.Get("/healthz", func(c *fiber.Ctx) error { return c.JSON(fiber.Map{"status": "ok"}) })
	// Probes (a kubelet's, a load balancer's) name a replica by its
	// address, not by the gateway's host: /readyz answers them too, and
	// says why it is not ready only to a request that names the gateway.
	a.Get("/readyz", s.readyz)
	// So do scrapers (Prometheus's of each replica's Pod, by its
	// address): the metrics hold no tenant's name, key or session.
	a.Get("/metrics", s.metrics)
	a.Use(s.checkHost)
	a.Get("/openapi.yaml", s.openapiYAML)
	a.Get("/openapi.json", s.openapiJSONDoc)
	s.mcpRoutes(s.authenticate)

	s.adminRoutes()
	v1 := a.Group("/v1", s.authenticate)
	// What a request that changed a session recorded in its trail is
	// stored before the answer goes where a gateway on another host may
	// take the session over (session.Manager.Durable; on one host the
	// trail's file does it): what the client saw acknowledged outlives
	// this gateway being killed the moment after. Only for the
	// tenant's own session, and only for a change that was made. Not for
	// input actions: an agent sends many, and each would cost a store
	// write and a trail piece (their events follow within the journal's
	// interval).
	v1.Use("/sessions/:id", func(c *fiber.Ctx) error {
		err := c.Next()
		if c.Method() == fiber.MethodGet || c.Method() == fiber.MethodHead || err != nil || c.Response().StatusCode() >= 400 ||
			strings.HasSuffix(c.Path(), "/actions") {
			return err
		}
		if _, gerr := s.sessions.Get(tenantOf(c), c.Params("id")); gerr == nil {
			s.durable(c.Params("id"))
		}
		return err
	})
	v1.Get("/runtimes", s.listRuntimes)
	v1.Get("/pools", s.listPools)
	v1.Get("/usage", s.usage)
	v1.Post("/sessions", s.createSession)
	v1.Get("/sessions", s.listSessions)
	v1.Get("/sessions/:id", s.getSession)
	v1.Post("/sessions/:id/extend", s.extendSession)
	v1.Delete("/sessions/:id", s.deleteSession)
	v1.Post("/sessions/:id/previews", s.createPreview)
	v1.Delete("/sessions/:id/previews/:preview", s.revokePreview)
	v1.Post("/sessions/:id/screenshot", s.screenshot)
	v1.Post("/sessions/:id/actions", s.action)
	v1.Post("/sessions/:id/exec", s.exec)
	v1.Post("/credentials", s.withVault(s.createCredential))
	v1.Get("/credentials", s.withVault(listCredentials))
	v1.Get("/credentials/:cid", s.withVault(getCredential))
	v1.Delete("/credentials/:cid", s.withVault(s.deleteCredential))
	v1.Get("/sessions/:id/shell", s.shellUpgrade, s.shell())
	v1.Put("/sessions/:id/files", s.putFile)
	v1.Get("/sessions/:id/files", s.getFile)
	v1.Get("/sessions/:id/events", s.events)
	v1.Get("/sessions/:id/artifacts", s.listArtifacts)
	v1.Post("/sessions/:id/snapshots", s.createSnapshot)
	v1.Get("/sessions/:id/snapshots", s.listSnapshots)
	v1.Post("/profiles", s.createProfile)
	v1.Get("/profiles", s.listProfiles)
	v1.Get("/profiles/:pid", s.getProfile)
	v1.Delete("/profiles/:pid", s.deleteProfile)
	v1.Post("/profiles/:pid/rollback", s.rollbackProfile)
	v1.Get("/artifacts/:id", s.getArtifact)

	a.Post(relayAdmitPath, s.relayAuth(false), s.relayAdmit)
	a.Post(relaySyncPath, s.relayAuth(true), s.relaySync)
	a.Get("/review/:token", s.reviewAuth, s.review)
	a.Get("/review/:token/artifacts/:id", s.reviewAuth, s.reviewArtifact)
	a.All("/review*", refuseToken)
	s.previewRoutes()
}

// previewRoutes are the routes of preview connections, CDP and VNC:
// what a replica that stands by serves itself (NewRelay).
func (s *Server) previewRoutes() {
	a := s.app
	a.Get("/viewer-assets/:name", s.viewerAsset)
	a.Get("/view/:token", s.previewAuth(ScopeView), s.viewPage)
	a.All("/view*", refuseToken)
	a.Get("/vnc/:token", s.checkOrigin, s.previewAuth(ScopeVNC, ScopeView), s.vncUpgrade, s.vncProxy())
	a.All("/vnc*", refuseToken)

	// The same with the token in an Authorization header instead of the
	// path, for tools that take an endpoint and headers (Playwright MCP's
	// --cdp-header, Puppeteer's browserWSEndpoint with headers).
	// (Routes, not a group: a group's handlers run for everything under
	// its prefix, the tokens in paths included.)
	a.Get("/cdp/json", s.checkOrigin, s.previewAuth(ScopeCDP), s.cdpDiscovery)
	a.Get("/cdp/json/*", s.checkOrigin, s.previewAuth(ScopeCDP), s.cdpDiscovery)
	a.Get("/cdp/devtools/*", s.checkOrigin, s.previewAuth(ScopeCDP), s.cdpUpgrade, s.cdpProxy())
	a.Get("/cdp", s.checkOrigin, s.previewAuth(ScopeCDP), s.cdpUpgrade, s.cdpProxy())
	cdp := a.Group("/cdp/:token", s.checkOrigin, s.previewAuth(ScopeCDP))
	cdp.Get("/json", s.cdpDiscovery)
	cdp.Get("/json/*", s.cdpDiscovery)
	cdp.Get("/devtools/*", s.cdpUpgrade, s.cdpProxy())
	// ws://gw/cdp/TOKEN itself is the browser endpoint, for clients that
	// take a WebSocket URL (Puppeteer's browserWSEndpoint).
	cdp.Get("/", s.cdpUpgrade, s.cdpProxy())
	// Whatever else is under /cdp: 401 without a valid token (also for an
	// empty one), 404 with one.
	a.All("/cdp*", refuseToken)
}

// isUpload tells whether a request is a file upload, whose body streams.
func isUpload(method, uri string) bool {
	path, _, _ := strings.Cut(uri, "?")
	return method == fiber.MethodPut && strings.HasSuffix(path, "/files")
}

// bodyLimit is the largest body a request may carry: none for a file
// upload (it streams), MCP's own for /mcp (write_file carries up to 8 MiB,
// base64 in JSON), the gateway's for everything else.
func (s *Server) bodyLimit(c *fiber.Ctx) (limit int, streams bool) {
	switch {
	case isUpload(c.Method(), c.OriginalURL()):
		return 0, true
	case s.mcp != nil && strings.EqualFold(strings.TrimSuffix(c.Path(), "/"), "/mcp"):
		return max(s.cfg.BodyLimit, mcpBodyLimit), false
	}
	return s.cfg.BodyLimit, false
}

// limitBody refuses request bodies over their route's limit, and
// compressed ones: Fiber's Body unpacks a Content-Encoding with no bound
// (a kilobyte of nested gzip became gigabytes), before any handler could
// check the size, or the key.
func (s *Server) limitBody(c *fiber.Ctx) error {
	if encoded(c) {
		return refuseBody(c, &apiError{status: 415, code: "invalid_argument", msg: "request bodies are not compressed: send them without Content-Encoding"})
	}
	limit, streams := s.bodyLimit(c)
	if streams {
		// An upload refused, before its body was read or after, ends
		// its connection: what is left of the body must not be read as
		// the connection's next request.
		err := c.Next()
		if err != nil || c.Response().StatusCode() >= 400 {
			c.Set(fiber.HeaderConnection, "close")
			c.Context().SetConnectionClose()
		}
		return err
	}
	n := c.Request().Header.ContentLength()
	if n > limit || n == -1 {
		return tooLarge(c, fmt.Sprintf("the request body is larger than %d bytes", limit))
	}
	return c.Next()
}

// tooLarge answers 413. It first reads a bounded part of what is being
// sent, so that the client reads this answer rather than a reset
// connection, and closes the connection after it.
func tooLarge(c *fiber.Ctx, msg string) error {
	return refuseBody(c, &apiError{status: 413, code: "invalid_argument", msg: msg})
}

// refuseBody answers err to a request whose body is not taken, as
// tooLarge does.
func refuseBody(c *fiber.Ctx, err *apiError) error {
	if st := c.Context().RequestBodyStream(); st != nil {
		io.CopyN(io.Discard, st, 64<<20)
	}
	c.Set(fiber.HeaderConnection, "close")
	return err
}

// encoded: the request says its body is coded (any Content-Encoding
// but identity, in any of its headers).
func encoded(c *fiber.Ctx) bool {
	coded := false
	c.Request().Header.VisitAll(func(k, v []byte) {
		if strings.EqualFold(string(k), fiber.HeaderContentEncoding) {
			for _, e := range strings.Split(string(v), ",") {
				e = strings.TrimSpace(e)
				coded = coded || e != "" && !strings.EqualFold(e, "identity")
			}
		}
	})
	return coded
}

// refuseToken answers what is left under a preview prefix: 401 without a
// valid token (also an empty one), 404 with one.
func refuseToken(c *fiber.Ctx) error {
	if c.Locals(localClaims) != nil {
		return errNotFound("no such endpoint")
	}
	return errUnauthenticated("the preview token is missing, invalid or expired")
}

// namesGateway says whether the request's Host is one of the gateway's.
// c.Hostname() reads X-Forwarded-Host only from a trusted proxy.
func (s *Server) namesGateway(c *fiber.Ctx) bool {
	return s.hosts[strings.ToLower(c.Hostname())]
}

// checkHost refuses requests whose Host is not the gateway's, which stops
// DNS rebinding from turning a browser into a client of the gateway.
func (s *Server) checkHost(c *fiber.Ctx) error {
	if !s.namesGateway(c) {
		return errDenied("the Host header does not name this gateway")
	}
	return c.Next()
}

// checkOrigin refuses browser requests from other sites. Clients that send
// no Origin (CDP libraries) pass.
func (s *Server) checkOrigin(c *fiber.Ctx) error {
	o := c.Get(fiber.HeaderOrigin)
	if o == "" || strings.EqualFold(o, s.origin) {
		return c.Next()
	}
	// The gateway's own pages, reached under another of its host names.
	if u, err := url.Parse(o); err == nil && (u.Scheme == "http" || u.Scheme == "https") && s.hosts[strings.ToLower(u.Host)] {
		return c.Next()
	}
	return errDenied("cross-origin requests are not allowed")
}

const localTenant = "tenant"

// bearerKey is the request's API key (Authorization: Bearer).
func bearerKey(c *fiber.Ctx) (string, error) {
	key, ok := strings.CutPrefix(c.Get(fiber.HeaderAuthorization), "Bearer ")
	if !ok || key == "" {
		return "", errUnauthenticated("an API key is required: Authorization: Bearer <key>")
	}
	return key, nil
}

// authenticate maps the bearer API key to its tenant.
func (s *Server) authenticate(c *fiber.Ctx) error {
	key, err := bearerKey(c)
	if err != nil {
		return err
	}
	name, err := s.tenants.Authenticate(key)
	switch {
	case errors.Is(err, tenant.ErrDisabled):
		return errDenied("the tenant is disabled")
	case err != nil:
		return errUnauthenticated("the API key is not valid")
	}
	c.Locals(localTenant, name)
	return c.Next()
}

func tenantOf(c *fiber.Ctx) string { return c.Locals(localTenant).(string) }

// reqCtx derives the context a handler passes down: it ends when the
// client goes away or the deadline passes.
func reqCtx(c *fiber.Ctx, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.UserContext(), d)
}

// readyz answers 200 when the session backend and MinIO answer, else 503;
// the reason only to a request whose Host names the gateway.
func (s *Server) readyz(c *fiber.Ctx) error {
	err := s.ready(c)
	if err != nil && !s.namesGateway(c) {
		return &apiError{status: 503, code: "unavailable", msg: "not ready"}
	}
	return err
}

func (s *Server) ready(c *fiber.Ctx) error {
	ctx, cancel := reqCtx(c, 5*time.Second)
	defer cancel()
	if err := s.sessions.Ready(ctx); err != nil {
		msg := "the session backend is not answering"
		if pe := (*session.PublicError)(nil); errors.As(err, &pe) {
			msg = pe.Msg // "containerd is not answering", say
		}
		return &apiError{status: 503, code: "unavailable", msg: msg, err: err}
	}
	if err := s.store.Ready(ctx); err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is not answering", err: err}
	}
	if why := s.sessions.DiskLow(); why != "" {
		return &apiError{status: 503, code: "unavailable", msg: "the host's disk is nearly full: " + why}
	}
	if s.sessions.Draining() {
		return &apiError{status: 503, code: "unavailable", msg: "draining: the gateway is shutting down"}
	}
	if a := s.sessions.Admission(); a.Full() {
		return &apiError{status: 503, code: "unavailable", msg: fmt.Sprintf("full: %d sessions of a capacity of %d (%d creates waiting)", a.Sessions, a.Capacity, a.Queued)}
	}
	return c.JSON(fiber.Map{"status": "ready"})
}

func (s *Server) metrics(c *fiber.Ctx) error {
	counts := map[session.State]int{}
	for _, t := range s.tenantNames() {
		if s.sessions == nil { // unit tests run the server without one
			break
		}
		for _, i := range s.sessions.List(t) {
			counts[i.State]++
		}
	}
	var b strings.Builder
	b.WriteString("# HELP sandgate_sessions Sessions known to the gateway, by state.\n# TYPE sandgate_sessions gauge\n")
	for _, st := range []session.State{session.StateStarting, session.StateRunning, session.StateStopping, session.StateStopped, session.StateFailed} {
		fmt.Fprintf(&b, "sandgate_sessions{state=%q} %d\n", st, counts[st])
	}
	var pools []session.PoolStats
	if s.sessions != nil { // unit tests run the server without one
		pools = s.sessions.Pools()
	}
	gauge := func(name, help string, v func(session.PoolStats) any) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
		for _, p := range pools {
			fmt.Fprintf(&b, "%s{pool=%q} %v\n", name, p.Key, v(p))
		}
	}
	counter := func(name, help string, v func(session.PoolStats) int64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n", name, help, name)
		for _, p := range pools {
			fmt.Fprintf(&b, "%s{pool=%q} %d\n", name, p.Key, v(p))
		}
	}
	writeLeading(&b, true)
	writeProcessStats(&b)
	s.exits.mu.Lock()
	exits := s.exits.total
	s.exits.mu.Unlock()
	s.watch.mu.Lock()
	watchers := len(s.watch.cancel)
	s.watch.mu.Unlock()
	fmt.Fprintf(&b, "# HELP sandgate_download_watchers Download watchers running: one per running browser session, claimed or pooled.\n# TYPE sandgate_download_watchers gauge\nsandgate_download_watchers %d\n", watchers)
	spares, sparesUsed, sparesDiscarded := s.spareCounts()
	fmt.Fprintf(&b, "# HELP sandgate_cdp_spares CDP connections dialled into sessions' browsers ahead of their clients (one per browser session at most).\n# TYPE sandgate_cdp_spares gauge\nsandgate_cdp_spares %d\n", spares)
	fmt.Fprintf(&b, "# HELP sandgate_cdp_spares_used_total CDP clients that got a connection dialled ahead.\n# TYPE sandgate_cdp_spares_used_total counter\nsandgate_cdp_spares_used_total %d\n", sparesUsed)
	fmt.Fprintf(&b, "# HELP sandgate_cdp_spares_discarded_total Connections dialled ahead found closed or not idle when a client came (it dialled anew).\n# TYPE sandgate_cdp_spares_discarded_total counter\nsandgate_cdp_spares_discarded_total %d\n", sparesDiscarded)
	fmt.Fprintf(&b, "# HELP sandgate_browser_exits_total Browsers that exited (crashed or were closed) under running sessions.\n# TYPE sandgate_browser_exits_total counter\nsandgate_browser_exits_total %d\n", exits)
	if s.sessions != nil {
		a := s.sessions.Admission()
		fmt.Fprintf(&b, "# HELP sandgate_create_queue Creates waiting for room under a tenant's quotas or the gateway's capacity.\n# TYPE sandgate_create_queue gauge\nsandgate_create_queue %d\n", a.Queued)
		fmt.Fprintf(&b, "# HELP sandgate_capacity_sessions Tenant sessions the gateway holds at most (0: no limit).\n# TYPE sandgate_capacity_sessions gauge\nsandgate_capacity_sessions %d\n", a.Capacity)
		fmt.Fprintf(&b, "# HELP sandgate_create_queue_waits_total Creates that waited, by how it ended.\n# TYPE sandgate_create_queue_waits_total counter\n")
		fmt.Fprintf(&b, "sandgate_create_queue_waits_total{result=\"admitted\"} %d\nsandgate_create_queue_waits_total{result=\"timed_out\"} %d\n", a.Admitted, a.TimedOut)
		fmt.Fprintf(&b, "# HELP sandgate_create_queue_wait_seconds_total Time creates spent waiting.\n# TYPE sandgate_create_queue_wait_seconds_total counter\nsandgate_create_queue_wait_seconds_total %g\n", a.WaitSeconds)
		fmt.Fprintf(&b, "# HELP sandgate_create_queue_wait_seconds_max The longest wait of a create so far.\n# TYPE sandgate_create_queue_wait_seconds_max gauge\nsandgate_create_queue_wait_seconds_max %g\n", a.MaxWaitSoFar)
	}
	if len(pools) > 0 {
		gauge("sandgate_pool_size", "Sessions a warm pool keeps started.", func(p session.PoolStats) any { return p.Size })
		gauge("sandgate_pool_available", "Started, unclaimed sessions of a warm pool.", func(p session.PoolStats) any { return p.Available })
		gauge("sandgate_pool_frozen", "Available sessions of a warm pool whose processes are frozen.", func(p session.PoolStats) any { return p.Frozen })
		gauge("sandgate_pool_settling", "Available sessions of a warm pool whose start is still busy.", func(p session.PoolStats) any { return p.Settling })
		gauge("sandgate_pool_starting", "Sessions of a warm pool on their way.", func(p session.PoolStats) any { return p.Starting })
		counter("sandgate_pool_claims_total", "Creates served from a warm pool.", func(p session.PoolStats) int64 { return p.Claims })
		counter("sandgate_pool_misses_total", "Creates that fit a warm pool and found it empty.", func(p session.PoolStats) int64 { return p.Misses })
		counter("sandgate_pool_refills_total", "Sessions started for a warm pool.", func(p session.PoolStats) int64 { return p.Refills })
		counter("sandgate_pool_refill_errors_total", "Warm pool starts that failed.", func(p session.PoolStats) int64 { return p.RefillErrors })
		gauge("sandgate_pool_refill_seconds", "Mean time of a warm pool refill.", func(p session.PoolStats) any { return float64(p.RefillAvgMs) / 1000 })
	}
	c.Set(fiber.HeaderContentType, "text/plain; version=0.0.4")
	return c.SendString(b.String())
}

func (s *Server) tenantNames() []string {
	var out []string
	for _, t := range s.tenants.List() {
		out = append(out, t.Name)
	}
	return out
}

// Option configures a Server.
type Option func(*Server)

// writeLeading writes whether this gateway serves the sessions: the only
// one, or the leading replica (1), or a replica standing by (0).
func writeLeading(b *strings.Builder, leading bool) {
	v := 0
	if leading {
		v = 1
	}
	fmt.Fprintf(b, "# HELP sandgate_gateway_leading 1 when this gateway serves the sessions (the only one, or the replica that leads them), 0 when it stands by.\n# TYPE sandgate_gateway_leading gauge\nsandgate_gateway_leading %d\n", v)
}

// writeProcessStats writes the gateway process's goroutines, open
// descriptors and resident memory.
func writeProcessStats(b *strings.Builder) {
	goroutines, fds, rss := processStats()
	fmt.Fprintf(b, "# HELP sandgate_gateway_goroutines Goroutines of the gateway process.\n# TYPE sandgate_gateway_goroutines gauge\nsandgate_gateway_goroutines %d\n", goroutines)
	fmt.Fprintf(b, "# HELP sandgate_gateway_open_fds Open file descriptors of the gateway process.\n# TYPE sandgate_gateway_open_fds gauge\nsandgate_gateway_open_fds %d\n", fds)
	fmt.Fprintf(b, "# HELP sandgate_gateway_resident_bytes Resident memory of the gateway process.\n# TYPE sandgate_gateway_resident_bytes gauge\nsandgate_gateway_resident_bytes %d\n", rss)
}

// processStats reads the gateway's goroutines, open descriptors and
// resident memory (-1 where /proc does not say).
func processStats() (goroutines, fds int, rss int64) {
	goroutines, fds, rss = runtime.NumGoroutine(), -1, -1
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		fds = len(ents)
	}
	if raw, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(raw)); len(f) > 1 {
			if pages, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				rss = pages * int64(os.Getpagesize())
			}
		}
	}
	return goroutines, fds, rss
}
