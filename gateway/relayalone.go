package gateway

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/profile"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/tenant"
	"github.com/sandgate/sandgate/vault"
)

// RelayAlone is what a replica that stands by admits the connections
// and requests it carries by while no leader answers: after a leader's
// death, until its lease runs out and another replica has taken over
// (15 s and the adoption), an agent's commands and its browser's new
// connections go on.
//
// What it admits is what the leader would have, as of the copies this
// replica keeps: the API key's tenant (the registry stored in MinIO,
// read again every few seconds, not used once out of date), a preview's
// revocation (the revocations stored in MinIO, the same way), and the
// session's Pod (its record, running and not being deleted, and its
// expiry), read from the API server. A shell's ticket it signs itself,
// with the gateway's keys, and the events it keeps until a leader
// answers its report, which records them as it does the
// leader-admitted ones'. It also answers session reads and lists,
// extends and deletes sessions, and issues and revokes previews, that
// no leader takes (orAlone), creates sessions (createAlone), the
// tenant's usage (usageAlone), credentials with its own vault
// (vaultAlone), fills (fillAlone) and profiles' creates and reads with
// its own profile store (profilesAlone).
type RelayAlone struct {
	// Tenant is the API key's tenant and its limits (the gateway's
	// defaults applied): tenant.ErrNotFound, tenant.ErrDisabled, or
	// another error when the copy cannot say (tenant.ErrStale).
	Tenant func(key string) (string, session.TenantLimits, error)
	// Session is the session's record and whether its sandbox runs
	// (session.ErrSandboxGone: there is none).
	Session func(ctx context.Context, id string) (map[string]string, bool, error)
	// Enabled says whether a tenant is enabled (nil), as Tenant's copy
	// has it; Revoked whether a session's preview is revoked. Both nil:
	// preview connections wait for a leader.
	Enabled func(tenant string) error
	Revoked func(session, preview string) (bool, error)
	// Refresh reads the copies again (within ctx); nil: they are not.
	// It is called as the replica begins to admit alone, before its
	// first admission: what the leader stored before it died is known
	// then, not a few seconds later.
	Refresh func(ctx context.Context)
	// Fresh is when the oldest of the copies was last read (when that
	// read began); nil: not checked.
	Fresh func() time.Time
	// List is each of a tenant's sessions' records, and whether its
	// sandbox runs, read as Session reads one; nil: session reads wait
	// for a leader. Isolation is what a runtime isolates with, which
	// the records do not say (nil: not said).
	List      func(ctx context.Context, tenant string) ([]AloneRecord, error)
	Isolation func(runtime string) string
	// Revoke stores a preview's revocation, until then, where every
	// replica reads it (nil: revocations wait for a leader).
	Revoke func(ctx context.Context, session, preview string, until time.Time) error
	// Update changes a session's record by what change makes of it
	// (the keys to set), in a write conditional on the version change
	// read, change asked again on a conflict; it returns the record
	// and whether the sandbox runs, as written (session.ErrSandboxGone:
	// there is none). nil: extensions and deletes wait for a leader.
	Update func(ctx context.Context, id string, change func(rec map[string]string, running bool) (map[string]string, error)) (map[string]string, bool, error)
	// Vault is the replica's own vault, opened when first needed (nil
	// and no error: no vault.key is configured, as the leader's has
	// none either); nil: credentials wait for a leader.
	Vault func(ctx context.Context) (*vault.Vault, error)
	// Profiles is the replica's own profile store, opened when first
	// needed (nil and no error: no vault.key is configured, so the
	// leader keeps none either); nil: profiles wait for a leader.
	Profiles func(ctx context.Context) (*profile.Store, error)
	// Runtimes is each runtime as the backend offers it now, strongest
	// first, and the default (as the leader says them, which probed at
	// its start); an error when the backend cannot say. nil: the list
	// waits for a leader.
	Runtimes func(ctx context.Context) ([]session.Runtime, string, error)
	// Pools is the warm pools as their Pods say them (session.PoolsOf);
	// nil: the list waits for a leader.
	Pools func(ctx context.Context) ([]session.PoolStats, error)
	// Tenants is the copy of the tenants (to read; tenant.ErrStale when
	// it cannot say), Limits a tenant's as Tenant gives them, and Every
	// List for every tenant: the admin API's reads (with List). Any
	// nil: the admin API waits for a leader.
	Tenants func() (tenant.Reader, error)
	Limits  func(tenant.Tenant) session.TenantLimits
	Every   func(ctx context.Context) ([]AloneRecord, error)
	// Create starts a session while no leader answers
	// (session.Alone.Create, with the runtimes the backend offers now,
	// extra given the session and its endpoint once it answers, within
	// the start's deadline, and extra's events stored with its first
	// ones) and returns it running; nil: creates wait for a leader.
	Create func(ctx context.Context, spec session.Spec, lim session.TenantLimits, extra func(context.Context, session.Info, session.Endpoint) ([]session.Event, error)) (session.Info, error)
}

// AloneRecord is a session's record, and whether its sandbox runs (not
// being deleted).
type AloneRecord = session.RecordSeen

// RecordAlone has the recordings of the sessions a relay creates while
// no leader answers placed with sh, as the leader places them (without
// it, a create that records waits for a leader). It may be called while
// the relay serves.
func (s *Server) RecordAlone(sh RecordingShare) {
	if l, ok := s.live.(*relayLive); ok {
		l.recordings.Store(&sh)
	}
}

// AdmitAlone makes a relay (NewRelay) admit by a while no leader
// answers; called before it serves.
func (s *Server) AdmitAlone(a RelayAlone) {
	if l, ok := s.live.(*relayLive); ok && a.Tenant != nil && a.Session != nil {
		l.alone = &a
	}
}

