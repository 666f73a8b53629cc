package gateway

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/desktop"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/tenant"
)

// A replica that stands by carries the preview connections (CDP and
// VNC) it is sent itself, straight to the session's Pod, rather than
// forwarding them to the leader: the gateway's bandwidth for them is
// every replica's, and they outlive the leader's death. The leader
// keeps the word on every session: it admits each connection (the
// token's session runs, its preview is not revoked, its tenant is
// enabled) and is told, every relaySyncEvery, which connections each
// replica carries. It registers them as its own (so a session's bounds
// on connections count them), and its answer names those to end: the
// preview revoked, the session ended, the tenant disabled. What a
// connection records in the session's trail and its activity (the idle
// timeout) go with the same report. A replica that cannot reach a
// leader for relayGrace (one died; the next takes a lease's duration
// and its adoption) ends the connections it carries: nobody could end
// them when they are revoked.
//
// It carries the sessions' shells and commands (exec) the same way,
// through the Pod exec API: the leader admits each by the client's API
// key (its tenants are the word) and answers with a ticket, a token of
// scopeShell that no preview route takes, which the replica's reports
// name the shell (and a command's event) by in place of a preview
// token.
//
// The two internal routes are the leader's; a replica signs its
// requests with the gateway's preview-token keys (HMAC over the time,
// a nonce, the path and the body), so nothing else can ask where a
// session's Pod is, and the leader reads each connection's token with
// its own keys.
const (
	relayAdmitPath = "/internal/v1/relay/admit"
	relaySyncPath  = "/internal/v1/relay/sync"
	// relayShellRoute, relayExecRoute, relayFilesRoute,
	// relayActionsRoute, relayScreenshotRoute: the shells, commands,
	// files, actions and screenshots a relay carries (with a sandbox).
	relayShellRoute      = "/v1/sessions/:id/shell"
	relayExecRoute       = "/v1/sessions/:id/exec"
	relayFilesRoute      = "/v1/sessions/:id/files"
	relayActionsRoute    = "/v1/sessions/:id/actions"
	relayScreenshotRoute = "/v1/sessions/:id/screenshot"
	// relaySnapshotsRoute: a session's snapshots, taken (a relay with a
	// sandbox carries these) and listed (answered alone, orAlone).
	relaySnapshotsRoute = "/v1/sessions/:id/snapshots"
	// relayListRoute, relayReadRoute, relayPreviewsRoute,
	// relayRevokeRoute, relayExtendRoute: the session reads, extensions
	// and deletes, and previews' issues and revocations a relay answers
	// while no leader answers (orAlone).
	relayListRoute     = "/v1/sessions"
	relayUsageRoute    = "/v1/usage"
	relayReadRoute     = "/v1/sessions/:id"
	relayPreviewsRoute = "/v1/sessions/:id/previews"
	relayRevokeRoute   = "/v1/sessions/:id/previews/:preview"
	relayExtendRoute   = "/v1/sessions/:id/extend"
	// relayRuntimesRoute, relayPoolsRoute, relayTenantsRoute,
	// relayTenantRoute, relayKeysRoute: the runtimes, the pools and the
	// admin API's reads a relay answers while no leader answers
	// (orAlone, adminAlone).
	relayRuntimesRoute = "/v1/runtimes"
	relayPoolsRoute    = "/v1/pools"
	relayTenantsRoute  = "/admin/v1/tenants"
	relayTenantRoute   = "/admin/v1/tenants/:name"
	relayKeysRoute     = "/admin/v1/tenants/:name/keys"
	// relayCredentialsRoute, relayCredentialRoute: the credentials a
	// relay answers with its own vault while no leader answers
	// (vaultAlone).
	relayCredentialsRoute = "/v1/credentials"
	relayCredentialRoute  = "/v1/credentials/:cid"
	// relayProfilesRoute, relayProfileRoute, relayRollbackRoute: the
	// profiles a relay creates, lists, reads, deletes and rolls back
	// while no leader answers (profilesAlone).
	relayProfilesRoute = "/v1/profiles"
	relayProfileRoute  = "/v1/profiles/:pid"
	relayRollbackRoute = "/v1/profiles/:pid/rollback"
	// relayEventsRoute, relayArtifactsRoute, relayArtifactRoute,
	// relayReviewRoute, relayReviewArtifactRoute: the trails,
	// artifacts and review links a relay answers from the store while
	// no leader answers (orAlone, reviewOrAlone).
	relayEventsRoute         = "/v1/sessions/:id/events"
	relayArtifactsRoute      = "/v1/sessions/:id/artifacts"
	relayArtifactRoute       = "/v1/artifacts/:id"
	relayReviewRoute         = "/review/:token"
	relayReviewArtifactRoute = "/review/:token/artifacts/:id"
	relayHeader              = "X-Sandgate-Relay"
	// relaySkew bounds how far a signed request's time may be from the
	// leader's clock.
	relaySkew = time.Minute
	// relaySyncEvery is how often a replica reports its connections: a
	// revocation reaches them within about that.
	relaySyncEvery = time.Second
	// relayGrace: a replica that has not reached a leader for this long
	// ends the connections it carries. Longer than a takeover: the
	// hold's duration, its renewal period and the adoption.
	relayGrace = 90 * time.Second
	// relayForget: the leader drops the registration of a connection
	// no report has named for this long (its replica died).
	relayForget = 10 * time.Second
	// maxRelayConns bounds the connections one replica carries, and so
	// one report.
	maxRelayConns = 1024
	// maxRelayEvents bounds the events a replica keeps for the leader
	// while none answers; past it the oldest go.
	maxRelayEvents = 4096
	// relayEventGrace: an event is taken with a token that expired up
	// to this long ago (a connection closed by its expiry reports it).
	relayEventGrace = 10 * time.Minute
	maxRelayBody    = 4 << 20
	maxRelayNonces  = 1 << 16
	// maxRelayAdmits bounds the admissions of preview connections a
	// replica asks at once; maxShellAdmits those of shells.
	maxRelayAdmits = 64
	maxShellAdmits = 16
	// maxAloneAnswers bounds the session reads and previews' issues
	// and revocations, trails and artifacts a replica answers (or
	// passes on) at once while no leader takes them, apart from the
	// shells' turns; maxReviewAnswers, the review links' apart from
	// those (a link needs no API key: its holders cannot take a
	// tenant's turns to revoke); maxIssuedAlone the previews it issues or revokes a tenant while
	// no leader answers, each an event kept for the next leader among
	// everyone's (and a revocation, an object in the store).
	maxAloneAnswers  = 8
	maxReviewAnswers = 4
	// maxVaultAnswers bounds the credential requests, apart from those:
	// the vault's MinIO may hang where the Pods' API server does not.
	maxVaultAnswers = 4
	// maxProfileAnswers bounds the profile requests, apart from all
	// those (the profile store's MinIO, too, may hang), each within
	// profileAlone.
	maxProfileAnswers = 4
	profileAlone      = 10 * time.Second
	// maxFillAnswers bounds the fill_credential actions a replica
	// fills at once while no leader answers (each holds a browser's
	// typing, up to 40 s); those passed to a leader take none.
	maxFillAnswers = 16
	// maxMCPAnswers bounds the MCP requests a replica answers at once
	// while no leader takes them (each a tool call, which may hold a
	// command's run: its own calls to the API go through the Front).
	maxMCPAnswers = 16
	// maxMCPAnswersPerTenant: of those, one tenant's.
	maxMCPAnswersPerTenant = 4
	maxIssuedAlone         = 64
	// A running session's review uses kept while no leader answers: of
	// one link, and of all tenants together (keepReview).
	maxReviewUsesAlone    = 8
	maxReviewUsesAllAlone = 512
	// maxReportEvents bounds the events of one report;
	// maxReportDurable the sessions it asks to store.
	maxReportEvents  = 256
	maxReportDurable = 64
)

// relaySign is the signature of a relay request: the key's id, the
// time, a nonce (a request is taken once), and an HMAC of them with the
// path and body.
func relaySign(keys map[string][]byte, kid string, at time.Time, nonce, path string, body []byte) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	m := hmac.New(sha256.New, keys[kid])
	m.Write([]byte("sandgate relay\x00" + ts + "\x00" + nonce + "\x00" + path + "\x00"))
	m.Write(body)
	return kid + " " + ts + " " + nonce + " " + hex.EncodeToString(m.Sum(nil))
}

// relayNonces are the nonces of the signed requests taken within
// twice relaySkew: one seen again is a replay.
type relayNonces struct {
	mu     sync.Mutex
	m      map[string]time.Time
	pruned time.Time
}

// take records nonce: errReplay when it was seen, errBusy when the
// store is full (more than replicas sign in that time).
func (n *relayNonces) take(nonce string, now time.Time) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = map[string]time.Time{}
	}
	if _, seen := n.m[nonce]; seen {
		return errReplay
	}
	// The old ones go, at most once a second.
	if len(n.m) >= 1024 && now.Sub(n.pruned) > time.Second {
		n.pruned = now
		for k, at := range n.m {
			if now.Sub(at) > 2*relaySkew {
				delete(n.m, k)
			}
		}
	}
	if len(n.m) >= maxRelayNonces {
		return errBusy
	}
	n.m[nonce] = now
	return nil
}

var (
	errReplay = errors.New("a relay request seen before")
	errBusy   = errors.New("too many relay requests")
)

// relayAuth lets through only requests a replica signed with one of the
// gateway's keys, within relaySkew of now. Anything else is a 404, as
// for any route that is not there. once: a request with a nonce seen
// before is refused too (a report: replayed, it would write its events
// again). An admission replayed tells the replayer only what it saw go
// by, and admissions come as fast as clients connect, so their nonces
// are not kept.
func (s *Server) relayAuth(once bool) fiber.Handler {
	return func(c *fiber.Ctx) error { return s.relayCheck(c, once) }
}

func (s *Server) relayCheck(c *fiber.Ctx, once bool) error {
	parts := strings.Fields(c.Get(relayHeader))
	notFound := errNotFound("no such endpoint")
	if len(parts) != 4 || s.tokens.keys[parts[0]] == nil || len(parts[2]) != 32 {
		return notFound
	}
	ts, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return notFound
	}
	at := time.Unix(ts, 0)
	if d := time.Since(at); d > relaySkew || d < -relaySkew {
		return notFound
	}
	want := relaySign(s.tokens.keys, parts[0], at, parts[2], c.Path(), c.Body())
	if !hmac.Equal([]byte(want), []byte(strings.Join(parts, " "))) {
		return notFound
	}
	if !once {
		return c.Next()
	}
	switch s.relayNonces.take(parts[2], time.Now()) {
	case errReplay:
		return notFound
	case errBusy:
		c.Set(fiber.HeaderRetryAfter, "2")
		return &apiError{status: 503, code: "unavailable", msg: "too many relay requests; retry"}
	}
	return c.Next()
}

type relayAdmitRequest struct {
	Token string `json:"token,omitempty"`
	// Shell asks for a session's shell instead of a preview's
	// connection.
	Shell *relayShellRequest `json:"shell,omitempty"`
}

