package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/profile"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/vault"
)

// ProfileLimits bound what the gateway keeps of a session's profile and
// workspace.
type ProfileLimits struct {
	MaxProfileBytes  int64 // a profile's tar (default 128 MiB)
	MaxSnapshotBytes int64 // a snapshot's tar (default 1 GiB)
	MaxEntries       int   // files and directories in either (default 100000)
}

func (l ProfileLimits) withDefaults() ProfileLimits {
	if l.MaxProfileBytes <= 0 {
		l.MaxProfileBytes = 128 << 20
	}
	if l.MaxSnapshotBytes <= 0 {
		l.MaxSnapshotBytes = 1 << 30
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = 100000
	}
	return l
}

// WithProfiles enables browser profiles (POST /v1/profiles, a session's
// "profile") with their store (bounded by Config.Keep).
func WithProfiles(p *profile.Store) Option {
	return func(s *Server) { s.profiles = p }
}

func (s *Server) needProfiles() error {
	if s.profiles == nil {
		return errNoProfiles()
	}
	return nil
}

func errNoProfiles() error {
	return &apiError{status: 503, code: "unavailable", msg: "this gateway keeps no browser profiles (vault.key is not configured)"}
}

func profileError(err error) error {
	switch {
	case errors.Is(err, profile.ErrNotFound):
		return errNotFound("no such profile")
	case errors.Is(err, profile.ErrInvalid):
		return errInvalid(strings.TrimPrefix(err.Error(), profile.ErrInvalid.Error()+": "))
	case errors.Is(err, profile.ErrChanged):
		return &apiError{status: 409, code: "conflict", msg: "the profile was changed meanwhile (by another gateway replica); try again", err: err}
	case errors.Is(err, profile.ErrTampered):
		return &apiError{status: 409, code: "conflict", msg: err.Error() + "; it was not loaded: roll the profile back to a kept version, or delete it", err: err}
	default:
		return &apiError{status: 503, code: "unavailable", msg: "the profile store is not answering", err: err}
	}
}

// profilesIn is where a profile route reads and writes: a store, and
// whether a session of the tenant holds a profile now. The leader's
// are its own (profilesHere); a replica that answers alone has its
// own store and its Pods' records (profilesAlone).
type profilesIn struct {
	store  *profile.Store
	tenant string
	inUse  func(id string) bool
}

// profilesHere is the leader's profilesIn for the request's tenant.
func (s *Server) profilesHere(c *fiber.Ctx) (profilesIn, error) {
	if err := s.needProfiles(); err != nil {
		return profilesIn{}, err
	}
	tenant := tenantOf(c)
	return profilesIn{store: s.profiles, tenant: tenant, inUse: func(id string) bool { return s.sessions.ProfileInUse(tenant, id) }}, nil
}

// view is a profile as the API shows it: with whether a session holds
// it now.
func (in profilesIn) view(p profile.Profile) fiber.Map {
	return fiber.Map{"id": p.ID, "name": p.Name, "created_at": p.CreatedAt, "updated_at": p.UpdatedAt,
		"current_version": p.Current, "versions": p.Versions, "in_use": in.inUse(p.ID)}
}

func (s *Server) createProfile(c *fiber.Ctx) error {
	in, err := s.profilesHere(c)
	if err != nil {
		return err
	}
	return s.createProfileIn(c, in)
}

func (s *Server) createProfileIn(c *fiber.Ctx, in profilesIn) error {
	var req struct {
		Name string `json:"name"`
	}
	if err := decode(c, &req); err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	p, err := in.store.Create(ctx, in.tenant, req.Name)
	if err != nil {
		return profileError(err)
	}
	s.log.Info("profile created", "tenant", in.tenant, "profile", p.ID)
	return c.Status(fiber.StatusCreated).JSON(in.view(p))
}

func (s *Server) listProfiles(c *fiber.Ctx) error {
	in, err := s.profilesHere(c)
	if err != nil {
		return err
	}
	return listProfilesIn(c, in)
}