// admitAlone admits a request to session id with key as the leader
// would have (relayShell), by the replica's copies (RelayAlone).
func (l *relayLive) admitAlone(c *fiber.Ctx, id, key string) (*previewClaims, relayAdmitAnswer, error) {
	var none relayAdmitAnswer
	if err := l.admitsAlone(c.Context()); err != nil {
		return nil, none, err
	}
	name, lim, err := l.tenantAlone(key)
	switch {
	case err != nil:
		return nil, none, err
	case !ids.IsSession(id):
		return nil, none, errNotFound("no such session")
	}
	info, ep, err := l.sessionAlone(c.Context(), name, id)
	if err != nil {
		return nil, none, err
	}
	// The ticket lasts as the leader's does (relayShell).
	until := info.CreatedAt.Add(lim.MaxTTL)
	if info.ExpiresAt.After(until) {
		until = info.ExpiresAt
	}
	until = until.Add(time.Minute)
	claims := shellClaims(name, id, "")
	claims.ExpiresAt = jwtTime(until)
	ticket, err := l.signer.issue(*claims)
	if err != nil {
		return nil, none, relayUnavailableFor(err)
	}
	ans := relayAdmitAnswer{Session: id, Tenant: name, Scope: scopeShell, Preview: claims.ID, Expires: until.Unix(), Ticket: ticket,
		AllowRoot: lim.AllowRoot, MaxFileBytes: max(lim.MaxFileBytes, 0), MaxArtifactBytes: max(lim.MaxArtifactBytes, 0),
		Quota: true, CDP: ep.CDP.String(), VNC: ep.VNC.String(), Screen: info.Screen, Kind: info.Kind}
	l.mu.Lock()
	l.admitted[id] = time.Now()
	l.mu.Unlock()
	claims = shellClaims(name, id, ticket)
	claims.allowRoot, claims.maxFileBytes = ans.AllowRoot, ans.MaxFileBytes
	claims.maxArtifactBytes, claims.quotaSaid = ans.MaxArtifactBytes, true
	return claims, ans, nil
}

// admitsAlone begins, once a silence, to admit alone: it says so in
// the log and reads the copies again (the admissions meanwhile wait).
// It refuses (503) while the copies have not been read since the
// silence began (what the leader stored before it died must be known),
// and when a leader answered meanwhile (asked again, it will admit).
func (l *relayLive) admitsAlone(ctx context.Context) error {
	unavailable := func(why string) error { return relayUnavailableFor(errors.New(why)) }
	since := l.silentSince.Load()
	if since == 0 {
		return unavailable("a leader answered meanwhile")
	}
	l.aloneMu.Lock()
	if l.aloneFor.Load() != since {
		l.log.Warn("no leader answers: this replica admits the connections and requests it carries by its copies of the tenants and revocations and the sessions' Pods until one does")
		if l.alone.Refresh != nil {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			l.alone.Refresh(rctx)
			cancel()
		}
		l.aloneFor.Store(since)
	}
	l.aloneMu.Unlock()
	if l.alone.Fresh != nil && l.alone.Fresh().Before(time.Unix(0, since)) {
		return unavailable("the copies of the tenants and revocations were not read since no leader answers")
	}
	return nil
}

// sessionAlone is session id of tenant as its Pod has it: 404 when it
// has none (or the Pod is another tenant's, or no session's), 409 when
// the Pod does not run or the session expired, 503 when the API server
// cannot say (or the session is starting).
func (l *relayLive) sessionAlone(ctx context.Context, tenantName, id string) (session.Info, session.Endpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rec, running, err := l.alone.Session(ctx, id)
	return l.sessionOf(rec, running, err, tenantName, id)
}

// sessionOf is sessionAlone of a Pod already read (RelayAlone.Session's
// answer).
func (l *relayLive) sessionOf(rec map[string]string, running bool, err error, tenantName, id string) (session.Info, session.Endpoint, error) {
	if errors.Is(err, session.ErrSandboxGone) {
		return session.Info{}, session.Endpoint{}, errNotFound("no such session")
	}
	if err != nil {
		return session.Info{}, session.Endpoint{}, relayUnavailableFor(err)
	}
	info, err := l.recordOf(rec, tenantName, id)
	switch {
	case err != nil:
		return session.Info{}, session.Endpoint{}, err
	case info.State == session.StateStarting:
		// Not ready yet (its recording not begun), or ready a moment
		// ago and not marked so yet: not yet, as far as this replica
		// can tell.
		return session.Info{}, session.Endpoint{}, &apiError{status: 503, code: "unavailable", msg: "the session is starting; retry"}
	case info.State != session.StateRunning:
		// Stopping: its stop began (a profile may be being saved), as
		// the leader refuses it.
		return session.Info{}, session.Endpoint{}, &apiError{status: 409, code: "conflict", msg: "the session is " + string(info.State)}
	case !running || !time.Now().Before(info.ExpiresAt):
		return session.Info{}, session.Endpoint{}, &apiError{status: 409, code: "conflict", msg: "the session is not running"}
	}
	_, ep, err := session.FromRecord(rec)
	if err != nil {
		l.log.Warn("a running session Pod's record has no address", "session", id, "err", err)
		return session.Info{}, session.Endpoint{}, errNotFound("no such session")
	}
	return info, ep, nil
}

// recordOf is the session a Pod's record holds when it is session id
// of tenantName's; else 404.
func (l *relayLive) recordOf(rec map[string]string, tenantName, id string) (session.Info, error) {
	info, err := session.InfoFromRecord(rec)
	switch {
	case err != nil:
		var pe *session.PublicError
		if !errors.As(err, &pe) {
			l.log.Warn("a session Pod's record cannot be read", "session", id, "err", err)
		}
		return session.Info{}, errNotFound("no such session")
	case info.Tenant != tenantName:
		return session.Info{}, errNotFound("no such session")
	case info.ID != id:
		l.log.Warn("a session Pod's record names another session", "session", id, "record", info.ID)
		return session.Info{}, errNotFound("no such session")
	}
	return info, nil
}

// extendAlone answers POST /v1/sessions/:id/extend as the leader would
// (extendSession), by the session's Pod: the expiry in its record is
// moved by a write conditional on the Pod's version (RelayAlone.Update),
// so that a stop stored first (a delete through another replica) is
// never undone, and what is checked (the session the tenant's and
// running, the new expiry within the tenant's maximum TTL) holds as it
// is written. The next leader takes the expiry from the record as it
// adopts the session.
func (s *Server) extendAlone(c *fiber.Ctx, tenantName string) error {
	l := s.live.(*relayLive)
	id, ttl, err := s.extendAsked(c)
	if err != nil {
		return err
	}
	lim, _ := c.Locals(localAloneLimits).(session.TenantLimits)
	rec, running, err := l.updateAlone(c, id, func(rec map[string]string, running bool) (map[string]string, error) {
		info, _, err := l.sessionOf(rec, running, nil, tenantName, id)
		if err != nil {
			return nil, err
		}
		exp, err := session.ExtendedExpiry(info.CreatedAt, lim.MaxTTL, ttl, time.Now())
		if err != nil {
			return nil, err
		}
		return map[string]string{session.RecordExpires: exp.Format(time.RFC3339Nano)}, nil
	})
	if err != nil {
		return err
	}
	info, _ := l.viewAlone(rec, running, tenantName)
	return c.JSON(info)
}

