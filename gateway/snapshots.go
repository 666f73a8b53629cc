package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/profile"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
)

// A workspace snapshot is the session user's home (the workspace within
// it) as a tar in the artifact store: files, directories and symlinks,
// never running processes, and never the session's kept browser profile
// (that is stored sealed, apart). It counts against the tenant's artifact
// quota and goes with its retention like any artifact.

// snapshotNote is what the API says of every snapshot.
const snapshotNote = "files only: the home directory and workspace as they were; running processes, open pages and anything outside /home/sandgate are not kept"

type snapshotView struct {
	ID            string    `json:"id"`
	Session       string    `json:"session"`
	Size          int64     `json:"size"`
	SHA256        string    `json:"sha256"`
	CreatedAt     time.Time `json:"created_at"`
	Paths         []string  `json:"paths"`
	ProcessesKept bool      `json:"processes_kept"`
	Note          string    `json:"note"`
}

func viewSnapshot(a recordings.Artifact) snapshotView {
	return snapshotView{ID: a.ID, Session: a.Session, Size: a.Size, SHA256: a.SHA256, CreatedAt: a.CreatedAt,
		Paths: []string{"/home/sandgate"}, ProcessesKept: false, Note: snapshotNote}
}

// createSnapshot: POST /v1/sessions/{id}/snapshots. The leader takes
// it, or a replica that stands by (NewRelay: its tar through the Pod
// exec API, stored in the artifact store, its snapshot_saved reported
// to the leader's trail as its other events are), admitted by the
// leader or, while none answers, alone.
func (s *Server) createSnapshot(c *fiber.Ctx) (err error) {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	claims, err := s.shells.openShell(c, id)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			st, code, _ := publicOf(err)
			s.log.Info("snapshot not taken", "session", id, "status", st, "code", code)
		}
	}()
	switch {
	case !claims.quotaSaid:
		// (A leader of the version before, on a replica that stands
		// by: the next ask may reach one of this version.)
		c.Set(fiber.HeaderRetryAfter, "2")
		return &apiError{status: 503, code: "unavailable", msg: "the leading gateway replica does not say the tenant's quota; retry"}
	case s.store == nil:
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable"}
	}
	tenant := claims.Tenant
	if err := s.checkArtifactRoom(c, tenant, claims.maxArtifactBytes); err != nil {
		return err
	}
	// One snapshot of a tenant at a time (on each replica): each spools
	// up to the bound on the gateway's disk.
	if !s.snapshotting.take(tenant) {
		return &apiError{status: 409, code: "conflict", msg: "a snapshot of this tenant is under way; take the next once it is done"}
	}
	defer s.snapshotting.drop(tenant)
	limit := s.keepLimits.MaxSnapshotBytes
	if claims.maxArtifactBytes > 0 {
		// No more than the tenant has left of its quota, counted now
		// (another replica may have stored a snapshot since the count
		// this one keeps).
		s.invalidateArtifactBytes(tenant)
		ctx, cancel := reqCtx(c, 10*time.Second)
		n, err := s.artifactBytes(ctx, tenant)
		cancel()
		if err != nil {
			c.Set(fiber.HeaderRetryAfter, "2")
			return &apiError{status: 503, code: "unavailable", msg: "the artifact store did not say what the tenant's artifacts take; retry", err: err}
		}
		limit = min(limit, claims.maxArtifactBytes-n)
	}
	if limit <= 0 {
		// Nothing left of the quota; and a bound of 0 bounds nothing.
		return overArtifactQuota(c, "the tenant's artifacts leave no room for a snapshot")
	}
	ctx, cancel := reqCtx(c, 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	f, err := os.CreateTemp("", "sandgate-snapshot-*.tar")
	if err != nil {
		return fmt.Errorf("snapshot spool: %w", err)
	}
	os.Remove(f.Name())
	defer f.Close()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	out, cleaned := cleaning(f, profile.Rules{MaxBytes: limit, MaxEntries: s.keepLimits.MaxEntries,
		Skip: profile.SnapshotSkip, Symlinks: true}, stop)
	var stderr bytes.Buffer
	p, err := s.shells.startShell(rctx, claims, session.ExecSpec{
		Args:   []string{"tar", "-c", "-C", "/home/sandgate", "-f", "-", "--exclude=./" + profile.ProfileDir, "."},
		Stdout: out, Stderr: &limitWriter{w: &stderr, n: 4096},
	})
	if err != nil {
		cleaned()
		return err
	}
	code, err := p.Wait(rctx)
	p.Close()
	sum, cleanErr := cleaned()
	switch {
	case cleanErr != nil:
		return &apiError{status: 422, code: "invalid_argument", msg: publicCleanText(cleanErr) +
			fmt.Sprintf(" (at most %d bytes, what is left of the tenant's quota, and %d entries)", limit, s.keepLimits.MaxEntries), err: cleanErr}
	case err != nil:
		return &apiError{status: 503, code: "unavailable", msg: "the session did not hand its files over in time", err: err}
	case code != 0 && code != 1:
		// GNU tar: 1 is "some files changed while read", the archive is whole.
		return &apiError{status: 503, code: "unavailable", msg: fmt.Sprintf("the session's tar failed (status %d)", code), err: errors.New(stderr.String())}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	a, err := s.store.PutFrom(ctx, tenant, recordings.Artifact{Session: id, Kind: recordings.KindSnapshot, Name: "snapshot.tar", ContentType: "application/x-tar"}, f)
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store did not take the snapshot", err: err}
	}
	s.invalidateArtifactBytes(tenant)
	if err := s.withinQuota(ctx, c, claims, a); err != nil {
		return err
	}
	s.live.record(claims, "snapshot_saved", snapshotFields(a, int64(sum.Files), code == 1, time.Since(t0).Milliseconds()))
	s.live.changed(claims)
	s.log.Info("snapshot stored", "session", id, "artifact", a.ID, "bytes", a.Size)
	return c.Status(fiber.StatusCreated).JSON(viewSnapshot(a))
}

