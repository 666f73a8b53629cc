package gateway

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
)

//go:embed review/review.html
var reviewFS embed.FS

var reviewPage = template.Must(template.ParseFS(reviewFS, "review/review.html"))

// reviewAuth checks a review preview. Unlike the live previews it does
// not need the session to run: a review is for afterwards.
func (s *Server) reviewAuth(c *fiber.Ctx) error {
	claims, err := s.tokens.verify(c.Params("token"), time.Now())
	if err != nil || claims.Scope != ScopeReview || s.sessions.Revoked(claims.Session, claims.ID) || !s.tenants.Enabled(claims.Tenant) {
		return errUnauthenticated("the preview token is missing, invalid or expired")
	}
	c.Locals(localClaims, claims)
	return c.Next()
}

// review serves the review page: the recording in a player and every
// artifact of the session, each behind a fresh presigned link.
func (s *Server) review(c *fiber.Ctx) error {
	claims := c.Locals(localClaims).(*previewClaims)
	if s.store == nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable"}
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	as, err := s.store.List(ctx, claims.Tenant, claims.Session)
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
	}
	data := map[string]any{
		"Session": claims.Session, "Artifacts": as, "Base": "/review/" + c.Params("token"),
		"ExpiresAt": claims.ExpiresAt.Time.UTC().Format(time.RFC3339),
	}
	segments := 0
	for i := range as {
		switch {
		case as[i].Kind == recordings.KindRecording && as[i].ContentType == "video/mp4":
			data["Recording"] = as[i]
		case as[i].Kind == recordings.KindSegment:
			segments++
		}
	}
	data["Segments"] = segments
	if err := s.noteReview(ctx, c, claims, "review_opened", "", nil); err != nil {
		return err
	}
	var b bytes.Buffer
	if err := reviewPage.Execute(&b, data); err != nil {
		return err
	}
	c.Set(fiber.HeaderContentType, fiber.MIMETextHTMLCharsetUTF8)
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Set("Referrer-Policy", "no-referrer")
	c.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; media-src *; img-src *")
	return c.Send(b.Bytes())
}

// reviewArtifact redirects to a fresh presigned URL of one of the
// session's artifacts.
func (s *Server) reviewArtifact(c *fiber.Ctx) error {
	claims := c.Locals(localClaims).(*previewClaims)
	if s.store == nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable"}
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	a, _, err := s.store.Find(ctx, claims.Tenant, c.Params("id"))
	if errors.Is(err, recordings.ErrNotFound) || (err == nil && a.Session != claims.Session) {
		return errNotFound("no such artifact")
	}
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: err}
	}
	if err := s.noteReview(ctx, c, claims, "review_fetched", a.ID, map[string]any{"artifact": a.ID, "kind": a.Kind, "name": a.Name}); err != nil {
		return err
	}
	u, err := s.store.PresignedURL(ctx, claims.Tenant, a.ID)
	if err != nil {
		return &apiError{status: 503, code: "unavailable", msg: "the artifact store is unavailable", err: fmt.Errorf("presign: %w", err)}
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Redirect(u.String(), fiber.StatusFound)
}