// deleteAlone answers DELETE /v1/sessions/:id as the leader would
// (deleteSession), by the session's Pod: its record is marked stopping,
// with the time asked (session.RecordStopAsked), by a write conditional
// on the Pod's version (RelayAlone.Update). From then on no replica
// admits the session, this one's connections to it end, and the next
// leader, as it adopts the session, records the request and finishes
// the stop (its artifacts and profile kept as at any stop). The answer
// is the session stopping, as the leader's is when the stop outlasts
// the request. A session stopping already is answered so again; one
// starting waits for a leader (503).
func (s *Server) deleteAlone(c *fiber.Ctx, tenantName string) error {
	l := s.live.(*relayLive)
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	rec, running, err := l.updateAlone(c, id, func(rec map[string]string, _ bool) (map[string]string, error) {
		info, err := l.recordOf(rec, tenantName, id)
		switch {
		case err != nil:
			return nil, err
		case info.State == session.StateStarting:
			return nil, &apiError{status: 503, code: "unavailable", msg: "the session is starting; retry"}
		case info.State == session.StateStopping:
			return nil, nil
		}
		return map[string]string{session.RecordState: string(session.StateStopping),
			session.RecordStopAsked: time.Now().UTC().Format(time.RFC3339Nano)}, nil
	})
	if err != nil {
		return err
	}
	l.endConns(func(rc *relayConn) bool { return rc.session == id })
	info, _ := l.viewAlone(rec, running, tenantName)
	return c.JSON(info)
}

// updateAlone is RelayAlone.Update of session id's record, within 5 s
// (as a read alone: each holds one of the turns every tenant's share),
// its errors the answer's: change's own as they are, no Pod 404, and
// the API server's 503.
func (l *relayLive) updateAlone(c *fiber.Ctx, id string, change func(rec map[string]string, running bool) (map[string]string, error)) (map[string]string, bool, error) {
	if l.alone.Update == nil {
		return nil, false, relayUnavailableFor(errors.New("this replica changes no session's record"))
	}
	ctx, cancel := context.WithTimeout(c.Context(), 5*time.Second)
	defer cancel()
	var refused error
	rec, running, err := l.alone.Update(ctx, id, func(rec map[string]string, running bool) (map[string]string, error) {
		set, err := change(rec, running)
		refused = err
		return set, err
	})
	switch {
	case err == nil:
		return rec, running, nil
	case refused != nil && errors.Is(err, refused):
		return nil, false, err
	case errors.Is(err, session.ErrSandboxGone):
		return nil, false, errNotFound("no such session")
	}
	return nil, false, relayUnavailableFor(err)
}

// previewAlone admits a preview's connection (its token) as the leader
// would have (managerLive.admit), by the replica's copies: the token
// read with the gateway's keys, not revoked, its tenant enabled, its
// session's Pod running. Every refusal is the leader's 401; a copy that
// cannot say, a 503.
func (l *relayLive) previewAlone(ctx context.Context, token string) (*previewClaims, session.Endpoint, session.Info, error) {
	bad := errUnauthenticated("the preview token is missing, invalid or expired")
	c, err := l.tokenAlone(ctx, token)
	if err != nil {
		return nil, session.Endpoint{}, session.Info{}, err
	}
	if c.Scope == scopeShell {
		return nil, session.Endpoint{}, session.Info{}, bad
	}
	info, ep, err := l.sessionAlone(ctx, c.Tenant, c.Session)
	var ae *apiError
	if errors.As(err, &ae) && ae.status == 503 {
		return nil, session.Endpoint{}, session.Info{}, err
	}
	if err != nil {
		return nil, session.Endpoint{}, session.Info{}, bad
	}
	l.mu.Lock()
	l.admitted[c.Session] = time.Now()
	l.mu.Unlock()
	view := session.Info{ID: c.Session, Tenant: c.Tenant, Kind: info.Kind, Screen: info.Screen}
	if l.alone.Isolation != nil {
		view.Isolation = l.alone.Isolation(info.Runtime)
	}
	return c, ep, view, nil
}

// tokenAlone is a preview token's claims, read by the replica's copies
// as the leader would (managerLive.admit, reviewAuth): read with the
// gateway's keys, not revoked, its tenant enabled. Every refusal is the
// leader's 401; a copy that cannot say, a 503.
func (l *relayLive) tokenAlone(ctx context.Context, token string) (*previewClaims, error) {
	bad := errUnauthenticated("the preview token is missing, invalid or expired")
	unavailable := func(cause error) error {
		return &apiError{status: 503, code: "unavailable", msg: "the gateway cannot check the preview now; retry", err: cause}
	}
	// (A token signed with a key this replica lacks is refused too:
	// every replica has the gateway's keys, and no leader answers to
	// read it.)
	c, err := l.signer.verify(token, time.Now())
	if err != nil {
		return nil, bad
	}
	if err := l.admitsAlone(ctx); err != nil {
		return nil, err
	}
	revoked, err := l.alone.Revoked(c.Session, c.ID)
	if err != nil {
		return nil, unavailable(err)
	}
	if revoked || l.heldRevoked(c.Session, c.ID) {
		return nil, bad
	}
	switch err := l.alone.Enabled(c.Tenant); {
	case errors.Is(err, tenant.ErrDisabled), errors.Is(err, tenant.ErrNotFound):
		return nil, bad
	case err != nil:
		return nil, unavailable(err)
	}
	return c, nil
}

// orAlone answers a request the Front could not pass to a leader
// (answersAlone: a session read, a preview's issue, a trail's or an
// artifact's read) that an API key makes: passOrAlone, the key checked
// by the copy of the tenants, and answered by answer, from the
// sessions' Pods and the store.
func (l *relayLive) orAlone(answer func(c *fiber.Ctx, tenant string) error) fiber.Handler {
	return l.orAloneIn(l.aloneAnswers, answer)
}