func listProfilesIn(c *fiber.Ctx, in profilesIn) error {
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	ps, err := in.store.List(ctx, in.tenant)
	if err != nil {
		return profileError(err)
	}
	out := make([]fiber.Map, 0, len(ps))
	for _, p := range ps {
		out = append(out, in.view(p))
	}
	return c.JSON(fiber.Map{"profiles": out})
}

func (s *Server) getProfile(c *fiber.Ctx) error {
	in, err := s.profilesHere(c)
	if err != nil {
		return err
	}
	return getProfileIn(c, in)
}

func getProfileIn(c *fiber.Ctx, in profilesIn) error {
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	p, err := in.store.Get(ctx, in.tenant, c.Params("pid"))
	if err != nil {
		return profileError(err)
	}
	return c.JSON(in.view(p))
}

func (s *Server) deleteProfile(c *fiber.Ctx) error {
	in, err := s.profilesHere(c)
	if err != nil {
		return err
	}
	return s.deleteProfileIn(c, in)
}

func (s *Server) deleteProfileIn(c *fiber.Ctx, in profilesIn) error {
	tenant, id := in.tenant, c.Params("pid")
	if in.inUse(id) {
		return &apiError{status: 409, code: "conflict", msg: "the profile is in use by a session; delete it once the session has ended"}
	}
	ctx, cancel := reqCtx(c, 60*time.Second)
	defer cancel()
	if err := in.store.Delete(ctx, tenant, id); err != nil {
		return profileError(err)
	}
	s.invalidateArtifactBytes(tenant)
	s.log.Info("profile deleted", "tenant", tenant, "profile", id)
	return c.SendStatus(fiber.StatusNoContent)
}

func (s *Server) rollbackProfile(c *fiber.Ctx) error {
	in, err := s.profilesHere(c)
	if err != nil {
		return err
	}
	return s.rollbackProfileIn(c, in)
}