// withinQuota checks, once snapshot a is stored, that the tenant's
// artifacts with it are within its quota: another replica may have
// stored a snapshot meanwhile (each bounds its own by what was left
// as it began). If not, a is deleted, and the answer is 429; if the
// store cannot say, a is kept.
func (s *Server) withinQuota(ctx context.Context, c *fiber.Ctx, claims *previewClaims, a recordings.Artifact) error {
	if claims.maxArtifactBytes <= 0 {
		return nil
	}
	n, err := s.artifactBytes(ctx, claims.Tenant)
	switch {
	case err != nil:
		s.log.Warn("a snapshot is kept unchecked against the tenant's quota: the store did not say what its artifacts take", "session", claims.Session, "artifact", a.ID, "err", err)
		return nil
	case n <= claims.maxArtifactBytes:
		return nil
	}
	if err := s.store.Delete(ctx, claims.Tenant, a.ID); err != nil {
		s.log.Error("a snapshot past the tenant's quota could not be deleted", "session", claims.Session, "artifact", a.ID, "err", err)
	}
	s.invalidateArtifactBytes(claims.Tenant)
	return overArtifactQuota(c, fmt.Sprintf("with this snapshot the tenant's artifacts take %d bytes of its %d (others were stored meanwhile), so it is not kept", n, claims.maxArtifactBytes))
}

// snapshotFields are the fields of a snapshot's event in the trail
// (snapshot_saved): the same whichever replica took it.
func snapshotFields(a recordings.Artifact, files int64, changed bool, tookMS int64) map[string]any {
	return map[string]any{"snapshot": a.ID, "size": a.Size, "sha256": a.SHA256,
		"files": files, "changed_while_read": changed, "took_ms": tookMS}
}

// listSnapshots: GET /v1/sessions/{id}/snapshots, those taken of the
// session (it may have ended).
func (s *Server) listSnapshots(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	as, err := s.store.ListKind(ctx, tenantOf(c), id, recordings.KindSnapshot)
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is not answering", err: err}
	}
	if len(as) == 0 {
		if _, err := s.sessions.Get(tenantOf(c), id); err != nil {
			return err
		}
	}
	return c.JSON(fiber.Map{"snapshots": viewSnapshots(as)})
}

func viewSnapshots(as []recordings.Artifact) []snapshotView {
	out := make([]snapshotView, 0, len(as))
	for _, a := range as {
		out = append(out, viewSnapshot(a))
	}
	return out
}

// restoreSnapshot unpacks a snapshot into a starting session's home
// (unpackSnapshot) and says so in its trail.
func (s *Server) restoreSnapshot(ctx context.Context, info session.Info, in *session.Inside) error {
	f, err := s.unpackSnapshot(ctx, info.Tenant, info.Snapshot, in.Run)
	if err != nil {
		return err
	}
	s.sessions.Record(info.ID, "snapshot_restored", f)
	return nil
}