// orAloneIn is orAlone, taking one of slots.
func (l *relayLive) orAloneIn(slots chan struct{}, answer func(c *fiber.Ctx, tenant string) error) fiber.Handler {
	return func(c *fiber.Ctx) error {
		key, err := boundedKey(c)
		if err != nil {
			return err
		}
		return l.passOrAlone(c, slots, l.alone != nil && l.alone.List != nil, func() error {
			return l.answerAlone(c, key, answer)
		})
	}
}

// boundedKey is the request's API key, refused (401) when there is none
// or it cannot be one.
func boundedKey(c *fiber.Ctx) (string, error) {
	key, err := bearerKey(c)
	if err == nil && len(key) > 4096 {
		err = errUnauthenticated("the API key is not valid")
	}
	return key, err
}

// answerAlone answers a request alone by answer, for the tenant the
// copy of the tenants gives key (its limits in localAloneLimits).
func (l *relayLive) answerAlone(c *fiber.Ctx, key string, answer func(c *fiber.Ctx, tenant string) error) error {
	name, lim, err := l.tenantAlone(key)
	if err != nil {
		return err
	}
	c.Locals(localAloneLimits, lim)
	return answer(c, name)
}

// tenantAlone is key's tenant and its limits by the copy of the
// tenants, refused as the leader refuses it: a disabled tenant 403, a
// key that is none 401; a copy that cannot say, 503 to retry.
func (l *relayLive) tenantAlone(key string) (string, session.TenantLimits, error) {
	name, lim, err := l.alone.Tenant(key)
	switch {
	case errors.Is(err, tenant.ErrDisabled):
		return "", lim, errDenied("the tenant is disabled")
	case errors.Is(err, tenant.ErrNotFound):
		return "", lim, errUnauthenticated("the API key is not valid")
	case err != nil:
		return "", lim, relayUnavailableFor(err)
	}
	return name, lim, nil
}

// fillOrAlone passes a fill_credential on to the leader whole, as a
// relay always has (the vault was the leader's alone), taking no turn
// of the relay's; when no leader takes it (passOrAlone's rules), it is
// filled here (fillAlone) in one of the fills' turns (fillAnswers).
func (s *Server) fillOrAlone(c *fiber.Ctx) error {
	l := s.live.(*relayLive)
	key, err := boundedKey(c)
	if err != nil {
		return err
	}
	// (A fill a leader took and did not answer may have typed: its
	// 503 does not say to retry, as a POST's.)
	if passed, err := l.tryLeader(c, 90*time.Second, true); passed {
		return err
	}
	release, err := l.slot(l.fillAnswers)
	if err != nil {
		return retrySoon(c, err)
	}
	defer release()
	if err := l.admitsAlone(c.Context()); err != nil {
		return retrySoon(c, err)
	}
	return retrySoon(c, l.answerAlone(c, key, s.fillAlone))
}

// vaultAlone answers a credential request no leader takes, as the
// leader would (withVault), with the replica's own vault: a
// credential is one sealed object in the vault's bucket, which any
// replica reads and writes alike. The credentials take turns of their
// own (vaultAnswers); the vault's part, its opening included, takes 5
// s at most. A 503 says to retry where the leader's would (a vault
// that could not be opened, a read); a store or delete that failed
// may have been done, and no vault.key is no passing state: as on the
// leader, those do not.
func (l *relayLive) vaultAlone(answer func(c *fiber.Ctx, v *vault.Vault, tenant string) error) fiber.Handler {
	return l.orAloneIn(l.vaultAnswers, func(c *fiber.Ctx, tenantName string) error {
		if l.alone.Vault == nil {
			return relayUnavailableFor(errors.New("this replica opens no vault"))
		}
		if cid := c.Params("cid"); cid != "" && !ids.IsCredential(cid) {
			return errNotFound("no such credential") // (as the vault says, unasked)
		}
		ctx, cancel := context.WithTimeout(c.UserContext(), 5*time.Second)
		defer cancel()
		v, err := ownAlone(ctx, l.alone.Vault, vaultError, errNoVault)
		if err != nil {
			return err
		}
		c.SetUserContext(ctx)
		err = answer(c, v, tenantName)
		if c.Method() != fiber.MethodGet {
			return asLeader(err)
		}
		return err
	})
}

// mcpAlone checks the key of an MCP request the Front could not pass
// to a leader by the copy of the tenants, as the leader's authenticate
// checks it (401, 403; 503 to retry while the copy cannot say, or has
// not been read since no leader answers), then takes one of the MCP
// requests' turns (mcpAnswers, at most maxMCPAnswersPerTenant of them a
// tenant's). It does not pass the request on itself: the MCP server's
// tools call the API through this replica's own listener, which passes
// each call to a leader that answers by then, or answers it here
// (answersAlone) or with a 503 (a create), as it would any client's.
func (l *relayLive) mcpAlone(c *fiber.Ctx) error {
	key, err := boundedKey(c)
	if err != nil {
		return err
	}
	if l.alone == nil || l.alone.Tenant == nil {
		return retrySoon(c, relayUnavailableFor(errors.New("this replica has no copy of the tenants")))
	}
	// A key the copy refuses is refused before anything else: it marks
	// no silence.
	if _, _, err := l.tenantAlone(key); err != nil {
		return retrySoon(c, err)
	}
	// The Front hands /mcp here only when the leader did not take its
	// connection: this replica's silence too, so that the copies are
	// read again as it begins (admitsAlone), and the key checked again
	// by them.
	l.silent()
	if err := l.admitsAlone(c.Context()); err != nil {
		return retrySoon(c, err)
	}
	name, _, err := l.tenantAlone(key)
	if err != nil {
		return retrySoon(c, err)
	}
	release, err := l.mcpSlot(name)
	if err != nil {
		return retrySoon(c, err)
	}
	defer release()
	c.Locals(localTenant, name)
	return c.Next()
}