type relayShellRequest struct {
	Session string `json:"session"`
	// Key is the client's API key: the leader's tenants are the word
	// (a replica that stands by may lack a key issued since it
	// started, or keep one revoked since).
	Key string `json:"key"`
}

type relayAdmitAnswer struct {
	CDP     string         `json:"cdp"`
	VNC     string         `json:"vnc"`
	Version []byte         `json:"version,omitempty"`
	Screen  session.Screen `json:"screen"`
	// Isolation is the session's runtime's (the viewer page shows it).
	Isolation string `json:"isolation,omitempty"`
	// The token's claims as the leader read them (its keys are the
	// word: a replica that stood by since before a rotation may lack
	// one).
	Session  string `json:"session"`
	Tenant   string `json:"tenant"`
	Scope    string `json:"scope"`
	ViewOnly bool   `json:"view_only,omitempty"`
	Preview  string `json:"preview"`
	Expires  int64  `json:"expires"`
	// Ticket, for a shell: what the replica's reports name the
	// shell's connection by (a token of scopeShell, which no preview
	// route takes), in place of a preview token.
	Ticket string `json:"ticket,omitempty"`
	// Refused, for a shell: why the leader would not open it itself
	// (the status and error the client gets).
	Refused *relayRefusal `json:"refused,omitempty"`
	// AllowRoot, for a shell: the tenant may run commands as root.
	AllowRoot bool `json:"allow_root,omitempty"`
	// MaxFileBytes, for a shell: the largest file the tenant may
	// upload (0: the default).
	MaxFileBytes int64 `json:"max_file_bytes,omitempty"`
	// MaxArtifactBytes, for a shell: the tenant's artifact quota (0:
	// none), which a snapshot the replica takes keeps within.
	MaxArtifactBytes int64 `json:"max_artifact_bytes,omitempty"`
	// Quota, for a shell: MaxArtifactBytes is said (a leader of the
	// version before says nothing of the quota).
	Quota bool `json:"quota,omitempty"`
	// Kind, for a shell: the session's (browser or desktop), for
	// actions and screenshots, with CDP, VNC and Screen.
	Kind session.Kind `json:"kind,omitempty"`
}