// unpackSnapshot unpacks the tenant's snapshot into a starting session's
// home by run (a command in the session), holding the bytes to the
// digest the store recorded as they go, and returns its
// snapshot_restored event's fields.
func (s *Server) unpackSnapshot(ctx context.Context, tenant, snapshot string, run func(context.Context, session.ExecSpec) (int, error)) (map[string]any, error) {
	t0 := time.Now()
	a, _, err := s.store.Find(ctx, tenant, snapshot)
	switch {
	case errors.Is(err, recordings.ErrNotFound), err == nil && a.Kind != recordings.KindSnapshot:
		return nil, &session.PublicError{Class: session.ErrNotFound, Msg: "no such snapshot", Err: err}
	case err != nil:
		return nil, &session.PublicError{Class: session.ErrUnavailable, Msg: "the artifact store is not answering; retry", Err: err, RetryAfter: 2}
	}
	pr, pw := io.Pipe()
	h := sha256.New()
	fetched := make(chan error, 1)
	go func() {
		err := s.store.Fetch(ctx, tenant, a.ID, io.MultiWriter(pw, h))
		pw.CloseWithError(err)
		fetched <- err
	}()
	// What goes in is the gateway's own again: the store is not trusted
	// with the archive's shape either.
	cr, cw := io.Pipe()
	go func() {
		_, err := profile.Clean(cw, pr, profile.Rules{MaxBytes: max(a.Size, 1), MaxEntries: s.keepLimits.MaxEntries,
			Skip: profile.SnapshotSkip, Symlinks: true, Mounted: func(name string) bool { return name == session.WorkspaceDir }})
		cw.CloseWithError(err)
	}()
	body := &readErr{r: cr}
	var stderr bytes.Buffer
	// (The workspace, a volume's mount point whose mode and times the
	// session user may not change, is left as it is: Mounted.)
	code, err := run(ctx, session.ExecSpec{Args: []string{"tar", "-x", "-C", "/home/sandgate", "--no-same-owner", "-f", "-"},
		Stdin: body, Stderr: &limitWriter{w: &stderr, n: 4096}})
	// tar may stop at the archive's end marker: the rest is read too, so
	// that the digest covers the whole object.
	io.Copy(io.Discard, body)
	io.Copy(io.Discard, pr)
	ferr := <-fetched
	if ferr != nil && body.err == nil {
		body.err = ferr
	}
	switch {
	case ferr != nil:
		// (Not the archive's shape: the store's answer, worth a retry.)
		return nil, &session.PublicError{Class: session.ErrUnavailable, Msg: "the snapshot could not be read from the artifact store; retry", Err: body.err, RetryAfter: 2}
	case body.err != nil:
		return nil, &session.PublicError{Class: session.ErrUnavailable, Msg: "the snapshot could not be read from the artifact store", Err: body.err}
	case err != nil:
		return nil, fmt.Errorf("restore snapshot: %w", err)
	case code != 0:
		return nil, &session.PublicError{Class: session.ErrUnavailable, Msg: fmt.Sprintf("the snapshot could not be unpacked in the session (status %d)", code), Err: errors.New(stderr.String())}
	case hex.EncodeToString(h.Sum(nil)) != a.SHA256:
		return nil, &session.PublicError{Class: session.ErrConflict, Msg: "the snapshot's stored bytes do not match its sha256; it was altered in the store"}
	}
	return map[string]any{"snapshot": a.ID, "size": a.Size, "sha256": a.SHA256, "took_ms": time.Since(t0).Milliseconds()}, nil
}

// tenantSlots lets one operation of a kind run per tenant at a time.
type tenantSlots struct {
	mu   sync.Mutex
	busy map[string]bool
}

func (t *tenantSlots) take(tenant string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.busy == nil {
		t.busy = map[string]bool{}
	}
	if t.busy[tenant] {
		return false
	}
	t.busy[tenant] = true
	return true
}

func (t *tenantSlots) drop(tenant string) {
	t.mu.Lock()
	delete(t.busy, tenant)
	t.mu.Unlock()
}

// maxTrailing bounds what a session's tar may write after its archive's
// end (GNU tar pads to 10 KiB records).
const maxTrailing = 1 << 20

// cleaning runs profile.Clean, into dst, on what is written to the
// returned writer: the output of a session's tar. A tar that does not
// clean, or goes on past its end, is stopped (stop) rather than left
// blocked on a pipe nobody reads. cleaned closes the writer and returns
// what Clean kept.
func cleaning(dst io.Writer, r profile.Rules, stop context.CancelFunc) (out io.Writer, cleaned func() (profile.Summary, error)) {
	pr, pw := io.Pipe()
	type result struct {
		sum profile.Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		sum, err := profile.Clean(dst, pr, r)
		if err == nil {
			if n, _ := io.CopyN(io.Discard, pr, maxTrailing+1); n > maxTrailing {
				err = fmt.Errorf("%w: it goes on past its end", profile.ErrBadArchive)
			}
		}
		if err != nil {
			stop()
			pr.CloseWithError(err)
		}
		done <- result{sum, err}
	}()
	return pw, func() (profile.Summary, error) {
		pw.Close()
		r := <-done
		return r.sum, r.err
	}
}