// noteReview records in the session's audit trail that a review link
// opened its page or fetched an artifact, before it is served: the
// trail of a session still held, else its stored log (503 when that
// cannot take it). A link that holds a stranger's hands is not let grow
// the log: each link's page, and each of its artifacts, is recorded
// once in reviewNoteEvery; requests that come while it is being
// recorded wait for that one, and try themselves if it failed.
//
// The trail names the caller by a keyed digest of its address and the
// session, not the address: everyone who holds the link can read the
// trail (audit.jsonl is on the review page), and one stranger's address
// is not another's to read, nor is the same stranger to be followed from
// one session to another. The digest tells one session's viewers apart;
// the gateway's own log, which only its operator reads, has the address.
func (s *Server) noteReview(ctx context.Context, c *fiber.Ctx, claims *previewClaims, typ, artifact string, fields map[string]any) error {
	k := reviewKey{claims.ID, artifact}
	now := time.Now()
	n, mine := s.reviews.begin(k, now)
	for !mine {
		if n == nil {
			return nil
		}
		select {
		case <-n.done:
		case <-ctx.Done():
			return reviewUnlogged(ctx.Err())
		}
		if n.err == nil {
			return nil
		}
		// The one it waited for failed (perhaps only for its own
		// deadline): it tries itself, within its own.
		now = time.Now()
		n, mine = s.reviews.begin(k, now)
	}
	err := errReviewUnrecorded // until it is recorded, a panic included
	defer func() { s.reviews.end(k, n, now, err) }()
	if fields == nil {
		fields = map[string]any{}
	}
	addr := s.clientAddr(c)
	fields["preview"], fields["viewer"] = claims.ID, s.tokens.viewer(claims.Tenant, claims.Session, addr)
	s.log.Info("review link used", "session", claims.Session, "preview", claims.ID, "event", typ, "artifact", artifact, "remote", addr, "viewer", fields["viewer"])
	if s.sessions != nil && s.sessions.Record(claims.Session, typ, fields) {
		s.durable(claims.Session)
		err = nil
		return nil
	}
	if keep, ok := c.Locals(localReviewKeep).(func(typ string, fields map[string]any) error); ok {
		// A running session's, while no leader answers: kept for the
		// next one, which holds its trail.
		if err = keep(typ, fields); err != nil {
			return err
		}
		return nil
	}
	ev := session.Event{Time: now.UTC(), Type: typ, Fields: fields}
	if err = s.recordStored(ctx, claims.Tenant, claims.Session, ev); err != nil {
		return reviewUnlogged(err)
	}
	return nil
}

var errReviewUnrecorded = errors.New("the review's use was not recorded")

func reviewUnlogged(err error) error {
	return &apiError{status: 503, code: "unavailable", msg: "the review is not served: it could not be added to the session's stored audit log", err: err}
}

// reviewNoteEvery is how often one review link's page, or one of its
// artifacts, is recorded at most.
const reviewNoteEvery = 10 * time.Minute

// maxReviewNotes bounds how many recorded notes reviewNotes keeps; past
// it, the oldest go (the expired ones are the oldest).
const maxReviewNotes = 1 << 14

type reviewKey struct{ preview, artifact string }

// reviewNote is one review link's page or artifact being recorded, or
// recorded at a time.
type reviewNote struct {
	at   time.Time     // when it was recorded; zero while it is being recorded
	done chan struct{} // closed once it is recorded or has failed
	err  error         // why it failed, set before done closes
}

// reviewNotes is what each review link's page and artifacts last had
// recorded.
type reviewNotes struct {
	mu    sync.Mutex
	notes map[reviewKey]*reviewNote
	order []reviewStamp // recorded notes, oldest first; some may be gone
}

type reviewStamp struct {
	key reviewKey
	at  time.Time
}

// begin is k's note at now: nil when k was recorded within
// reviewNoteEvery; one another request is recording (mine false) to
// wait on; or a new one the caller records (mine true) and must end.
func (r *reviewNotes) begin(k reviewKey, now time.Time) (n *reviewNote, mine bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.notes[k]; n != nil {
		if n.at.IsZero() {
			return n, false
		}
		if now.Sub(n.at) < reviewNoteEvery {
			return nil, false
		}
	}
	if r.notes == nil {
		r.notes = map[reviewKey]*reviewNote{}
	}
	n = &reviewNote{done: make(chan struct{})}
	r.notes[k] = n
	return n, true
}

// end closes what begin opened: recorded at now, or failed with err,
// when the next request records k again.
func (r *reviewNotes) end(k reviewKey, n *reviewNote, now time.Time, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n.err = err
	close(n.done)
	if r.notes[k] != n {
		return
	}
	if err != nil {
		delete(r.notes, k)
		return
	}
	n.at = now
	r.order = append(r.order, reviewStamp{k, now})
	for len(r.notes) > maxReviewNotes && len(r.order) > 0 {
		old := r.order[0]
		r.order = r.order[1:]
		if o := r.notes[old.key]; o != nil && o.at.Equal(old.at) {
			delete(r.notes, old.key)
		}
	}
	if len(r.order) > 2*maxReviewNotes {
		// Keys recorded again leave stamps behind; drop them.
		live := make([]reviewStamp, 0, len(r.notes))
		for _, st := range r.order {
			if o := r.notes[st.key]; o != nil && o.at.Equal(st.at) {
				live = append(live, st)
			}
		}
		r.order = live
	}
}
