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
// opened its page or fetched an artifact, and from where, before it is
// served: the trail of a session still held, else its stored log (503
// when that cannot take it). A link that holds a stranger's hands is
// not let grow the log: each link's page, and each of its artifacts, is
// recorded once in reviewNoteEvery.
func (s *Server) noteReview(ctx context.Context, c *fiber.Ctx, claims *previewClaims, typ, artifact string, fields map[string]any) error {
	k := reviewKey{claims.ID, artifact}
	now := time.Now()
	if !s.reviews.due(k, now) {
		return nil
	}
	if fields == nil {
		fields = map[string]any{}
	}
	fields["preview"], fields["remote"] = claims.ID, c.IP()
	if s.sessions.Record(claims.Session, typ, fields) {
		s.durable(claims.Session)
	} else {
		ev := session.Event{Time: now.UTC(), Type: typ, Fields: fields}
		if err := s.recordStored(ctx, claims.Tenant, claims.Session, ev); err != nil {
			return &apiError{status: 503, code: "unavailable", msg: "the review is not served: it could not be added to the session's stored audit log", err: err}
		}
	}
	s.reviews.noted(k, now)
	return nil
}

// reviewNoteEvery is how often one review link's page, or one of its
// artifacts, is recorded at most.
const reviewNoteEvery = 10 * time.Minute

// maxReviewNotes bounds what reviewNotes keeps; past it, the oldest go.
const maxReviewNotes = 1 << 14

type reviewKey struct{ preview, artifact string }

// reviewNotes is when each review link's page and artifacts were last
// recorded.
type reviewNotes struct {
	mu   sync.Mutex
	last map[reviewKey]time.Time
}

func (r *reviewNotes) due(k reviewKey, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.last[k]
	return !ok || now.Sub(t) >= reviewNoteEvery
}

func (r *reviewNotes) noted(k reviewKey, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[reviewKey]time.Time{}
	}
	if len(r.last) >= maxReviewNotes {
		for k, t := range r.last {
			if now.Sub(t) >= reviewNoteEvery {
				delete(r.last, k)
			}
		}
	}
	for len(r.last) >= maxReviewNotes {
		var oldest reviewKey
		first := true
		for k, t := range r.last {
			if first || t.Before(r.last[oldest]) {
				oldest, first = k, false
			}
		}
		delete(r.last, oldest)
	}
	r.last[k] = now
}