func (s *Server) rollbackProfileIn(c *fiber.Ctx, in profilesIn) error {
	version, err := rollbackVersion(c)
	if err != nil {
		return err
	}
	tenant, id := in.tenant, c.Params("pid")
	if in.inUse(id) {
		return &apiError{status: 409, code: "conflict", msg: "the profile is in use by a session; roll it back once the session has ended"}
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	p, err := in.store.Rollback(ctx, tenant, id, version)
	if err != nil {
		return profileError(err)
	}
	s.log.Info("profile rolled back", "tenant", tenant, "profile", id, "version", version)
	return c.JSON(in.view(p))
}

// rollbackVersion is the version a rollback's body asks for.
func rollbackVersion(c *fiber.Ctx) (int, error) {
	var req struct {
		Version *int `json:"version"`
	}
	if err := decode(c, &req); err != nil {
		return 0, err
	}
	if req.Version == nil || *req.Version < 0 {
		return 0, errInvalid("version must be a kept version, or 0 for a fresh profile")
	}
	return *req.Version, nil
}

// keepSpec checks a create's "profile" and "snapshot" and refuses, before
// any session exists, a profile whose stored version does not open and a
// snapshot that is not the tenant's.
func (s *Server) keepSpec(ctx context.Context, tenant string, kind session.Kind, p *session.ProfileUse, snapshot string, bindings []egress.Binding) error {
	if p != nil {
		if err := s.needProfiles(); err != nil {
			return err
		}
		if err := profileUseValid(kind, p, bindings); err != nil {
			return err
		}
		if err := s.checkProfile(ctx, s.profiles, tenant, p.ID); err != nil {
			return profileError(err)
		}
	}
	if snapshot != "" {
		return s.checkSnapshot(ctx, tenant, snapshot)
	}
	return nil
}

// profileUseValid refuses a create's profile p that a session of kind,
// with bindings, cannot take.
func profileUseValid(kind session.Kind, p *session.ProfileUse, bindings []egress.Binding) error {
	if kind == session.KindDesktop {
		return errInvalid("a profile is a browser's: a desktop session cannot take one")
	}
	if !profile.IsID(p.ID) {
		return errInvalid("profile.id must be a profile id (prof_ and 16 hex digits)")
	}
	if p.Persist {
		for _, b := range bindings {
			if b.Fill == egress.FillValue {
				// The page would hold the secret's value, and the
				// browser would keep it (a saved password, a form's
				// autofill) where a scan of the profile cannot see.
				return errInvalid("a session that writes its profile back cannot bind a credential with fill \"value\": the typed secret would be kept in the profile")
			}
		}
	}
	return nil
}

// checkSnapshot refuses a create from a snapshot that is not one of the
// tenant's (404), or that the store cannot say (503).
func (s *Server) checkSnapshot(ctx context.Context, tenant, snapshot string) error {
	a, _, err := s.store.Find(ctx, tenant, snapshot)
	switch {
	case errors.Is(err, recordings.ErrNotFound), err == nil && a.Kind != recordings.KindSnapshot:
		return errNotFound("no such snapshot")
	case err != nil:
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is not answering", err: err}
	}
	return nil
}

// checkProfile reads the profile's current version whole, once per
// version: a version that opened once is not read again at every create
// (its restore is checked as it goes in all the same).
func (s *Server) checkProfile(ctx context.Context, store *profile.Store, tenant, id string) error {
	p, err := store.Get(ctx, tenant, id)
	if err != nil {
		return err
	}
	var sha string
	for _, v := range p.Versions {
		if v.Version == p.Current {
			sha = v.SHA256
		}
	}
	key := fmt.Sprintf("%s/%s/%d/%s", tenant, id, p.Current, sha)
	if p.Current == 0 || s.verified.has(key) {
		return nil
	}
	if _, err := store.Verify(ctx, tenant, id); err != nil {
		return err
	}
	s.verified.add(key)
	return nil
}

// verifiedProfiles remembers profile versions that opened whole.
type verifiedProfiles struct {
	mu sync.Mutex
	m  map[string]bool
}

// maxVerified bounds what verifiedProfiles remembers; past it, it starts
// over.
const maxVerified = 4096

func (v *verifiedProfiles) has(k string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.m[k]
}

func (v *verifiedProfiles) add(k string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil || len(v.m) >= maxVerified {
		v.m = map[string]bool{}
	}
	v.m[k] = true
}

// Keeper: the observer moves profiles and snapshots in and out.
var _ session.Keeper = (*observer)(nil)

// Restore writes a starting session's snapshot, then its profile, in.
func (o *observer) Restore(ctx context.Context, info session.Info, in *session.Inside) error {
	s := (*Server)(o)
	if info.Snapshot != "" {
		if err := s.restoreSnapshot(ctx, info, in); err != nil {
			return err
		}
	}
	if info.Profile != nil {
		return s.restoreProfile(ctx, info, in)
	}
	return nil
}

func (s *Server) restoreProfile(ctx context.Context, info session.Info, in *session.Inside) error {
	if s.profiles == nil {
		return &session.PublicError{Class: session.ErrUnavailable, Msg: "this gateway keeps no browser profiles"}
	}
	f, err := s.writeProfile(ctx, s.profiles, info.Tenant, *info.Profile, in.Run)
	if err != nil {
		return err
	}
	s.sessions.Record(info.ID, "profile_restored", f)
	return nil
}

// writeProfile writes the tenant's profile p, read from store, into a
// starting session by run (a command in the session), which lets its
// browser start on it, and returns its profile_restored event's fields.
func (s *Server) writeProfile(ctx context.Context, store *profile.Store, tenant string, p session.ProfileUse, run func(context.Context, session.ExecSpec) (int, error)) (map[string]any, error) {
	t0 := time.Now()
	// Checked whole at the create; read again as it goes in. An object
	// altered between the two fails here, and the session with it.
	v, r, err := store.Open(ctx, tenant, p.ID)
	if err != nil {
		return nil, profileReadError(p.ID, err)
	}
	defer r.Close()
	var stderr bytes.Buffer
	body := &readErr{r: r}
	code, err := run(ctx, session.ExecSpec{Args: []string{"sandgate-profile", "restore"}, Stdin: body, Stderr: &limitWriter{w: &stderr, n: 4096}})
	switch {
	case body.err != nil:
		return nil, profileReadError(p.ID, body.err)
	case err != nil:
		return nil, fmt.Errorf("restore profile: %w", err)
	case code != 0:
		return nil, &session.PublicError{Class: session.ErrUnavailable, Msg: fmt.Sprintf("the profile could not be written into the session (status %d)", code),
			Err: errors.New(stderr.String())}
	}
	return map[string]any{"profile": p.ID, "version": v.Version, "size": v.Size, "persist": p.Persist,
		"took_ms": time.Since(t0).Milliseconds()}, nil
}

// profileReadError is a failed read of profile id's stored version as
// it goes into a session: altered (409) or gone meanwhile (404), or a
// store that does not answer (503 to retry).
func profileReadError(id string, err error) error {
	class, retry := session.ErrUnavailable, 2
	switch {
	case errors.Is(err, profile.ErrTampered):
		class, retry = session.ErrConflict, 0
	case errors.Is(err, profile.ErrNotFound):
		class, retry = session.ErrNotFound, 0
	}
	msg := "profile " + id + ": " + publicText(err)
	if retry > 0 {
		msg += "; retry"
	}
	return &session.PublicError{Class: class, Msg: msg, Err: err, RetryAfter: retry}
}

// publicText is the message of a profile or snapshot error, safe to show.
func publicText(err error) string {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.msg
	}
	if errors.Is(err, profile.ErrTampered) || errors.Is(err, profile.ErrNotFound) {
		// These messages name only the profile, its version and what failed.
		msg := err.Error()
		if i := strings.Index(msg, profile.ErrTampered.Error()); i >= 0 {
			msg = msg[i:]
		}
		return msg + "; it was not loaded"
	}
	return "the profile store is not answering"
}