type relayRefusal struct {
	Status  int    `json:"status"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// relayAdmit answers a replica about to carry a connection: where the
// token's session serves, if the leader would admit it itself.
func (s *Server) relayAdmit(c *fiber.Ctx) error {
	var req relayAdmitRequest
	if err := json.Unmarshal(c.Body(), &req); err != nil {
		return errInvalid("the body must be a relay admission")
	}
	if req.Shell != nil {
		return s.relayShell(c, *req.Shell)
	}
	claims, ep, info, err := managerLive{s}.admit(req.Token)
	if err != nil {
		return err
	}
	if claims.Scope == scopeShell {
		return errUnauthenticated("the preview token is missing, invalid or expired")
	}
	return c.JSON(relayAdmitAnswer{CDP: ep.CDP.String(), VNC: ep.VNC.String(), Version: ep.Version, Screen: info.Screen, Isolation: info.Isolation,
		Session: claims.Session, Tenant: claims.Tenant, Scope: claims.Scope, ViewOnly: claims.ViewOnly, Preview: claims.ID, Expires: claims.ExpiresAt.Unix()})
}

// relayShell answers a replica about to carry a shell: whether the
// leader would open it itself (the API key's tenant, enabled; its
// session, running), and the ticket the replica's reports name it by.
// A refusal is an answer (200), so that the replica tells its
// client what the leader would have.
func (s *Server) relayShell(c *fiber.Ctx, req relayShellRequest) error {
	refuse := func(err error) error {
		st, code, msg := publicOf(err)
		if st >= 500 {
			s.log.Error("a relay's shell admission failed", "session", req.Session, "status", st, "err", err)
		}
		return c.JSON(relayAdmitAnswer{Refused: &relayRefusal{Status: st, Code: code, Message: msg}})
	}
	tenantName, err := s.tenants.Authenticate(req.Key)
	switch {
	case errors.Is(err, tenant.ErrDisabled):
		return refuse(errDenied("the tenant is disabled"))
	case err != nil:
		return refuse(errUnauthenticated("the API key is not valid"))
	case !ids.IsSession(req.Session):
		return refuse(errNotFound("no such session"))
	}
	ep, err := s.sessions.Endpoint(tenantName, req.Session)
	if err != nil {
		return refuse(err)
	}
	info, err := s.sessions.Get(tenantName, req.Session)
	if err != nil {
		return refuse(err)
	}
	// The ticket lasts as long as the session may (its TTL extended
	// to the tenant's longest): the session's end closes the shell.
	lim, _ := s.sessions.Limits(tenantName)
	until := info.CreatedAt.Add(lim.MaxTTL)
	if info.ExpiresAt.After(until) {
		until = info.ExpiresAt
	}
	until = until.Add(time.Minute)
	claims := shellClaims(tenantName, req.Session, "")
	claims.ExpiresAt = jwtTime(until)
	ticket, err := s.tokens.issue(*claims)
	if err != nil {
		return err
	}
	return c.JSON(relayAdmitAnswer{Session: claims.Session, Tenant: claims.Tenant, Scope: claims.Scope, Preview: claims.ID,
		Expires: until.Unix(), Ticket: ticket, AllowRoot: lim.AllowRoot, MaxFileBytes: max(lim.MaxFileBytes, 0),
		MaxArtifactBytes: max(lim.MaxArtifactBytes, 0), Quota: true, CDP: ep.CDP.String(), VNC: ep.VNC.String(), Screen: info.Screen, Kind: info.Kind})
}

type relaySyncRequest struct {
	Relay  string           `json:"relay"`
	Conns  []relayConnState `json:"conns"`
	Events []relayEvent     `json:"events"`
	// Touched: tokens of requests with no connection of their own (CDP
	// discovery) since the last report: activity.
	Touched []string `json:"touched,omitempty"`
	// Durable: tickets of the sessions a request changed (an upload, a
	// screenshot), whose trails the leader stores before it answers.
	Durable []string `json:"durable,omitempty"`
	// Run names the replica's process, and First counts the events it
	// reported before this report's first: a report carried again
	// (its answer was lost) has its events recorded once (relayRuns).
	Run   string `json:"run,omitempty"`
	First int    `json:"first,omitempty"`
}

type relayConnState struct {
	ID     string `json:"id"`
	Token  string `json:"token"`
	Active bool   `json:"active,omitempty"`
}

type relayEvent struct {
	Token      string `json:"token"`
	Type       string `json:"type"`
	DurationMS int64  `json:"duration_ms,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Limit      int64  `json:"limit,omitempty"`
	ExitCode   int    `json:"exit_code,omitempty"` // shell_closed, exec
	// exec's: the command, as its trail event has it (argv bounded by
	// the relay, relayArgvBytes).
	Argv          []string `json:"argv,omitempty"`
	ArgvTruncated bool     `json:"argv_truncated,omitempty"`
	User          string   `json:"user,omitempty"`
	Cwd           string   `json:"cwd,omitempty"`
	EnvNames      []string `json:"env_names,omitempty"`
	TimedOut      bool     `json:"timed_out,omitempty"`
	StdoutBytes   int64    `json:"stdout_bytes,omitempty"`
	StderrBytes   int64    `json:"stderr_bytes,omitempty"`
	// file_upload's and file_download's: the file's path, its size,
	// its digest (an upload's) and kind (a download's: file or dir).
	Path   string `json:"path,omitempty"`
	Bytes  int64  `json:"bytes,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	Kind   string `json:"kind,omitempty"`
	// action's: its name; screenshot's: the artifact (its size in
	// Bytes, its digest in SHA256).
	Action   string `json:"action,omitempty"`
	Artifact string `json:"artifact,omitempty"`
	// fill_credential's (and its _denied, _failed and _raced): the
	// credential (in Credential, below), the selector, the field typed
	// and how (Mode), the page's address as the audit keeps it, before
	// and after (Reason says why it was denied or raced).
	Selector  string `json:"selector,omitempty"`
	Field     string `json:"field,omitempty"`
	Mode      string `json:"mode,omitempty"`
	Page      string `json:"page,omitempty"`
	PageAfter string `json:"page_after,omitempty"`
	// snapshot_saved's: the snapshot (its id in Artifact, its size in
	// Bytes, its digest in SHA256, how long it took in DurationMS), its
	// files, and whether some changed while read.
	Files   int64 `json:"files,omitempty"`
	Changed bool  `json:"changed_while_read,omitempty"`
	// preview_revoked's: the preview (the event's token is a ticket of
	// its session's), and whether the replica added it to the session's
	// stored log already (an ended session's: the leader holds it, and
	// records nothing).
	Preview string `json:"preview,omitempty"`
	Logged  bool   `json:"logged,omitempty"`
	// review_opened's and review_fetched's (a running session's review
	// link used while no leader answered): the viewer's digest, and the
	// fetched artifact's name (its id in Artifact, its kind in Kind).
	Viewer string `json:"viewer,omitempty"`
	Name   string `json:"name,omitempty"`
	// An egress event's (EgressEvent): the destination, the address it
	// was reached at, the way through the proxy, the credential, and
	// the refusals a limit counted.
	Host       string `json:"host,omitempty"`
	Port       int    `json:"port,omitempty"`
	Address    string `json:"address,omitempty"`
	Via        string `json:"via,omitempty"`
	Credential string `json:"credential,omitempty"`
	Refused    int    `json:"refused,omitempty"`
	// At is when the replica kept the event (stamped by measure); the
	// leader records it as the event's happened_at (recordRelayed).
	At time.Time `json:"at,omitzero"`
	// wire is what the event takes in a report (its JSON), measured as
	// it is kept.
	wire int
	// egress: the session of an egress event (EgressEvent).
	egress string
}

// Bounds of what a relay reports, well under the leader's limit on a
// request's body (the gateway's, a megabyte by default), so that no
// report is refused for its size and none holds up those after it:
// relayArgvBytes bounds the command an exec's event carries (a
// request's body may hold a megabyte of it), relayEventBytes one
// event's JSON (escaped, a byte may take six), relayReportBytes the
// events of one report, relayReportMax the whole report.
const (
	relayArgvBytes   = 16 << 10
	relayEventBytes  = 128 << 10
	relayReportBytes = 256 << 10
	relayReportMax   = 768 << 10
)

// measure sets ev.wire, cutting an exec's command (then its working
// directory and names) until the event fits relayEventBytes.
func (ev *relayEvent) measure() {
	if ev.At.IsZero() {
		ev.At = time.Now().UTC() // (kept now: see relayEvent.At)
	}
	for _, budget := range []int{relayArgvBytes, 2 << 10, 0} {
		if budget < relayArgvBytes {
			var cut bool
			ev.Argv, cut = boundArgv(ev.Argv, budget)
			ev.ArgvTruncated = ev.ArgvTruncated || cut
		}
		if budget == 0 {
			ev.Cwd, ev.EnvNames, ev.ArgvTruncated = "", nil, true
		}
		raw, _ := json.Marshal(ev)
		if ev.wire = len(raw); ev.wire <= relayEventBytes {
			return
		}
	}
}

type relaySyncAnswer struct {
	Close []relayClose `json:"close"`
}

type relayClose struct {
	ID     string `json:"id"`
	Reason string `json:"reason"`
}

// relayed is what the leader knows of the connections replicas carry,
// and of their runs' events.
type relayed struct {
	mu    sync.Mutex
	m     map[string]*relayedConn // relay + "\x00" + connection id
	sweep sync.Once
	runs  relayRuns
}

// relayRuns is what the leader knows of each run of a relay (a
// replica's process): how many of its events it has recorded, so that
// the events of a report sent again, whose answer was lost, are not
// recorded twice. A run's reports are taken one at a time.
type relayRuns struct {
	mu sync.Mutex
	m  map[string]*relayRun // relay + "\x00" + run
}

type relayRun struct {
	mu       sync.Mutex // held while a report of the run is recorded
	recorded int        // the run's events recorded (or skipped), from its first
	seen     time.Time
}

// maxRelayRuns bounds the runs remembered; past it, the one not heard
// from for longest is forgotten.
const maxRelayRuns = 1024

// record passes to rec the events of a report that its run's earlier
// reports did not carry (take).
func (r *relayRuns) record(req relaySyncRequest, now time.Time, rec func(relayEvent)) {
	skip, done := r.take(req.Relay, req.Run, req.First, now)
	defer done(len(req.Events))
	for _, ev := range req.Events[min(skip, len(req.Events)):] {
		rec(ev)
	}
}

// take waits for the run's report under way, if any, and says how many
// of a report's events, the first of which is the run's event first,
// were recorded before; done(n) says the report's n events are
// recorded, and lets the next report of the run be taken. Without a
// run (a replica of an earlier version), nothing is skipped.
func (r *relayRuns) take(relay, run string, first int, now time.Time) (skip int, done func(n int)) {
	if run == "" {
		return 0, func(int) {}
	}
	key := relay + "\x00" + run
	r.mu.Lock()
	if r.m == nil {
		r.m = map[string]*relayRun{}
	}
	rr := r.m[key]
	if rr == nil {
		if len(r.m) >= maxRelayRuns {
			oldest := ""
			for k, o := range r.m {
				if oldest == "" || o.seen.Before(r.m[oldest].seen) {
					oldest = k
				}
			}
			delete(r.m, oldest)
		}
		rr = &relayRun{}
		r.m[key] = rr
	}
	rr.seen = now
	r.mu.Unlock()
	rr.mu.Lock()
	return max(rr.recorded-first, 0), func(n int) {
		rr.recorded = max(rr.recorded, first+n)
		rr.mu.Unlock()
	}
}

type relayedConn struct {
	release func()
	// closed: the preview was revoked, or the session ended. Set by the
	// session manager's closer, under the manager's lock: no lock here.
	closed atomic.Bool
	seen   time.Time
}

// relaySync takes a replica's report: it registers the connections it
// names, drops those it no longer names, records their events and
// activity, and answers which must end.
func (s *Server) relaySync(c *fiber.Ctx) error {
	var req relaySyncRequest
	if err := json.Unmarshal(c.Body(), &req); err != nil || req.Relay == "" || len(req.Relay) > 256 || strings.ContainsRune(req.Relay, 0) ||
		len(req.Conns) > maxRelayConns || len(req.Events) > maxRelayEvents || len(req.Run) > 64 || req.First < 0 {
		return errInvalid("the body must be a relay report")
	}
	s.relayed.sweep.Do(func() { go s.sweepRelayed() })
	now := time.Now()
	var ans relaySyncAnswer
	named := map[string]bool{}
	for _, rc := range req.Conns {
		if rc.ID == "" || len(rc.ID) > 64 || strings.ContainsRune(rc.ID, 0) {
			ans.Close = append(ans.Close, relayClose{ID: rc.ID, Reason: "invalid report"})
			continue
		}
		key := req.Relay + "\x00" + rc.ID
		named[key] = true
		claims, err := s.tokens.verify(rc.Token, now)
		if err != nil {
			ans.Close = append(ans.Close, relayClose{ID: rc.ID, Reason: "preview expired"})
			continue
		}
		if why := s.relayKeep(key, claims, now); why != "" {
			ans.Close = append(ans.Close, relayClose{ID: rc.ID, Reason: why})
			continue
		}
		if rc.Active {
			s.sessions.Touch(claims.Session)
		}
	}
	// What the replica no longer names has closed there. (Released
	// outside the lock: the manager's closers are called under its own.)
	prefix := req.Relay + "\x00"
	var gone []func()
	s.relayed.mu.Lock()
	for key, rc := range s.relayed.m {
		if strings.HasPrefix(key, prefix) && !named[key] {
			gone = append(gone, rc.release)
			delete(s.relayed.m, key)
		}
	}
	s.relayed.mu.Unlock()
	for _, release := range gone {
		release()
	}
	for i, tok := range req.Touched {
		if i >= maxRelayConns {
			break
		}
		if claims, err := s.tokens.verify(tok, now); err == nil {
			s.sessions.Touch(claims.Session)
		}
	}
	s.relayed.runs.record(req, now, func(ev relayEvent) {
		if claims, err := s.tokens.verify(ev.Token, now.Add(-relayEventGrace)); err == nil {
			s.relayEvent(claims, ev)
		}
	})
	changed := map[string]string{} // session: tenant
	for i, tok := range req.Durable {
		if i >= maxRelayConns {
			break
		}
		if claims, err := s.tokens.verify(tok, now.Add(-relayEventGrace)); err == nil && claims.Scope == scopeShell {
			changed[claims.Session] = claims.Tenant
		}
	}
	s.durableAll(changed)
	return c.JSON(ans)
}

// relayDurableWithin bounds how long a report's answer waits for the
// trails to be stored: well under the relay's wait for it (a report
// it gives up on comes again, held back until this one is done:
// relayRuns).
const relayDurableWithin = 2500 * time.Millisecond

// durableAll stores the trails of the sessions (session: tenant) a
// report's uploads or screenshots changed, a few at a time, within
// relayDurableWithin: their events are stored before the answer, as the
// leader's own are (routes), for the relay waits for this answer to
// answer its client. Those left are the journal's to store.
func (s *Server) durableAll(changed map[string]string) {
	if len(changed) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), relayDurableWithin)
	defer cancel()
	var wg sync.WaitGroup
	slots := make(chan struct{}, 8)
	for id, tenant := range changed {
		if _, err := s.sessions.Get(tenant, id); err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case slots <- struct{}{}:
				defer func() { <-slots }()
			case <-ctx.Done():
				return
			}
			if err := s.sessions.Durable(ctx, id); err != nil {
				s.log.Warn("the audit trail could not be stored at once; the journal tries again", "session", id, "err", err)
			}
		}()
	}
	wg.Wait()
}

// relayKeep registers a connection a replica carries, or renews its
// registration; it returns why it must end ("" if it may go on).
func (s *Server) relayKeep(key string, claims *previewClaims, now time.Time) string {
	s.relayed.mu.Lock()
	if s.relayed.m == nil {
		s.relayed.m = map[string]*relayedConn{}
	}
	const ended = "preview revoked or session ended"
	rc := s.relayed.m[key]
	if rc != nil {
		rc.seen = now
		s.relayed.mu.Unlock()
		if rc.closed.Load() || !s.tenants.Enabled(claims.Tenant) {
			return ended
		}
		return ""
	}
	s.relayed.mu.Unlock()
	if _, _, _, err := (managerLive{s}).admit(claims.raw); err != nil {
		return ended
	}
	rc = &relayedConn{seen: now}
	release, err := s.sessions.Track(claims.Tenant, claims.Session, claims.ID, closerFunc(func() error {
		rc.closed.Store(true)
		return nil
	}))
	if err != nil {
		if errors.Is(err, session.ErrQuota) {
			return "too many live connections"
		}
		return ended
	}
	rc.release = release
	s.relayed.mu.Lock()
	if old := s.relayed.m[key]; old != nil { // two reports at once
		s.relayed.mu.Unlock()
		release()
		return ""
	}
	s.relayed.m[key] = rc
	s.relayed.mu.Unlock()
	return ""
}

// relayEvent records what a replica's connection reported, with fields
// the leader makes from the token and bounded values: a replica does not
// write a trail's event as it likes.
func (s *Server) relayEvent(claims *previewClaims, ev relayEvent) {
	if claims.Scope == scopeShell {
		s.relayShellEvent(claims, ev)
		return
	}
	// The same fields as the leader's own connections record.
	base := map[string]any{"preview": claims.ID, "scope": claims.Scope}
	switch ev.Type {
	case "preview_connected":
		if claims.Scope != ScopeCDP {
			base["view_only"] = claims.ViewOnly
		}
		s.recordRelayed(ev, claims.Session, base)
	case "preview_closed":
		base["duration_ms"] = max(ev.DurationMS, 0)
		if claims.Scope == ScopeCDP {
			base["reason"] = truncate(ev.Reason, 200)
		}
		s.recordRelayed(ev, claims.Session, base)
	case "message_too_big":
		base["limit"] = max(ev.Limit, 0)
		s.recordRelayed(ev, claims.Session, base)
	case "preview_issued":
		// Issued by a replica while no leader answered (issueAlone).
		s.recordRelayed(ev, claims.Session, issuedFields(claims))
	case "review_opened", "review_fetched":
		// A running session's review link used while no leader
		// answered (reviewOrAlone).
		f, ok := reviewFields(claims, ev)
		if !ok {
			s.log.Warn("a relay reported a review's use that cannot be; not recorded", "session", claims.Session, "scope", claims.Scope)
			return
		}
		if s.recordRelayed(ev, claims.Session, f) {
			s.durable(claims.Session)
			return
		}
		// A session this leader does not hold (it ended as the leader
		// took over, and was not adopted): its stored log, as noteReview
		// adds to an ended session's, apart from the report's answer.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := s.recordStored(ctx, claims.Tenant, claims.Session, session.Event{Time: time.Now().UTC(), Type: ev.Type, Fields: f}); err != nil {
				s.log.Warn("a review's use a replica kept is of a session this leader does not hold, and its stored log did not take it", "session", claims.Session, "preview", claims.ID, "err", err)
			}
		}()
	case "client_left":
		s.clientLeft(claims.Session)
	case "browser_gone":
		go s.checkBrowser(claims.Tenant, claims.Session)
	}
}

// reviewFields are the fields noteReview records for a review's use ev
// that a relay kept, or false when ev cannot be one: the token is not a
// review link's, the viewer not a digest, or a fetch's artifact not one
// of the link's session.
func reviewFields(claims *previewClaims, ev relayEvent) (map[string]any, bool) {
	if claims.Scope != ScopeReview || !viewerDigest(ev.Viewer) {
		return nil, false
	}
	f := map[string]any{"preview": claims.ID, "viewer": ev.Viewer}
	if ev.Type == "review_fetched" {
		if !recordings.IsArtifact(ev.Artifact) || !strings.HasPrefix(ev.Artifact, claims.Session+".") {
			return nil, false
		}
		f["artifact"], f["kind"], f["name"] = ev.Artifact, truncate(ev.Kind, 64), truncate(ev.Name, 256)
	}
	return f, true
}

// viewerDigest tells whether v is a review viewer's digest as
// signer.viewer makes it: 16 lowercase hex digits.
func viewerDigest(v string) bool {
	if len(v) != 16 {
		return false
	}
	for _, r := range v {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return false
		}
	}
	return true
}

// relayShellEvent records a shell's event with the fields the leader's
// own shells record.
func (s *Server) relayShellEvent(claims *previewClaims, ev relayEvent) {
	switch ev.Type {
	case "shell_opened":
		s.recordRelayed(ev, claims.Session, nil)
	case "preview_revoked":
		// Revoked by a replica while no leader answered (revokeAlone),
		// and stored there: held here too (this leader may have read
		// the stored revocations before it), its connections ended,
		// here and on the relays, and recorded.
		// Not stored again, nor the trail stored before the report's
		// answer: nothing here waits on the store (a report holds the
		// next of its replica's).
		if !ids.IsPreview(ev.Preview) {
			return
		}
		if err := s.sessions.HoldRevocation(claims.Tenant, claims.Session, ev.Preview, time.Now().Add(s.cfg.MaxPreviewTTL)); err != nil {
			s.log.Warn("a revocation a replica made while no leader answered is not held here", "session", claims.Session, "preview", ev.Preview, "err", err)
			return
		}
		if ev.Logged {
			return // (an ended session's: in its stored log already)
		}
		s.recordRelayed(ev, claims.Session, map[string]any{"preview": ev.Preview, "stored": true})
	case "shell_closed":
		s.recordRelayed(ev, claims.Session, map[string]any{"exit_code": ev.ExitCode, "duration_ms": max(ev.DurationMS, 0)})
	case "message_too_big":
		s.recordRelayed(ev, claims.Session, map[string]any{"scope": scopeShell, "limit": max(ev.Limit, 0)})
	case "exec":
		if ev.User != "root" {
			ev.User = "sandgate"
		}
		fields := execFields(nonNil(ev.Argv), ev.User, ev.Cwd, nonNil(ev.EnvNames), ev.ExitCode, max(ev.DurationMS, 0), ev.TimedOut,
			max(ev.StdoutBytes, 0), max(ev.StderrBytes, 0))
		if ev.ArgvTruncated {
			fields["argv_truncated"] = true
		}
		s.recordRelayed(ev, claims.Session, fields)
	case "file_upload":
		sum := ev.SHA256
		if !isDigest(sum) {
			sum = ""
		}
		s.recordRelayed(ev, claims.Session, uploadFields(truncate(ev.Path, maxPathBytes), max(ev.Bytes, 0), sum))
	case "file_download":
		if ev.Kind != "dir" {
			ev.Kind = "file"
		}
		s.recordRelayed(ev, claims.Session, downloadFields(truncate(ev.Path, maxPathBytes), ev.Kind, max(ev.Bytes, 0)))
	case "action":
		if !slices.Contains(desktop.Actions, ev.Action) {
			s.log.Warn("a relay reported an action of no known name; recorded as invalid", "session", claims.Session)
			ev.Action = "invalid"
		}
		s.recordRelayed(ev, claims.Session, map[string]any{"action": ev.Action})
	case "screenshot":
		if !relayedArtifact(ev, claims.Session) {
			s.log.Warn("a relay reported a screenshot with an artifact id or digest that cannot be; recorded without them", "session", claims.Session)
			ev.Artifact, ev.SHA256 = "", ""
		}
		s.recordRelayed(ev, claims.Session, screenshotFields(recordings.Artifact{ID: ev.Artifact, Size: max(ev.Bytes, 0), SHA256: ev.SHA256}))
	case "fill_credential", "fill_credential_denied", "fill_credential_failed", "fill_credential_raced":
		// A fill a replica made while no leader answered (fillAlone).
		fields, ok := relayedFill(ev)
		if !ok {
			s.log.Warn("a relay reported a fill_credential event that cannot be; not recorded", "session", claims.Session, "type", ev.Type)
			return
		}
		s.recordRelayed(ev, claims.Session, fields)
	case "snapshot_saved":
		// A snapshot a replica took and stored: it counts against the
		// tenant's quota here from now on.
		fields, ok := relayedSnapshot(ev, claims.Session)
		if !ok {
			s.log.Warn("a relay reported a snapshot with an artifact id or digest that cannot be; recorded without them", "session", claims.Session)
		}
		s.invalidateArtifactBytes(claims.Tenant)
		s.recordRelayed(ev, claims.Session, fields)
	default:
		// The egress proxy's of a replica that stands by (EgressEvent).
		if f, ok := egressFields(ev); ok {
			s.recordRelayed(ev, claims.Session, f)
		}
	}
}

// relayedFill is a relayed fill_credential event's fields in the
// session's trail, as the leader's own fills record them, and whether
// it can be one: a credential id, a field and mode of those a fill
// has, a selector and pages within a fill's bounds.
func relayedFill(ev relayEvent) (map[string]any, bool) {
	if !egress.ValidCredentialID(ev.Credential) || ev.Field != "secret" && ev.Field != "username" ||
		ev.Selector == "" || len(ev.Selector) > maxFillSelector || len(ev.Page) > 512 || len(ev.PageAfter) > 512 {
		return nil, false
	}
	f := map[string]any{"credential": ev.Credential, "selector": ev.Selector, "field": ev.Field}
	// A denial comes before the mode is known; every other event has
	// one.
	switch {
	case ev.Type == "fill_credential_denied" && ev.Mode == "":
	case ev.Type != "fill_credential_denied" && (ev.Mode == egress.FillPlaceholder || ev.Mode == egress.FillValue):
		f["mode"] = ev.Mode
	default:
		return nil, false
	}
	if ev.Page != "" {
		f["page"] = ev.Page
	}
	if ev.PageAfter != "" {
		f["page_after"] = ev.PageAfter
	}
	switch ev.Type {
	case "fill_credential_denied", "fill_credential_raced":
		if !slices.Contains(fillReasons[ev.Type], ev.Reason) {
			return nil, false
		}
		f["reason"] = ev.Reason
	}
	return f, true
}

// relayedSnapshot is a relayed snapshot_saved's fields in session's
// trail, and whether its snapshot's id and digest can be (if not, it
// has neither); no count is below 0.
func relayedSnapshot(ev relayEvent, session string) (map[string]any, bool) {
	ok := relayedArtifact(ev, session)
	if !ok {
		ev.Artifact, ev.SHA256 = "", ""
	}
	return snapshotFields(recordings.Artifact{ID: ev.Artifact, Size: max(ev.Bytes, 0), SHA256: ev.SHA256},
		max(ev.Files, 0), ev.Changed, max(ev.DurationMS, 0)), ok
}

// relayedArtifact: a relayed event's artifact id is one the store
// gives session's artifacts, and its digest a SHA-256.
func relayedArtifact(ev relayEvent, session string) bool {
	rnd, ok := strings.CutPrefix(ev.Artifact, session+".")
	return ok && len(rnd) == 16 && strings.Trim(rnd, "0123456789abcdef") == "" && isDigest(ev.SHA256)
}

// isDigest: a SHA-256 in hex.
func isDigest(s string) bool {
	return len(s) == 64 && strings.Trim(s, "0123456789abcdef") == ""
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// sweepRelayed drops, now and then, the registrations of connections no
// report has named for relayForget: their replica died.
// recordRelayed records a relayed event ev in session id's trail with
// fields, and with the time the replica kept it (happened_at): a report
// comes a second or so after, and while no leader answers, a while
// after. (The trail's own time is the leader's as it records.) A time
// ahead of the leader's clock is taken as now; one over a day old is
// left out.
func (s *Server) recordRelayed(ev relayEvent, id string, fields map[string]any) bool {
	if at, ok := relayedAt(ev.At, time.Now()); ok {
		f := make(map[string]any, len(fields)+1)
		maps.Copy(f, fields)
		f["happened_at"] = at.Format(time.RFC3339Nano)
		fields = f
	}
	return s.sessions.Record(id, ev.Type, fields)
}

func relayedAt(at, now time.Time) (time.Time, bool) {
	switch {
	case at.IsZero() || at.Before(now.Add(-24*time.Hour)):
		return time.Time{}, false
	case at.After(now):
		return now.UTC(), true
	}
	return at.UTC(), true
}

func (s *Server) sweepRelayed() {
	t := time.NewTicker(relayForget / 2)
	defer t.Stop()
	for range t.C {
		cutoff := time.Now().Add(-relayForget)
		var gone []func()
		s.relayed.mu.Lock()
		for key, rc := range s.relayed.m {
			if rc.seen.Before(cutoff) {
				gone = append(gone, rc.release)
				delete(s.relayed.m, key)
			}
		}
		s.relayed.mu.Unlock()
		for _, release := range gone {
			release()
		}
	}
}

// relayLive is a relaying replica's previewLive: the leader's word.
type relayLive struct {
	identity string
	run      string // names this process's reports (relayRuns)
	leader   func(ctx context.Context) (string, error)
	host     string // the Host the leader takes: the gateway's own
	client   *http.Client
	log      *slog.Logger
	forget   func(id string) // drops what the server keeps of a session

	mu     sync.Mutex
	conns  map[string]*relayConn
	events []relayEvent
	// base counts the events ever taken off the front of events (sent
	// or dropped): the report's answer takes off those it carried.
	base     int
	dropped  int
	admitted map[string]time.Time // session: when a connection was last admitted
	touched  map[string]bool      // tokens of discovery requests since the last report
	durable  map[string]string    // session: the ticket of a request that changed it, to report
	// admits bounds the admissions asked of the leader at once.
	admits chan struct{}
	// shellAdmits bounds the shell admissions asked at once, apart:
	// an API key cannot be checked here, so a stranger's junk keys
	// reach the leader, and must not take the previews' turns.
	shellAdmits chan struct{}
	// aloneAnswers bounds the session reads and previews' issues and
	// revocations at once (orAlone); issuedAlone counts the previews
	// issued, and revoked, each tenant since no leader answers
	// (tenant\x00kind; cleared once one does); revokedAlone holds the
	// previews revoked then (session\x00preview: until), refused here
	// until they would have expired, whatever a leader or the copy of
	// the stored revocations says meanwhile (a leader holds one once
	// this replica's report has reached it).
	aloneAnswers   chan struct{}
	reviewAnswers  chan struct{}  // the review links' (maxReviewAnswers)
	vaultAnswers   chan struct{}  // the credentials' (maxVaultAnswers)
	profileAnswers chan struct{}  // the profiles' (maxProfileAnswers)
	fillAnswers    chan struct{}  // the fills' (maxFillAnswers)
	mcpAnswers     chan struct{}  // the MCP requests' (maxMCPAnswers)
	mcpBy          map[string]int // of those, each tenant's (under mu)
	// createAnswers are the turns of the creates carried; createsBy
	// counts each tenant's answered alone (under mu; createTurn).
	createAnswers chan struct{}
	createsBy     map[string]int
	issuedAlone   map[string]int
	revokedAlone  map[string]time.Time
	reached       time.Time // when a leader last answered a report
	addr          string    // the leader's, read at addrAt
	addrAt        time.Time
	addrErr       error
	lookup        sync.Mutex // one read of the leader at a time
	// refusedAt: when the leader last refused this replica's signature
	// (unix ns; 0 never).
	refusedAt atomic.Int64
	warned    atomic.Int64 // when the last "cannot ask" was logged (unix ns)
	reporting sync.Mutex
	signer    *signer // the token keys: it signs with them, and reads the tokens it can
	// sandbox names a session's Pod, for the shells (nil: none).
	sandbox func(id string) session.Sandbox
	// egressTickets: by session, the tickets its egress events are
	// reported by (EgressEvent); egressKept counts those events kept,
	// egressDropped those dropped since the last report (over
	// maxEgressKept).
	egressTickets map[string]egressTicket
	egressKept    int
	egressDropped int
	// egressBy: by session, its egress events kept, and those dropped
	// since its last egress_dropped was kept.
	egressBy map[string]*egressCount
	// storeOK: the artifact store answered when last asked
	// (watchStore; never without a store).
	storeOK atomic.Bool
	// recordings: where the sessions it creates alone have their
	// recordings placed (RecordAlone; unset: a create that records
	// waits for a leader).
	recordings atomic.Pointer[RecordingShare]
	// alone admits the connections and requests this replica carries
	// while no leader answers (nil: they wait for one).
	alone   *RelayAlone
	aloneMu sync.Mutex // held while it begins to admit alone
	// silentAt: when a leader last did not answer an admission;
	// silentSince: when the silence began (the first that did not). Both
	// unix ns, 0 once a leader answers. aloneFor: the silence (its
	// silentSince) for which admitting alone began.
	silentAt    atomic.Int64
	silentSince atomic.Int64
	aloneFor    atomic.Int64
	probing     atomic.Bool // an admission asks the leader after a silence
}

type relayConn struct {
	token            string
	session, preview string
	closer           io.Closer
	active           bool
	ended            bool // closed by endConns (once)
}

// NewRelay builds the gateway a replica standing by serves preview
// connections with (CDP and VNC, their tokens in the path or a header),
// asking the leader (at leader's address) about each. identity names
// the replica to the leader.
//
// With sandbox (nil: not), it carries the sessions' shells, commands,
// files and actions too, the leader admitting each by its API key:
// sandbox names a session's Pod, which they run in. Screenshots (the
// screenshot route's, and the actions') and snapshots are stored in
// store.
func NewRelay(cfg Config, identity string, leader func(ctx context.Context) (string, error), sandbox func(id string) session.Sandbox, store *recordings.Store, log *slog.Logger, opts ...Option) (*Server, error) {
	s, err := newServer(cfg, nil, store, log, opts...)
	if err != nil {
		return nil, err
	}
	l := &relayLive{identity: identity, run: randomNonce(), leader: leader, signer: s.tokens,
		host: cfg.PublicURL.Host, log: log, forget: s.forgetVersion,
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4, DialContext: (&net.Dialer{Timeout: 3 * time.Second}).DialContext},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		conns:        map[string]*relayConn{},
		admitted:     map[string]time.Time{},
		touched:      map[string]bool{},
		durable:      map[string]string{},
		admits:       make(chan struct{}, maxRelayAdmits),
		shellAdmits:  make(chan struct{}, maxShellAdmits),
		aloneAnswers: make(chan struct{}, maxAloneAnswers), reviewAnswers: make(chan struct{}, maxReviewAnswers),
		vaultAnswers:   make(chan struct{}, maxVaultAnswers),
		profileAnswers: make(chan struct{}, maxProfileAnswers),
		fillAnswers:    make(chan struct{}, maxFillAnswers),
		mcpAnswers:     make(chan struct{}, maxMCPAnswers),
		mcpBy:          map[string]int{},
		createsBy:      map[string]int{},
		createAnswers:  make(chan struct{}, maxCreatesAlone),
		issuedAlone:    map[string]int{},
		revokedAlone:   map[string]time.Time{},
		sandbox:        sandbox,
		egressTickets:  map[string]egressTicket{},
		egressBy:       map[string]*egressCount{},
	}
	s.live, s.shells = l, l
	if store != nil {
		go l.watchStore(store)
	}
	// One request a connection, but for the upgrade: the Front hands a
	// connection over by its first request, and another on it may be no
	// preview's.
	s.app.Use(func(c *fiber.Ctx) error {
		err := c.Next()
		if err != nil || c.Response().StatusCode() != fiber.StatusSwitchingProtocols {
			c.Context().SetConnectionClose()
		}
		return err
	})
	s.app.Use(s.limitBody)
	// Its own metrics, always (the Front hands them here), for any
	// host, as the leader's.
	s.app.Get("/metrics", l.metrics)
	s.app.Use(s.checkHost)
	s.previewRoutes()
	// The OpenAPI document while no leader answers (answersAlone).
	s.app.Get("/openapi.yaml", s.openapiYAML)
	s.app.Get("/openapi.json", s.openapiJSONDoc)
	if sandbox != nil {
		// The key is checked first, as the leader's middleware does:
		// the leader's admission is asked before the request's own
		// checks, and its refusal of the key (or its silence) answered
		// then; any other refusal (no such session, say) is answered
		// where the handler asks, after its own checks, as on the
		// leader.
		key := func(c *fiber.Ctx) error {
			if _, err := bearerKey(c); err != nil {
				return err
			}
			claims, ans, err := l.admitShell(c, c.Params("id"))
			if st, code, _ := publicOf(err); err != nil && (st >= 500 || code == "unauthenticated" || code == "permission_denied") {
				return err
			}
			c.Locals(localAdmission, &relayAdmission{claims: claims, ans: ans, err: err})
			return c.Next()
		}
		s.app.Get(relayShellRoute, key, s.shellUpgrade, s.shell())
		s.app.Post(relayExecRoute, key, s.exec)
		s.app.Put(relayFilesRoute, key, s.putFile)
		s.app.Get(relayFilesRoute, key, s.getFile)
		// fill_credential is the leader's (the vault is): passed on
		// whole, its key checked there, before this replica asks the
		// leader anything; while no leader takes it, it is filled
		// here with the replica's own vault (fillAlone).
		vault := func(c *fiber.Ctx) error {
			switch {
			case !fillsCredential(c.Body()):
				return c.Next()
			case l.alone == nil || l.alone.Vault == nil:
				return l.toLeader(c)
			}
			return s.fillOrAlone(c)
		}
		s.app.Post(relayActionsRoute, vault, key, s.action)
		s.app.Post(relayScreenshotRoute, key, s.screenshot)
		s.app.Post(relaySnapshotsRoute, key, s.createSnapshot)
		// Session reads and previews' issues come here only when the
		// Front could not pass them to a leader (answersAlone).
		s.app.Get(relayListRoute, l.orAlone(l.listAlone))
		s.app.Get(relayUsageRoute, l.orAlone(s.usageAlone))
		s.app.Get(relayRuntimesRoute, l.orAlone(s.runtimesAlone))
		s.app.Get(relayPoolsRoute, l.orAlone(s.poolsAlone))
		s.app.Get(relayReadRoute, l.orAlone(l.getAlone))
		s.app.Post(relayPreviewsRoute, l.orAlone(s.issueAlone))
		s.app.Delete(relayRevokeRoute, l.orAlone(s.revokeAlone))
		// And a session's create (a cold start, session.Alone).
		s.app.Post(relayListRoute, l.createOrAlone(s.createAlone))
		// And a session's extension and delete, by its Pod's record.
		s.app.Post(relayExtendRoute, l.orAlone(s.extendAlone))
		s.app.Delete(relayReadRoute, l.orAlone(s.deleteAlone))
		// And credentials, with the replica's own vault.
		s.app.Post(relayCredentialsRoute, l.vaultAlone(s.createCredential))
		s.app.Get(relayCredentialsRoute, l.vaultAlone(listCredentials))
		s.app.Get(relayCredentialRoute, l.vaultAlone(getCredential))
		s.app.Delete(relayCredentialRoute, l.vaultAlone(s.deleteCredential))
		// And profiles' creates and reads, with its own profile store.
		s.app.Post(relayProfilesRoute, s.profilesAlone(s.createProfileIn))
		s.app.Get(relayProfilesRoute, s.profilesAlone(listProfilesIn))
		s.app.Get(relayProfileRoute, s.profilesAlone(getProfileIn))
		s.app.Delete(relayProfileRoute, s.profilesAlone(s.deleteProfileIn))
		s.app.Post(relayRollbackRoute, s.profilesAlone(s.rollbackProfileIn))
		// So do trails, artifacts and review links (a reviewer's).
		s.app.Get(relayEventsRoute, l.orAlone(s.eventsAlone))
		s.app.Get(relayArtifactsRoute, l.orAlone(s.artifactsAlone))
		s.app.Get(relaySnapshotsRoute, l.orAlone(s.snapshotsAlone))
		s.app.Get(relayArtifactRoute, l.orAlone(s.artifactAlone))
		s.app.Get(relayReviewRoute, l.reviewOrAlone(s.review))
		s.app.Get(relayReviewArtifactRoute, l.reviewOrAlone(s.reviewArtifact))
		// And the admin API's reads, by the copy of the tenants.
		s.app.Get(relayTenantsRoute, s.authenticateAdmin, l.adminAlone(true, listTenantsIn))
		s.app.Get(relayTenantRoute, s.authenticateAdmin, l.adminAlone(true, getTenantIn))
		s.app.Get(relayKeysRoute, s.authenticateAdmin, l.adminAlone(false, listKeysIn))
		// And the MCP endpoint (WithMCP), its key checked by the copy
		// of the tenants: its tools call the API through this
		// replica's own listener, so each call goes to a leader or is
		// answered here, as any client's would be.
		s.mcpRoutes(l.mcpAlone)
	}
	s.app.Use(func(c *fiber.Ctx) error { return errNotFound("no such endpoint") })
	go l.loop()
	return s, nil
}

// metrics answers GET /metrics for a replica standing by: its own
// process and the preview connections and shells it carries, and that
// it does not lead. The sessions, pools and creates are the leader's
// to count: a scrape of every replica counts each once.
func (l *relayLive) metrics(c *fiber.Ctx) error {
	l.mu.Lock()
	carried := len(l.conns)
	l.mu.Unlock()
	var b strings.Builder
	writeLeading(&b, false)
	writeProcessStats(&b)
	fmt.Fprintf(&b, "# HELP sandgate_relay_connections Preview connections (CDP, VNC) and shells this replica carries to sessions itself while it stands by.\n# TYPE sandgate_relay_connections gauge\nsandgate_relay_connections %d\n", carried)
	c.Set(fiber.HeaderContentType, "text/plain; version=0.0.4")
	return c.SendString(b.String())
}

// ServeRelay serves a relay (NewRelay) on ln, as Serve serves the
// gateway's listener (a chunked upload whose client went at a chunk's
// end is one cut short).
func (s *Server) ServeRelay(ln net.Listener) error {
	return s.app.Listener(eofListener{ln})
}

// leaderAddr is where the leader serves, read at most every
// relayLeaderCache.
func (l *relayLive) leaderAddr(ctx context.Context) (string, error) {
	l.lookup.Lock()
	defer l.lookup.Unlock()
	l.mu.Lock()
	addr, at, err := l.addr, l.addrAt, l.addrErr
	l.mu.Unlock()
	if !at.IsZero() && time.Since(at) < relayLeaderCache {
		return addr, err
	}
	addr, err = l.leader(ctx)
	if err == nil && addr == "" {
		err = errors.New("no replica leads")
	}
	if err != nil {
		addr, err = "", fmt.Errorf("no leader: %w", err)
	}
	l.mu.Lock()
	l.addr, l.addrAt, l.addrErr = addr, time.Now(), err
	l.mu.Unlock()
	return addr, err
}

const relayLeaderCache = 2 * time.Second

// call posts a signed request to the leader and decodes its answer.
func (l *relayLive) call(ctx context.Context, path string, in, out any) (int, error) {
	addr, err := l.leaderAddr(ctx)
	if err != nil {
		return 0, err
	}
	body, err := json.Marshal(in)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Host = l.host
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(relayHeader, relaySign(l.signer.keys, l.signer.active, time.Now(), randomNonce(), path, body))
	resp, err := l.client.Do(req)
	if err != nil {
		l.forgetAddr(addr)
		return 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxRelayBody))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("the leader answered %d", resp.StatusCode)
	}
	return resp.StatusCode, json.Unmarshal(raw, out)
}

// maxLeaderAnswer bounds the body of an answer toLeader passes on.
const maxLeaderAnswer = 1 << 20

// toLeader sends the request, as its client sent it (its API key, its
// body), to the leader, and answers what the leader answers: for what
// this replica cannot do itself, on a route it carries.
func (l *relayLive) toLeader(c *fiber.Ctx) error {
	_, err := l.passOn(c, 90*time.Second)
	return err
}

// passed is what came of a request passOn passed on.
type passed int

const (
	// notSent: no leader is known, or none took the connection:
	// nothing was carried out.
	notSent passed = iota
	// unanswered: a leader took it and did not answer (whole): it may
	// have been carried out.
	unanswered
	// answered: the leader's answer is the client's.
	answered
)

// passOn is toLeader within timeout, and says what came of it.
func (l *relayLive) passOn(c *fiber.Ctx, timeout time.Duration) (passed, error) {
	ctx, cancel := reqCtx(c, timeout)
	defer cancel()
	addr, err := l.leaderAddr(ctx)
	if err != nil {
		return notSent, retrySoon(c, &apiError{status: 503, code: "unavailable", msg: "no gateway replica that answers leads the sessions; retry", err: err})
	}
	req, err := http.NewRequestWithContext(ctx, c.Method(), "http://"+addr+string(c.Request().URI().RequestURI()), bytes.NewReader(c.Body()))
	if err != nil {
		return notSent, errInvalid("the request cannot be passed on")
	}
	req.Host = l.host
	for _, h := range []string{fiber.HeaderAuthorization, fiber.HeaderContentType} {
		if v := c.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	// The client's own timeout, not the reports' 5 s: filling a field
	// takes what typing takes.
	client := &http.Client{Transport: l.client.Transport, CheckRedirect: l.client.CheckRedirect}
	// A 503 says to retry (Retry-After) only when the leader was not
	// reached: once it was, it may have carried the request out.
	resp, err := client.Do(req)
	// (Not the URL's words: its path may hold a preview's token.)
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var op *net.OpError
	if err != nil && errors.As(err, &op) && op.Op == "dial" {
		l.forgetAddr(addr)
		return notSent, retrySoon(c, &apiError{status: 503, code: "unavailable", msg: "the leading gateway replica did not answer; retry", err: err})
	}
	if err != nil {
		l.forgetAddr(addr)
		return unanswered, &apiError{status: 503, code: "unavailable", msg: "the leading gateway replica did not answer; the request may have been carried out", err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxLeaderAnswer+1))
	if err != nil || len(body) > maxLeaderAnswer {
		return unanswered, &apiError{status: 503, code: "unavailable", msg: "the leading gateway replica's answer did not arrive whole; the request may have been carried out", err: err}
	}
	// (A redirect's Location: an artifact's presigned link; a page's
	// policies: a review page's.)
	for _, h := range []string{fiber.HeaderContentType, fiber.HeaderRetryAfter, fiber.HeaderLocation, fiber.HeaderCacheControl,
		fiber.HeaderContentSecurityPolicy, fiber.HeaderReferrerPolicy} {
		if v := resp.Header.Get(h); v != "" {
			c.Set(h, v)
		}
	}
	return answered, c.Status(resp.StatusCode).Send(body)
}

// forgetAddr: the leader at addr did not answer. Another may lead by
// now: read again (at most each relayLeaderCache, however many ask).
func (l *relayLive) forgetAddr(addr string) {
	l.mu.Lock()
	if l.addr == addr && time.Since(l.addrAt) > relayLeaderCache/4 {
		l.addrAt = time.Time{}
	}
	l.mu.Unlock()
}

func (l *relayLive) admit(token string) (*previewClaims, session.Endpoint, session.Info, error) {
	bad := errUnauthenticated("the preview token is missing, invalid or expired")
	if token == "" || len(token) > 4096 {
		return nil, session.Endpoint{}, session.Info{}, bad
	}
	// A token this replica can read itself must be good before the
	// leader is asked: a stranger's junk costs the leader nothing. One
	// signed with a key this replica does not know (added since it
	// started) is the leader's to read.
	c, err := l.signer.verify(token, time.Now())
	if err != nil && l.signer.knows(token) || err == nil && l.heldRevoked(c.Session, c.ID) {
		return nil, session.Endpoint{}, session.Info{}, bad
	}
	release, err := l.slot(l.admits)
	if err != nil {
		return nil, session.Endpoint{}, session.Info{}, err
	}
	defer release()
	previews := l.alone != nil && l.alone.Enabled != nil && l.alone.Revoked != nil
	ans, st, alone, err := l.askOrAlone(relayAdmitRequest{Token: token}, previews)
	if alone {
		return l.previewAlone(context.Background(), token)
	}
	switch {
	case st == http.StatusUnauthorized:
		return nil, session.Endpoint{}, session.Info{}, bad
	case err != nil:
		return nil, session.Endpoint{}, session.Info{}, err
	}
	return l.fromAnswer(token, ans)
}

// ask asks the leader for an admission. Its errors are for the client
// (503s), but for the leader's 401, errLeaderRefused.
func (l *relayLive) ask(req relayAdmitRequest) (relayAdmitAnswer, int, error) {
	var ans relayAdmitAnswer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := l.call(ctx, relayAdmitPath, req, &ans)
	if st != 0 {
		l.answered() // whatever it said
	}
	switch {
	case st == http.StatusUnauthorized:
		return ans, st, errLeaderRefused
	case st == http.StatusNotFound:
		// The leader does not take this replica's signature (its keys
		// changed since this replica started): the Front forwards
		// preview connections and shells to the leader for a while.
		l.refusedAt.Store(time.Now().UnixNano())
		l.log.Warn("the leader refuses this replica's relay requests (are the token keys the same?): preview connections and shells go to the leader for a while")
		fallthrough
	case err != nil:
		if last := l.warned.Load(); time.Since(time.Unix(0, last)) > 10*time.Second && l.warned.CompareAndSwap(last, time.Now().UnixNano()) {
			l.log.Warn("cannot ask the leader about a connection", "err", err)
		}
		if st == 0 {
			l.silent()
			err = fmt.Errorf("%w: %v", errNoAnswer, err)
		}
		return ans, st, relayUnavailableFor(err)
	}
	return ans, st, nil
}

// silent notes that no leader answered (an admission, or a request
// passed on). A silence last noted over relayGrace ago, no leader
// asked since, is another's: this one begins now (its copies are read
// again, admitsAlone).
func (l *relayLive) silent() {
	now := time.Now().UnixNano()
	if last := l.silentAt.Swap(now); last != 0 && now-last > int64(relayGrace) {
		l.silentSince.Store(now)
		return
	}
	l.silentSince.CompareAndSwap(0, now)
}

// answered notes that a leader answered an admission: the silence, if
// any, is over (admissions ask it again), and so is admitting alone.
func (l *relayLive) answered() {
	l.silentAt.Store(0)
	if since := l.silentSince.Swap(0); since != 0 && l.aloneFor.Load() == since {
		l.log.Info("a leader answers again: it admits the connections and requests this replica carries")
		l.mu.Lock()
		clear(l.issuedAlone)
		l.mu.Unlock()
	}
}

// slot takes one of slots (the admissions at once, asked of the leader
// or made alone), or answers busy.
func (l *relayLive) slot(slots chan struct{}) (release func(), err error) {
	select {
	case slots <- struct{}{}:
		return func() { <-slots }, nil
	default:
		return nil, &apiError{status: 503, code: "unavailable", msg: "the gateway is busy; retry"}
	}
}

// askOrAlone asks the leader for an admission (ask), or says to make it
// alone (RelayAlone) when canAlone and no leader answers: without
// asking within relayLeaderCache of the last admission no leader
// answered (asking a dead one's address may wait for its dial); after
// that, one admission at a time asks again while the others are made
// alone.
func (l *relayLive) askOrAlone(req relayAdmitRequest, canAlone bool) (ans relayAdmitAnswer, st int, alone bool, err error) {
	if canAlone {
		ask, done := l.asks()
		defer done()
		if !ask {
			return ans, 0, true, nil
		}
	}
	ans, st, err = l.ask(req)
	return ans, st, canAlone && errors.Is(err, errNoAnswer), err
}

// asks says whether to ask the leader or to go on alone without
// asking, after a silence (askOrAlone); done is called once either is.
func (l *relayLive) asks() (ask bool, done func()) {
	at := l.silentAt.Load()
	if at == 0 {
		return true, func() {}
	}
	if time.Since(time.Unix(0, at)) < relayLeaderCache || !l.probing.CompareAndSwap(false, true) {
		return false, func() {}
	}
	return true, func() { l.probing.Store(false) }
}

// errNoAnswer: no leader answered an admission (none is known, or the
// one the lease names cannot be reached).
var errNoAnswer = errors.New("no leader answers")

var errLeaderRefused = errors.New("the leader refused the admission")

func relayUnavailable() error { return relayUnavailableFor(nil) }

// relayUnavailableFor is relayUnavailable, with its cause (logged,
// never sent).
func relayUnavailableFor(cause error) error {
	return &apiError{status: 503, code: "unavailable", msg: "the gateway cannot check the request now; retry", err: cause}
}

// openShell asks the leader whether the request's API key may open
// session id's shell.
func (l *relayLive) openShell(c *fiber.Ctx, id string) (*previewClaims, error) {
	claims, _, err := l.admitShell(c, id)
	return claims, err
}

// retrySoon: a 503 of the relay's own says when to retry, as the
// Front's do.
func retrySoon(c *fiber.Ctx, err error) error {
	var ae *apiError
	var word leaderWord
	if errors.As(err, &ae) && ae.status == 503 && !errors.As(err, &word) {
		c.Set(fiber.HeaderRetryAfter, "2")
	}
	return err
}

// openSession asks as openShell does; the leader's answer says where
// the session serves, its kind and its screen.
func (l *relayLive) openSession(c *fiber.Ctx, id string) (*previewClaims, session.Endpoint, session.Info, error) {
	claims, ans, err := l.admitShell(c, id)
	if err != nil {
		return nil, session.Endpoint{}, session.Info{}, err
	}
	cdp, err1 := netip.ParseAddrPort(ans.CDP)
	vnc, err2 := netip.ParseAddrPort(ans.VNC)
	if err1 != nil || err2 != nil || ans.Kind == "" {
		return nil, session.Endpoint{}, session.Info{}, relayUnavailable()
	}
	return claims, session.Endpoint{Addr: cdp.Addr(), CDP: cdp, VNC: vnc},
		session.Info{ID: id, Tenant: claims.Tenant, Kind: ans.Kind, Screen: ans.Screen, Isolation: ans.Isolation}, nil
}

// admitShell asks the leader whether the request's API key may run
// commands in session id, and gives the claims and the answer.
func (l *relayLive) admitShell(c *fiber.Ctx, id string) (*previewClaims, relayAdmitAnswer, error) {
	if a, ok := c.Locals(localAdmission).(*relayAdmission); ok && (a.err != nil || a.claims.Session == id) {
		return a.claims, a.ans, a.err // the route's middleware asked
	}
	claims, ans, err := l.askShell(c, id)
	return claims, ans, retrySoon(c, err)
}

// localAdmission holds the leader's admission of a request to a
// session (relayAdmission), asked by the relay's middleware.
const localAdmission = "relay-admission"

type relayAdmission struct {
	claims *previewClaims
	ans    relayAdmitAnswer
	err    error
}

func (l *relayLive) askShell(c *fiber.Ctx, id string) (*previewClaims, relayAdmitAnswer, error) {
	unavailable := relayUnavailable()
	key, err := boundedKey(c)
	if err != nil {
		return nil, relayAdmitAnswer{}, err
	}
	// Apart from the previews': an API key cannot be checked before
	// the leader is asked, and a stranger's junk keys must not take
	// the previews' turns.
	release, err := l.slot(l.shellAdmits)
	if err != nil {
		return nil, relayAdmitAnswer{}, err
	}
	defer release()
	ans, _, alone, err := l.askOrAlone(relayAdmitRequest{Shell: &relayShellRequest{Session: id, Key: key}}, l.alone != nil)
	if alone {
		return l.admitAlone(c, id, key)
	}
	switch {
	case errors.Is(err, errLeaderRefused):
		return nil, ans, unavailable // a shell's refusal is an answer
	case err != nil:
		return nil, ans, err
	case ans.Refused != nil:
		r := ans.Refused
		if r.Status < 400 || r.Status > 599 || r.Code == "" {
			return nil, ans, unavailable
		}
		return nil, ans, &apiError{status: r.Status, code: r.Code, msg: truncate(r.Message, 500)}
	case ans.Session != id || ans.Tenant == "" || ans.Scope != scopeShell || ans.Ticket == "" || len(ans.Ticket) > 4096:
		return nil, ans, unavailable
	}
	// A ticket signed with a key this replica knows must read as the
	// answer says (one signed with a newer key is the leader's word).
	if l.signer.knows(ans.Ticket) {
		t, err := l.signer.verify(ans.Ticket, time.Now())
		if err != nil || t.Session != id || t.Tenant != ans.Tenant || t.Scope != scopeShell {
			return nil, ans, unavailable
		}
	}
	l.mu.Lock()
	l.admitted[id] = time.Now()
	l.mu.Unlock()
	claims := shellClaims(ans.Tenant, id, ans.Ticket)
	claims.allowRoot = ans.AllowRoot
	claims.maxFileBytes = max(ans.MaxFileBytes, 0)
	claims.maxArtifactBytes, claims.quotaSaid = max(ans.MaxArtifactBytes, 0), ans.Quota
	return claims, ans, nil
}

// startShell runs the shell's command in the session's Pod itself.
func (l *relayLive) startShell(ctx context.Context, c *previewClaims, spec session.ExecSpec) (*session.Process, error) {
	return session.StartIn(ctx, l.sandbox(c.Session), spec, func(err error) {
		l.log.Warn("exec", "session", c.Session, "err", err)
	})
}

// fromAnswer makes the claims, endpoint and record of an admission.
func (l *relayLive) fromAnswer(token string, ans relayAdmitAnswer) (*previewClaims, session.Endpoint, session.Info, error) {
	cdp, err1 := netip.ParseAddrPort(ans.CDP)
	vnc, err2 := netip.ParseAddrPort(ans.VNC)
	if err1 != nil || err2 != nil || ans.Session == "" || ans.Tenant == "" || ans.Preview == "" {
		return nil, session.Endpoint{}, session.Info{}, &apiError{status: 503, code: "unavailable", msg: "the gateway cannot check the preview now; retry", err: errors.Join(err1, err2)}
	}
	c := &previewClaims{Session: ans.Session, Tenant: ans.Tenant, Scope: ans.Scope, ViewOnly: ans.ViewOnly, raw: token}
	c.ID = ans.Preview
	c.ExpiresAt = jwtTime(time.Unix(ans.Expires, 0))
	l.mu.Lock()
	l.admitted[c.Session] = time.Now()
	l.mu.Unlock()
	return c, session.Endpoint{Addr: cdp.Addr(), CDP: cdp, VNC: vnc, Version: ans.Version},
		session.Info{ID: c.Session, Tenant: c.Tenant, Screen: ans.Screen, Isolation: ans.Isolation}, nil
}

// RelayUsable says whether the Front may hand connections of kind to
// this relay (NewRelay): not within a minute of the leader refusing its
// signature (they are forwarded then), and actions, screenshots and
// snapshots only with a store to keep the screenshots and snapshots in.
func (s *Server) RelayUsable(kind Relays) bool {
	l, ok := s.live.(*relayLive)
	return ok && l.usable() && (!kind.Actions && !kind.Snapshots || l.storeOK.Load())
}

// relayStoreEvery is how often a relay asks whether its artifact store
// answers.
const relayStoreEvery = 5 * time.Second

// watchStore asks, now and every relayStoreEvery, whether the artifact
// store answers: while it does not, actions, screenshots and snapshots
// are forwarded to the leader (RelayUsable); once it does, this replica
// takes them again.
func (l *relayLive) watchStore(store *recordings.Store) {
	var last error
	for first := true; ; first = false {
		ctx, cancel := context.WithTimeout(context.Background(), relayStoreEvery)
		err := store.Ready(ctx)
		cancel()
		l.storeOK.Store(err == nil)
		switch {
		case err != nil && (first || last == nil):
			l.log.Warn("the artifact store does not answer: actions, screenshots and snapshots go to the leader until it does", "err", err)
		case err == nil && !first && last != nil:
			l.log.Info("the artifact store answers again: this replica carries actions, screenshots and snapshots")
		}
		last = err
		time.Sleep(relayStoreEvery)
	}
}

func (l *relayLive) usable() bool {
	at := l.refusedAt.Load()
	return at == 0 || time.Since(time.Unix(0, at)) > time.Minute
}

func randomNonce() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (l *relayLive) running(tenant, id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.admitted[id]
	return ok && time.Since(at) < relayGrace
}

func (l *relayLive) track(c *previewClaims, closer io.Closer) (func(), error) {
	id := ids.NewPreview()
	l.mu.Lock()
	// The session's bounds, here too (the leader counts every
	// replica's at the next report): a link's holder cannot fill this
	// replica's share.
	perSession, perPreview := 0, 0
	for _, rc := range l.conns {
		if rc.session == c.Session {
			perSession++
			if rc.preview == c.ID {
				perPreview++
			}
		}
	}
	if len(l.conns) >= maxRelayConns || perSession >= session.MaxSessionConns || perPreview >= session.MaxPreviewConns {
		l.mu.Unlock()
		return nil, errors.New("too many live connections")
	}
	if l.heldRevokedLocked(c.Session, c.ID, time.Now()) {
		// Revoked here after its admission (revokeAlone), before it
		// was tracked.
		l.mu.Unlock()
		return nil, errors.New("preview revoked")
	}
	if len(l.conns) == 0 {
		l.reached = time.Now() // the grace counts from the first
	}
	l.conns[id] = &relayConn{token: c.raw, session: c.Session, preview: c.ID, closer: closer, active: true}
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		delete(l.conns, id)
		l.mu.Unlock()
	}, nil
}

// event keeps ev for the next report; it returns the count of events
// ever kept, with ev (once base reaches it, ev was sent, or dropped).
func (l *relayLive) event(ev relayEvent) int {
	ev.measure()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.keepLocked(ev)
}

// keepLocked is event for a measured ev, l.mu held.
func (l *relayLive) keepLocked(ev relayEvent) int {
	if len(l.events) >= maxRelayEvents {
		l.taken(l.events[:1])
		l.events = l.events[1:]
		l.base++
		l.dropped++
	}
	if egressEvents[ev.Type] {
		l.egressKept++
	}
	l.events = append(l.events, ev)
	return l.base + len(l.events)
}

// relayFlushWithin bounds how long a request that changed its session
// waits for its event to reach the leader before it is answered.
const relayFlushWithin = 5 * time.Second

// flush reports until the events up to upTo are with the leader, and
// its ask to store session's trail, for at most relayFlushWithin (past
// it, or once a report fails, they go with the next reports); it says
// whether they are. Requests that flush at once share the reports: one
// report carries what all of them kept by then.
func (l *relayLive) flush(session string, upTo int) bool {
	deadline := time.Now().Add(relayFlushWithin)
	for {
		l.mu.Lock()
		done, reached := l.base >= upTo && l.durable[session] == "", l.reached
		l.mu.Unlock()
		switch {
		case done:
			return true
		case time.Now().After(deadline):
			return false
		case l.reporting.TryLock():
			l.reportWithin(time.Until(deadline))
			l.reporting.Unlock()
			l.mu.Lock()
			failed := l.reached.Equal(reached)
			l.mu.Unlock()
			if failed {
				return false
			}
		default:
			time.Sleep(10 * time.Millisecond) // another report is under way
		}
	}
}

func (l *relayLive) record(c *previewClaims, typ string, fields map[string]any) {
	ev := relayEvent{Token: c.raw, Type: typ}
	if v, ok := fields["duration_ms"].(int64); ok {
		ev.DurationMS = v
	}
	if v, ok := fields["reason"].(string); ok {
		ev.Reason = v
	}
	if v, ok := fields["exit_code"].(int); ok {
		ev.ExitCode = v
	}
	if typ == "exec" {
		argv, _ := fields["argv"].([]string)
		ev.Argv, ev.ArgvTruncated = boundArgv(argv, relayArgvBytes)
		ev.User, _ = fields["user"].(string)
		ev.Cwd, _ = fields["cwd"].(string)
		ev.Cwd = truncate(ev.Cwd, 4096)
		ev.EnvNames, _ = fields["env_names"].([]string)
		ev.TimedOut, _ = fields["timed_out"].(bool)
		ev.StdoutBytes, _ = fields["stdout_bytes"].(int64)
		ev.StderrBytes, _ = fields["stderr_bytes"].(int64)
	}
	switch typ {
	case "file_upload", "file_download":
		ev.Path, _ = fields["path"].(string)
		ev.Path = truncate(ev.Path, maxPathBytes)
		ev.Bytes, _ = fields["bytes"].(int64)
		ev.SHA256, _ = fields["sha256"].(string)
		ev.Kind, _ = fields["kind"].(string)
	case "action":
		ev.Action, _ = fields["action"].(string)
		ev.Action = truncate(ev.Action, 64)
	case "screenshot":
		ev.Artifact, _ = fields["artifact"].(string)
		ev.Bytes, _ = fields["size"].(int64)
		ev.SHA256, _ = fields["sha256"].(string)
	case "fill_credential", "fill_credential_denied", "fill_credential_failed", "fill_credential_raced":
		ev.Credential, _ = fields["credential"].(string)
		ev.Selector, _ = fields["selector"].(string)
		ev.Selector = truncate(ev.Selector, maxFillSelector)
		ev.Field, _ = fields["field"].(string)
		ev.Mode, _ = fields["mode"].(string)
		ev.Page, _ = fields["page"].(string)
		ev.PageAfter, _ = fields["page_after"].(string)
		ev.Reason = truncate(ev.Reason, 512)
	case "snapshot_saved":
		ev.Artifact, _ = fields["snapshot"].(string)
		ev.Bytes, _ = fields["size"].(int64)
		ev.SHA256, _ = fields["sha256"].(string)
		ev.Files, _ = fields["files"].(int64)
		ev.Changed, _ = fields["changed_while_read"].(bool)
		ev.DurationMS, _ = fields["took_ms"].(int64)
	}
	switch v := fields["limit"].(type) {
	case int:
		ev.Limit = int64(v)
	case int64:
		ev.Limit = v
	}
	l.event(ev)
}

// boundArgv is a command's argv within n bytes: the arguments that fit,
// then the one that does not, cut short at a character's start (none
// when nothing is left), and whether anything was cut.
func boundArgv(argv []string, n int) ([]string, bool) {
	out := make([]string, 0, len(argv))
	for _, a := range argv {
		if len(a) > n {
			cut := n
			for cut > 0 && !utf8.RuneStart(a[cut]) {
				cut--
			}
			if cut > 0 {
				out = append(out, a[:cut])
			}
			return out, true
		}
		out = append(out, a)
		n -= len(a)
	}
	return out, false
}

// changed reports what was kept so far, and asks the leader to store
// the session's trail, before the request is answered, as the leader's
// own changes are; a leader that does not answer within
// relayFlushWithin gets it with the next reports.
func (l *relayLive) changed(c *previewClaims) {
	l.mu.Lock()
	if len(l.durable) < maxRelayConns {
		l.durable[c.Session] = c.raw
	}
	upTo := l.base + len(l.events)
	l.mu.Unlock()
	if !l.flush(c.Session, upTo) {
		l.log.Warn("what a request changed is not with the leader yet; it goes with the next report", "session", c.Session)
	}
}

func (l *relayLive) touch(c *previewClaims) {
	l.mu.Lock()
	found := false
	for _, rc := range l.conns {
		if rc.token == c.raw {
			rc.active, found = true, true
		}
	}
	if !found && len(l.touched) < maxRelayConns {
		l.touched[c.raw] = true
	}
	l.mu.Unlock()
}

// spares: a relay keeps none; it would not see the session end.
func (l *relayLive) spares() bool { return false }

func (l *relayLive) left(c *previewClaims, browserGone bool) {
	if browserGone {
		l.event(relayEvent{Token: c.raw, Type: "browser_gone"})
	}
	l.event(relayEvent{Token: c.raw, Type: "client_left"})
}

// loop reports to the leader every relaySyncEvery, while there is
// anything to report.
func (l *relayLive) loop() {
	t := time.NewTicker(relaySyncEvery)
	defer t.Stop()
	for range t.C {
		l.sync()
		l.endRevoked()
	}
}

// endRevoked ends, while no leader answers, the connections this
// replica carries whose preview its copy of the stored revocations
// has (another replica revoked it alone): no leader's report answer
// ends them meanwhile.
func (l *relayLive) endRevoked() {
	if l.alone == nil || l.alone.Revoked == nil || l.silentSince.Load() == 0 {
		return
	}
	l.endConns(func(rc *relayConn) bool {
		revoked, err := l.alone.Revoked(rc.session, rc.preview)
		return rc.preview != shellPreview && err == nil && revoked
	})
}

// endConns ends, once each, the connections this replica carries that
// end says to (end is called under l.mu).
func (l *relayLive) endConns(end func(rc *relayConn) bool) {
	l.mu.Lock()
	var closers []io.Closer
	for _, rc := range l.conns {
		if !rc.ended && end(rc) {
			rc.ended = true
			closers = append(closers, rc.closer)
		}
	}
	l.mu.Unlock()
	for _, cl := range closers {
		go cl.Close() // a close may wait on a viewer's write
	}
}

// heldRevoked: this replica revoked session's preview while no leader
// answered, and it has yet to expire (revokeAlone).
func (l *relayLive) heldRevoked(session, preview string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heldRevokedLocked(session, preview, time.Now())
}

func (l *relayLive) heldRevokedLocked(session, preview string, now time.Time) bool {
	until, ok := l.revokedAlone[session+"\x00"+preview]
	return ok && now.Before(until)
}

// FlushReports reports what this relay keeps (its connections, their
// events, its egress proxy's), for at most d: a replica that stops
// sends its last events to the leader.
func (s *Server) FlushReports(d time.Duration) {
	l, ok := s.live.(*relayLive)
	if !ok {
		return
	}
	deadline := time.Now().Add(d)
	l.reporting.Lock()
	defer l.reporting.Unlock()
	for time.Now().Before(deadline) && l.reportWithin(time.Until(deadline)) {
	}
}

// sync reports until the events kept are sent (at most a few reports
// a tick: one holder's connections cannot crowd out the others').
func (l *relayLive) sync() {
	l.reporting.Lock() // one report at a time
	defer l.reporting.Unlock()
	for range 16 {
		if !l.report() {
			return
		}
	}
}

// report sends one report; it says whether there is anything left to
// send.
func (l *relayLive) report() bool { return l.reportWithin(relayReportWait) }

// relayReportWait bounds the wait for a report's answer.
const relayReportWait = 5 * time.Second

// reportWithin is report, waiting at most d for the answer.
func (l *relayLive) reportWithin(d time.Duration) bool {
	l.mu.Lock()
	for id, at := range l.admitted {
		if time.Since(at) > 5*time.Minute {
			delete(l.admitted, id)
			go l.forget(id)
		}
	}
	if len(l.conns) == 0 && len(l.events) == 0 && len(l.touched) == 0 && len(l.durable) == 0 {
		l.mu.Unlock()
		return false
	}
	// A report carries at most maxReportEvents, and relayReportBytes
	// of them (with the connections, it stays well under the gateway's
	// body limit); the rest go next.
	n, size := 0, 0
	for n < min(len(l.events), maxReportEvents) && (n == 0 || size+l.events[n].wire <= relayReportBytes) {
		size += l.events[n].wire
		n++
	}
	carried := l.events[:n]
	if n == len(l.events) {
		// What was dropped goes after what was kept (it came later).
		l.keepDropsLocked()
	}
	req := relaySyncRequest{Relay: l.identity, Run: l.run, First: l.base, Events: append([]relayEvent(nil), carried...)}
	for tok := range l.touched {
		req.Touched = append(req.Touched, tok)
	}
	clear(l.touched) // activity: one lost with a report is not worth keeping
	durable := map[string]string{}
	for id, tok := range l.durable {
		if len(durable) == maxReportDurable {
			break
		}
		durable[id] = tok
		req.Durable = append(req.Durable, tok)
	}
	base := l.base
	upTo := base + len(carried) // the events this report carries end there
	closers := map[string]io.Closer{}
	for id, rc := range l.conns {
		req.Conns = append(req.Conns, relayConnState{ID: id, Token: rc.token, Active: rc.active})
		rc.active = false
		closers[id] = rc.closer
	}
	dropped, egressDropped := l.dropped, l.egressDropped
	l.dropped, l.egressDropped = 0, 0
	l.mu.Unlock()
	// The whole report within relayReportMax: the activity goes first,
	// then half the events at a time (the connections must be named).
	for {
		raw, _ := json.Marshal(req)
		if len(raw) <= relayReportMax {
			break
		}
		switch {
		case req.Touched != nil:
			req.Touched = nil
		case len(req.Events) > 0:
			req.Events = req.Events[:len(req.Events)/2]
			upTo = base + len(req.Events)
		default:
			l.log.Warn("the connections this replica carries are too many to report; ending them", "conns", len(req.Conns))
			for _, c := range closers {
				go c.Close()
			}
			return false
		}
	}
	if dropped > 0 {
		l.log.Warn("events of relayed connections dropped while no leader answered", "dropped", dropped)
	}
	if egressDropped > 0 {
		l.log.Warn("egress events dropped: more were kept for the leader than this replica keeps", "dropped", egressDropped, "kept", maxEgressKept)
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(max(d, 0), relayReportWait))
	var ans relaySyncAnswer
	_, err := l.call(ctx, relaySyncPath, req, &ans)
	cancel()
	l.mu.Lock()
	if err != nil {
		// The activity goes with the next report; the connections end
		// once no leader has answered for relayGrace.
		for _, c := range req.Conns {
			if rc := l.conns[c.ID]; rc != nil && c.Active {
				rc.active = true
			}
		}
		late := time.Since(l.reached) > relayGrace
		l.mu.Unlock()
		if late {
			l.log.Warn("no leader answered for a while: ending the preview connections and shells this replica carries", "err", err)
			for _, c := range closers {
				go c.Close() // a close may wait on a viewer's write
			}
		}
		return false
	}
	l.reached = time.Now()
	for id, tok := range durable {
		if l.durable[id] == tok { // (not asked again meanwhile)
			delete(l.durable, id)
		}
	}
	// The events sent are taken; those added meanwhile stay.
	if cut := min(upTo-l.base, len(l.events)); cut > 0 {
		l.taken(l.events[:cut])
		l.events = append([]relayEvent(nil), l.events[cut:]...)
		l.base += cut
	}
	more := len(l.events) > 0 || len(l.durable) > 0
	l.mu.Unlock()
	for _, c := range ans.Close {
		if cl := closers[c.ID]; cl != nil {
			go cl.Close() // a close may wait on a viewer's write
		}
	}
	return more
}