// mcpSlot takes one of the MCP requests' turns for tenantName: a tenant
// whose tool calls hold maxMCPAnswersPerTenant of them (a long command
// each, say) leaves the rest to the others.
func (l *relayLive) mcpSlot(tenantName string) (release func(), err error) {
	drop, err := l.tenantTurn(l.mcpBy, tenantName, maxMCPAnswersPerTenant, "the tenant's MCP requests keep this gateway replica busy; retry")
	if err != nil {
		return nil, err
	}
	free, err := l.slot(l.mcpAnswers)
	if err != nil {
		drop()
		return nil, err
	}
	return func() { free(); drop() }, nil
}

// tenantTurn counts one of tenantName's turns in by (under mu), at most
// max of them at once (past that, 503 with busy); release gives it back.
func (l *relayLive) tenantTurn(by map[string]int, tenantName string, max int, busy string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if by[tenantName] >= max {
		return nil, &apiError{status: 503, code: "unavailable", msg: busy}
	}
	by[tenantName]++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if by[tenantName]--; by[tenantName] <= 0 {
			delete(by, tenantName)
		}
	}, nil
}

// usageAlone answers GET /v1/usage no leader takes, as the leader
// would (usage), from the tenant's Pods' records and the store: the
// sessions that hold their share (every Pod's: starting, running or
// stopping, as the leader counts them), the creates of the last minute
// as the records of the Pods still there date them (a create the
// leader admitted that made no session, or whose session has ended
// since, is not among them), no queue (no create waits while no
// leader answers), and the limits as the copy of the tenants has them.
// The Pods are listed within 5 s; the store's count, as the leader's,
// has its own bound (artifactBytes).
func (s *Server) usageAlone(c *fiber.Ctx, tenantName string) error {
	l := s.live.(*relayLive)
	ctx, cancel := context.WithTimeout(c.Context(), 5*time.Second)
	infos, err := l.sessionsAlone(ctx, tenantName)
	cancel()
	if err != nil {
		return err
	}
	var u session.Usage
	cut := time.Now().Add(-time.Minute)
	for _, info := range infos {
		holdAlone(&u, info, cut)
	}
	lim, _ := c.Locals(localAloneLimits).(session.TenantLimits)
	u.SetLimits(lim)
	s.storedBytes(c, tenantName, &u)
	return c.JSON(u)
}

// holdAlone counts a session in its tenant's usage answered alone:
// every record is a session's that starts, runs or stops, each holding
// its share until its Pod is gone; one made after cut is a create of
// the last minute.
func holdAlone(u *session.Usage, info session.Info, cut time.Time) {
	u.Hold(info.Resources, info.Record)
	if info.CreatedAt.After(cut) {
		u.CreatesLastMinute++
	}
}

// runtimesAlone answers GET /v1/runtimes as the leader would
// (listRuntimes), from what the backend offers now.
func (s *Server) runtimesAlone(c *fiber.Ctx, _ string) error {
	l := s.live.(*relayLive)
	return backendAlone(c, "runtimes", l.alone.Runtimes != nil, func(ctx context.Context) (fiber.Map, error) {
		runtimes, def, err := l.alone.Runtimes(ctx)
		return fiber.Map{"default": def, "runtimes": runtimes}, err
	})
}

// poolsAlone answers GET /v1/pools as the leader would (listPools),
// from the pools' Pods: what only the leader that refills them counts
// (claims, refills) reads 0, as it does on a leader that has just
// taken over.
func (s *Server) poolsAlone(c *fiber.Ctx, _ string) error {
	l := s.live.(*relayLive)
	return backendAlone(c, "pools", l.alone.Pools != nil, func(ctx context.Context) (fiber.Map, error) {
		pools, err := l.alone.Pools(ctx)
		return fiber.Map{"pools": pools}, err
	})
}

// backendAlone answers with what read asks the backend, within 10 s: a
// 503 to retry when it cannot say, or when this replica does not ask
// it (!can).
func backendAlone(c *fiber.Ctx, what string, can bool, read func(ctx context.Context) (fiber.Map, error)) error {
	if !can {
		return relayUnavailableFor(errors.New("this replica does not list the " + what))
	}
	ctx, cancel := context.WithTimeout(c.Context(), 10*time.Second)
	defer cancel()
	answer, err := read(ctx)
	if err != nil {
		return relayUnavailableFor(err)
	}
	return c.JSON(answer)
}

// adminAlone answers a read of the admin API (its key checked before,
// authenticateAdmin) that no leader takes, as the leader would, from
// the copy of the tenants; with usage, each tenant's usage from its
// session Pods (usageAlone's, but the stored bytes, which the leader's
// admin API does not count either): one tenant's Pods for a tenant,
// every tenant's for the list.
func (l *relayLive) adminAlone(usage bool, answer func(c *fiber.Ctx, in tenantsIn) error) fiber.Handler {
	return func(c *fiber.Ctx) error {
		canAlone := l.alone != nil && l.alone.Tenants != nil && l.alone.Limits != nil && l.alone.List != nil && l.alone.Every != nil
		return l.passOrAlone(c, l.aloneAnswers, canAlone, func() error {
			reg, err := l.alone.Tenants()
			if err != nil {
				return relayUnavailableFor(err)
			}
			in := tenantsIn{reg: reg, usage: func(string) session.Usage { return session.Usage{} }}
			if usage {
				// One tenant's Pods for one tenant (none asked for a
				// tenant that is none: the leader's 404), every
				// tenant's for the list.
				name := c.Params("name")
				if _, err := reg.Get(name); name != "" && err != nil {
					return tenantErr(err)
				}
				ctx, cancel := context.WithTimeout(c.Context(), 5*time.Second)
				var recs []AloneRecord
				if name != "" {
					recs, err = l.alone.List(ctx, name)
				} else {
					recs, err = l.alone.Every(ctx)
				}
				cancel()
				if err != nil {
					return relayUnavailableFor(err)
				}
				held := map[string]*session.Usage{}
				cut := time.Now().Add(-time.Minute)
				for _, r := range recs {
					info, ok := l.viewAlone(r.Record, r.Running, r.Record[session.RecordTenant])
					if !ok {
						continue
					}
					if held[info.Tenant] == nil {
						held[info.Tenant] = &session.Usage{}
					}
					holdAlone(held[info.Tenant], info, cut)
				}
				in.usage = func(name string) session.Usage {
					var u session.Usage
					if h := held[name]; h != nil {
						u = *h
					}
					if t, err := reg.Get(name); err == nil {
						u.SetLimits(l.alone.Limits(t))
					}
					return u
				}
			}
			return answer(c, in)
		})
	}
}