// readErr remembers the error of the reader it passes on (a session sees
// only that its stdin ended).
type readErr struct {
	r   io.Reader
	err error
}

func (r *readErr) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		r.err = err
	}
	return n, err
}

// limitWriter keeps the first n bytes written to it.
type limitWriter struct {
	w io.Writer
	n int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}

// Save writes a cleanly stopped session's profile back as a new version:
// the session's tar is cleaned, checked for the values of the vault
// credentials bound to the session, sealed as it is read, and stored
// only once the session's side has ended well.
func (o *observer) Save(ctx context.Context, info session.Info, in *session.Inside) {
	s := (*Server)(o)
	t0 := time.Now()
	notSaved := func(reason string, err error) {
		s.log.Warn("profile not saved", "session", info.ID, "tenant", info.Tenant, "profile", info.Profile.ID, "reason", reason, "err", err)
		s.sessions.Record(info.ID, "profile_not_saved", map[string]any{"profile": info.Profile.ID, "reason": reason})
	}
	if s.profiles == nil {
		notSaved("this gateway keeps no browser profiles", nil)
		return
	}
	if lim, _ := s.sessions.Limits(info.Tenant); lim.MaxArtifactBytes > 0 {
		if n, err := s.artifactBytes(ctx, info.Tenant); err == nil && n >= lim.MaxArtifactBytes {
			notSaved(fmt.Sprintf("the tenant's stored bytes (%d) are at its quota (%d)", n, lim.MaxArtifactBytes), nil)
			return
		}
	}
	secrets, err := s.boundSecrets(ctx, info)
	if err != nil {
		notSaved("the session's credentials could not be opened to check the profile against them", err)
		return
	}
	sv, err := s.profiles.NewSaver(ctx, info.Tenant, info.Profile.ID)
	if err != nil {
		notSaved("the profile is gone or the store is not answering", err)
		return
	}
	scan := newSecretScan(secrets)
	// The browser is asked to close (it writes its state as it does),
	// held down first so that the session does not start another.
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	code, err := in.Run(hctx, session.ExecSpec{Args: []string{"sandgate-profile", "hold"}})
	hcancel()
	if err != nil || code != 0 {
		s.log.Warn("profile save: the browser could not be held down", "session", info.ID, "code", code, "err", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if err := browser.Close(cctx, in.Endpoint().CDP); err != nil {
		s.log.Warn("profile save: the browser did not take Browser.close; it gets a TERM", "session", info.ID, "err", err)
	}
	cancel()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	out, cleaned := cleaning(io.MultiWriter(sv, scan), profile.Rules{
		MaxBytes: s.keepLimits.MaxProfileBytes, MaxEntries: s.keepLimits.MaxEntries, Skip: profile.ProfileSkip}, stop)
	var stderr bytes.Buffer
	code, runErr := in.Run(rctx, session.ExecSpec{Args: []string{"sandgate-profile", "save"}, Stdout: out, Stderr: &limitWriter{w: &stderr, n: 4096}})
	sum, cleanErr := cleaned()
	switch {
	case cleanErr != nil:
		sv.Abort()
		notSaved(publicCleanText(cleanErr), cleanErr)
		return
	case runErr != nil:
		sv.Abort()
		notSaved("the session did not hand its profile over", runErr)
		return
	case code == 3:
		sv.Abort()
		notSaved("the browser did not close in time, so its state may be torn", nil)
		return
	case code != 0:
		sv.Abort()
		notSaved(fmt.Sprintf("the session's side of the save failed (status %d)", code), errors.New(stderr.String()))
		return
	case scan.found():
		sv.Abort()
		notSaved("the profile holds the value of a vault credential bound to the session; profiles never keep vault secrets", nil)
		return
	}
	v, err := sv.Commit(ctx, info.ID, sum.Files)
	if err != nil {
		notSaved("the profile store did not take it", err)
		return
	}
	s.invalidateArtifactBytes(info.Tenant)
	s.sessions.Record(info.ID, "profile_saved", map[string]any{"profile": info.Profile.ID, "version": v.Version, "size": v.Size,
		"stored_bytes": v.StoredBytes, "files": v.Files, "sha256": v.SHA256, "took_ms": time.Since(t0).Milliseconds()})
	s.log.Info("profile saved", "session", info.ID, "tenant", info.Tenant, "profile", info.Profile.ID, "version", v.Version, "size", v.Size)
}

func publicCleanText(err error) string {
	switch {
	case errors.Is(err, profile.ErrTooLarge):
		return "the session's archive is larger than this gateway keeps"
	case errors.Is(err, profile.ErrBadArchive):
		return "the session's archive was not a well-formed tar of plain names"
	}
	return "the archive could not be read"
}

// boundSecrets opens the values of the vault credentials bound to the
// session.
func (s *Server) boundSecrets(ctx context.Context, info session.Info) ([][]byte, error) {
	var out [][]byte
	if s.vault == nil {
		return nil, nil
	}
	for _, b := range info.Egress.Credentials {
		c, err := s.vault.Open(ctx, info.Tenant, b.Credential)
		if errors.Is(err, vault.ErrNotFound) {
			continue // deleted: its value is gone from the vault too
		}
		if err != nil {
			return nil, err // not checked is not saved
		}
		out = append(out, []byte(c.Secret))
	}
	return out, nil
}

// secretScan looks for any of its secrets in what is written to it,
// across writes.
type secretScan struct {
	secrets [][]byte
	tail    []byte
	hit     bool
	keep    int
}

func newSecretScan(secrets [][]byte) *secretScan {
	sc := &secretScan{}
	for _, x := range secrets {
		if len(x) > 0 {
			sc.secrets = append(sc.secrets, x)
			sc.keep = max(sc.keep, len(x)-1)
		}
	}
	return sc
}

func (sc *secretScan) Write(p []byte) (int, error) {
	if sc.hit || len(sc.secrets) == 0 {
		return len(p), nil
	}
	buf := append(sc.tail, p...)
	for _, x := range sc.secrets {
		if bytes.Contains(buf, x) {
			sc.hit = true
			return len(p), nil
		}
	}
	if len(buf) > sc.keep {
		buf = buf[len(buf)-sc.keep:]
	}
	sc.tail = append(sc.tail[:0], buf...)
	return len(p), nil
}

func (sc *secretScan) found() bool { return sc.hit }