// ownAlone opens what a replica answers alone with of its own (its
// vault, its profile store) within ctx: failed says why it did not
// open; nil and no error is none configured, none then the leader's
// refusal (not to retry: the leader has none either).
func ownAlone[T any](ctx context.Context, open func(context.Context) (*T, error), failed func(error) error, none func() error) (*T, error) {
	v, err := open(ctx)
	switch {
	case err != nil:
		return nil, failed(err)
	case v == nil:
		return nil, asLeader(none())
	}
	return v, nil
}

// profilesAlone answers a profile's create, list, read, delete or
// rollback no leader takes, as the leader would, from the replica's
// own profile store, in turns of their own (profileAnswers), each
// within profileAlone, its opening included. A profile is in use (read
// so, not deleted or rolled back: 409) while one of the tenant's Pods
// names it in its record: its session holds it until its end, when the
// profile is saved and the Pod deleted (a create, whose profile no
// session holds, lists none). That is narrower than the leader's test,
// whose hold comes with a create's admission, before its Pod: a create
// a leader that takes over admits while this replica still answers
// alone may find its profile deleted (it fails) or rolled back (its
// save may overwrite that). Nothing deleted comes back: the store
// writes every change of a profile's metadata conditional on what it
// read (profile.ErrChanged).
func (s *Server) profilesAlone(answer func(c *fiber.Ctx, in profilesIn) error) fiber.Handler {
	l := s.live.(*relayLive)
	return l.orAloneIn(l.profileAnswers, func(c *fiber.Ctx, tenantName string) error {
		if l.alone.Profiles == nil {
			return relayUnavailableFor(errors.New("this replica opens no profile store"))
		}
		if pid := c.Params("pid"); pid != "" && !profile.IsID(pid) {
			return errNotFound("no such profile") // (as the store says, unasked)
		}
		if c.Method() == fiber.MethodPost && c.Params("pid") != "" {
			// A rollback's body is checked before the Pods are listed:
			// a bad one is the leader's 400, whether they list or not.
			if _, err := rollbackVersion(c); err != nil {
				return err
			}
		}
		ctx, cancel := context.WithTimeout(c.UserContext(), profileAlone)
		defer cancel()
		store, err := ownAlone(ctx, l.alone.Profiles, relayUnavailableFor, errNoProfiles)
		if err != nil {
			return err
		}
		held := map[string]bool{}
		if c.Method() == fiber.MethodGet || c.Params("pid") != "" {
			infos, err := l.sessionsAlone(ctx, tenantName)
			if err != nil {
				return err
			}
			for _, info := range infos {
				if info.Profile != nil {
					held[info.Profile.ID] = true
				}
			}
		}
		c.SetUserContext(ctx)
		err = answer(c, profilesIn{store: store, tenant: tenantName, inUse: func(id string) bool { return held[id] }})
		if c.Method() != fiber.MethodGet {
			return asLeader(err)
		}
		return err
	})
}

// fillAlone answers a fill_credential no leader takes, as the leader
// would (fillCredential), with the replica's own vault: the session's
// bindings are its Pod's record's, its browser the Pod's, and the
// fill's events are kept for the next leader, as the replica's others
// (its trail records them as its own fills'). The placeholder typed is
// the one every replica derives from the vault's key.
func (s *Server) fillAlone(c *fiber.Ctx, tenantName string) error {
	l := s.live.(*relayLive)
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	req, err := fillAsked(c)
	if err != nil {
		return err
	}
	if l.alone.Vault == nil {
		return relayUnavailableFor(errors.New("this replica opens no vault"))
	}
	info, ep, err := l.sessionAlone(c.Context(), tenantName, id)
	if err != nil {
		return err
	}
	if info.Kind != session.KindBrowser {
		return errNeedsBrowser()
	}
	vctx, cancel := context.WithTimeout(c.Context(), 5*time.Second)
	v, err := ownAlone(vctx, l.alone.Vault, vaultError, errNoVault)
	cancel()
	if err != nil {
		return err
	}
	claims, err := l.eventTicket(tenantName, id, time.Now())
	if err != nil {
		return relayUnavailableFor(err)
	}
	l.mu.Lock()
	l.admitted[id] = time.Now()
	l.mu.Unlock()
	// (The events go with the reports: no leader answers them now.)
	err = s.fill(c, req, fillTarget{vault: v, tenant: tenantName, info: info, ep: ep,
		record: func(typ string, fields map[string]any) { l.record(claims, typ, fields) }})
	return asLeader(err)
}

// eventTicket is the token of events a replica keeps alone for the
// next leader of session id of tenantName's: a ticket of the
// session's, as a shell's (the leader reads the session from it), for
// the time a report may take to reach a leader from now (its claims,
// the ticket in raw).
func (l *relayLive) eventTicket(tenantName, id string, now time.Time) (*previewClaims, error) {
	claims := shellClaims(tenantName, id, "")
	claims.ExpiresAt = jwtTime(now.Add(10 * time.Minute))
	ticket, err := l.signer.issue(*claims)
	claims.raw = ticket
	return claims, err
}

// leaderWord is an answer given alone as the leader gives it: a 503
// of its own does not say to retry (retrySoon leaves it).
type leaderWord struct{ error }

func (w leaderWord) Unwrap() error { return w.error }

func asLeader(err error) error {
	if err == nil {
		return nil
	}
	return leaderWord{err}
}

// localAloneLimits holds the tenant's limits (session.TenantLimits) of
// a request answered alone (orAlone), as the copy of the tenants has
// them.
const localAloneLimits = "relay-alone-limits"

// passOrAlone passes a request the Front could not pass to a leader on
// to the leader itself, if one answers now; else, as an admission made
// alone (askOrAlone), when canAlone, it is answered by alone. Either
// takes one of slots meanwhile.
func (l *relayLive) passOrAlone(c *fiber.Ctx, slots chan struct{}, canAlone bool, alone func() error) error {
	return l.passOrAloneWithin(c, slots, 5*time.Second, canAlone, alone)
}

// passOrAloneWithin is passOrAlone, the leader given d to answer.
func (l *relayLive) passOrAloneWithin(c *fiber.Ctx, slots chan struct{}, d time.Duration, canAlone bool, alone func() error) error {
	release, err := l.slot(slots)
	if err != nil {
		return retrySoon(c, err)
	}
	defer release()
	if passed, err := l.tryLeader(c, d, canAlone); passed {
		return err
	}
	if err := l.admitsAlone(c.Context()); err != nil {
		return retrySoon(c, err)
	}
	return retrySoon(c, alone())
}

// tryLeader passes the request on to the leader, within d, when one is
// to be asked now (asks), or always when it cannot be answered alone
// (!canAlone). passed says the answer is the leader's, or its
// silence's: a leader that took it and did not answer lives, so its
// word stands, not this replica's (a preview, a credential or a fill
// it may have made: a POST's 503 does not say to retry; a delete may
// be made again). Else (none answers) it is for this replica to answer.
func (l *relayLive) tryLeader(c *fiber.Ctx, d time.Duration, canAlone bool) (passed bool, err error) {
	ask, done := l.asks()
	if !ask && canAlone {
		return false, nil
	}
	p, err := l.passOn(c, d)
	done()
	switch {
	case p == answered:
		l.answered()
		return true, err
	case p == unanswered || !canAlone:
		if c.Method() == fiber.MethodPost {
			return true, err
		}
		return true, retrySoon(c, err)
	}
	l.silent()
	// (Its 503's Retry-After is not this answer's.)
	c.Response().Header.Del(fiber.HeaderRetryAfter)
	return false, nil
}

// getAlone answers GET /v1/sessions/:id from the session's Pod, as the
// leader would (getSession).
func (l *relayLive) getAlone(c *fiber.Ctx, tenantName string) error {
	id := c.Params("id")
	if !ids.IsSession(id) {
		return errNotFound("no such session")
	}
	ctx, cancel := context.WithTimeout(c.Context(), 5*time.Second)
	defer cancel()
	info, found, err := l.podOf(ctx, tenantName, id)
	if err != nil {
		return err
	}
	if !found {
		return errNotFound("no such session")
	}
	return c.JSON(info)
}

// listAlone answers GET /v1/sessions from the tenant's Pods, as the
// leader would (listSessions), newest first. The sessions the leader
// held after their end (stopped, failed) have no Pod left: not listed.
func (l *relayLive) listAlone(c *fiber.Ctx, tenantName string) error {
	ctx, cancel := context.WithTimeout(c.Context(), 5*time.Second)
	defer cancel()
	out, err := l.sessionsAlone(ctx, tenantName)
	if err != nil {
		return err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return c.JSON(fiber.Map{"sessions": out})
}

// sessionsAlone is the tenant's sessions as their Pods' records hold
// them (viewAlone), listed within ctx; a 503 to retry when they cannot
// be listed.
func (l *relayLive) sessionsAlone(ctx context.Context, tenantName string) ([]session.Info, error) {
	recs, err := l.alone.List(ctx, tenantName)
	if err != nil {
		return nil, relayUnavailableFor(err)
	}
	out := []session.Info{}
	for _, r := range recs {
		if info, ok := l.viewAlone(r.Record, r.Running, tenantName); ok {
			out = append(out, info)
		}
	}
	return out, nil
}

// viewAlone is the session a Pod's record holds, as the leader shows
// it, when it is tenantName's. One the record says runs whose Pod
// does not (or whose expiry passed) reads stopping: its end is under
// way, or due at the next leader's adoption.
func (l *relayLive) viewAlone(rec map[string]string, running bool, tenantName string) (session.Info, bool) {
	info, err := session.InfoFromRecord(rec)
	if err != nil {
		var pe *session.PublicError
		if !errors.As(err, &pe) {
			l.log.Warn("a session Pod's record cannot be read", "err", err)
		}
		return session.Info{}, false
	}
	if info.Tenant != tenantName {
		return session.Info{}, false
	}
	if l.alone.Isolation != nil {
		info.Isolation = l.alone.Isolation(info.Runtime)
	}
	if info.State == session.StateRunning && (!running || !time.Now().Before(info.ExpiresAt)) {
		info.State = session.StateStopping
	}
	return info, true
}

// issueAlone answers POST /v1/sessions/:id/previews as the leader would
// (createPreview), by the session's Pod (sessionAlone): the preview is
// signed with the gateway's keys, and its issue (preview_issued) kept
// for the next leader's trail, as the relay's other events are. A
// review link's: issueReviewAlone.
func (s *Server) issueAlone(c *fiber.Ctx, tenantName string) error {
	l := s.live.(*relayLive)
	id, req, ttl, err := s.previewAsked(c)
	if err != nil {
		return err
	}
	if req.Scope == ScopeReview {
		return s.issueReviewAlone(c, tenantName, id, req, ttl)
	}
	if _, _, err := l.sessionAlone(c.Context(), tenantName, id); err != nil {
		return err
	}
	if err := l.madeAlone(tenantName, "issue", true); err != nil {
		return err
	}
	out, tok, _, err := s.signPreview(tenantName, id, req, ttl)
	if err != nil {
		return relayUnavailableFor(err)
	}
	l.event(relayEvent{Token: tok, Type: "preview_issued"})
	return c.Status(fiber.StatusCreated).JSON(out)
}

// heldOrEnded says whether session id is tenantName's and has ended:
// its Pod is the tenant's (false), or it has none left and the store
// holds its artifacts under the tenant (true), as the leader finds a
// session it no longer holds (forgotten); else 404, or 503 when the
// store or the API server cannot say (no store: an ended session
// cannot be told, 503). The store is asked first, whatever the Pod:
// while it does not answer, every session gets the same 503 (a 404 for
// another tenant's Pod would tell that it has one).
func (s *Server) heldOrEnded(ctx context.Context, tenantName, id string) (bool, error) {
	unavailable := &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable"}
	var as []recordings.Artifact
	if s.store != nil {
		var err error
		if as, err = s.store.List(ctx, tenantName, id); err != nil && !errors.Is(err, recordings.ErrNotFound) {
			unavailable.err = err
			return false, unavailable
		}
	}
	_, found, err := s.live.(*relayLive).podOf(ctx, tenantName, id)
	switch {
	case err != nil:
		return false, err
	case found:
		return false, nil
	case s.store == nil:
		return false, unavailable
	case len(as) == 0:
		return false, errNotFound("no such session")
	}
	return true, nil
}

// issueReviewAlone issues a review link as the leader would
// (createPreview): of a session whose Pod is the tenant's and runs, its
// issue kept for the next leader's trail as other previews' are (one
// whose Pod stops waits for a leader: the next one would not adopt it
// and record the issue); or of one that ended (no Pod left) whose artifacts the store
// has under the tenant, its issue added to the session's stored log
// before the link is handed out.
func (s *Server) issueReviewAlone(c *fiber.Ctx, tenantName, id string, req previewRequest, ttl time.Duration) error {
	l := s.live.(*relayLive)
	ctx, cancel := context.WithTimeout(c.Context(), 10*time.Second)
	defer cancel()
	ended, err := s.heldOrEnded(ctx, tenantName, id)
	if err != nil {
		return err
	}
	if !ended {
		// Only a session the next leader adopts (running, unexpired)
		// records the issue it is reported; one whose Pod stops or
		// ended waits for a leader, which holds it as ending.
		if _, _, err := l.sessionAlone(ctx, tenantName, id); err != nil {
			return relayUnavailableFor(fmt.Errorf("a review link of a session that does not run waits for a leader: %w", err))
		}
	}
	// Counted once issued: a failed issue does not use the tenant's up.
	if err := l.madeAlone(tenantName, "issue", false); err != nil {
		return err
	}
	out, tok, ev, err := s.signPreview(tenantName, id, req, ttl)
	if err != nil {
		return relayUnavailableFor(err)
	}
	if ended {
		if err := s.recordStored(ctx, tenantName, id, ev); err != nil {
			return &apiError{status: 503, code: "unavailable", msg: "the review link was not issued: its issue could not be added to the session's stored audit log", err: err}
		}
	}
	if err := l.madeAlone(tenantName, "issue", true); err != nil && !ended {
		return err // (others issued meanwhile; an ended one's is in its log)
	}
	if !ended {
		l.event(relayEvent{Token: tok, Type: "preview_issued"})
	}
	return c.Status(fiber.StatusCreated).JSON(out)
}

// madeAlone refuses (503) a preview's issue or revocation (kind) made
// alone for tenantName past maxIssuedAlone of that kind, and counts it
// when count: each is an event kept among everyone's (a bounded
// buffer), and one tenant does not push the others' out. Issues and
// revocations are counted apart: issues do not keep a tenant from
// revoking.
func (l *relayLive) madeAlone(tenantName, kind string, count bool) error {
	if !l.withinAlone(count, aloneBound{tenantName + "\x00" + kind, maxIssuedAlone}) {
		return &apiError{status: 503, code: "unavailable", msg: fmt.Sprintf("no more than %d previews' %ss are made for a tenant while no gateway replica leads; retry", maxIssuedAlone, kind)}
	}
	return nil
}

// aloneBound is one bound on what a replica keeps while no leader
// answers: at most max under key (cleared as a leader answers).
type aloneBound struct {
	key string
	max int
}

// withinAlone says whether no bound is reached, and when count (and
// none is) counts one against each, at once.
func (l *relayLive) withinAlone(count bool, bounds ...aloneBound) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range bounds {
		if l.issuedAlone[b.key] >= b.max {
			return false
		}
	}
	if count {
		for _, b := range bounds {
			l.issuedAlone[b.key]++
		}
	}
	return true
}

// revokeAlone answers DELETE /v1/sessions/:id/previews/:preview as the
// leader would (revokePreview), for a session whose Pod is the
// tenant's, or that ended (no Pod left) and whose artifacts the store
// has under the tenant (as the leader's revokeForgotten finds it): the
// revocation is stored (RelayAlone.Revoke) for the longest a preview
// may live (the trail that says when this one expires is the
// leader's), held here at once (the copy of the stored revocations
// lags), the preview's connections this replica carries end, and its
// preview_revoked is kept for the next leader, which holds it too. An
// ended session's preview_revoked goes into its stored log before the
// answer, as the leader adds it (the next leader does not hold the
// session's trail).
func (s *Server) revokeAlone(c *fiber.Ctx, tenantName string) error {
	l := s.live.(*relayLive)
	id, pid, err := s.previewNamed(c)
	if err != nil {
		return err
	}
	if l.alone.Revoke == nil {
		return relayUnavailableFor(errors.New("this replica stores no revocations"))
	}
	ctx, cancel := context.WithTimeout(c.Context(), 10*time.Second)
	defer cancel()
	ended, err := s.heldOrEnded(ctx, tenantName, id)
	if err != nil {
		return err
	}
	if err := l.madeAlone(tenantName, "revocation", false); err != nil {
		return err
	}
	now := time.Now()
	until := now.Add(s.cfg.MaxPreviewTTL)
	if err := l.alone.Revoke(ctx, id, pid, until); err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the revocation could not be stored; revoke it again", err: err}
	}
	if err := l.madeAlone(tenantName, "revocation", true); err != nil {
		return err // (others made meanwhile): stored all the same
	}
	claims, terr := l.eventTicket(tenantName, id, now)
	l.mu.Lock()
	for k, u := range l.revokedAlone {
		if !now.Before(u) {
			delete(l.revokedAlone, k)
		}
	}
	l.revokedAlone[id+"\x00"+pid] = until
	l.mu.Unlock()
	l.endConns(func(rc *relayConn) bool { return rc.session == id && rc.preview == pid })
	var logErr error
	if ended {
		ev := session.Event{Time: now.UTC(), Type: "preview_revoked", Fields: map[string]any{"preview": pid, "stored": true}}
		if logErr = s.recordStored(ctx, tenantName, id, ev); logErr != nil {
			l.log.Error("a revocation of an ended session's preview is not in its stored audit log", "session", id, "preview", pid, "err", logErr)
		}
	}
	// (Logged only once it is: else the next leader records it.)
	if terr == nil {
		l.event(relayEvent{Token: claims.raw, Type: "preview_revoked", Preview: pid, Logged: ended && logErr == nil})
	} else {
		l.log.Warn("a revocation made alone is not kept for the next leader", "session", id, "preview", pid, "err", terr)
	}
	if logErr != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the preview is revoked, but its revocation could not be added to the session's stored audit log; revoke it again", err: logErr}
	}
	return c.SendStatus(fiber.StatusNoContent)
}
