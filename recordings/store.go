// Package recordings owns the artifact store on MinIO: screenshots,
// downloads, recordings and audit logs of sessions, kept under tenant and
// session keys, listed with their digests and served through short-lived
// presigned URLs.
package recordings

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"mime"
	"net"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/sandgate/sandgate/bucket"
	"github.com/sandgate/sandgate/ids"
)

// ErrNotFound: no such artifact for this tenant.
var ErrNotFound = errors.New("artifact not found")

// ErrTooLarge: an artifact is larger than what its reader takes.
var ErrTooLarge = errors.New("the artifact is larger than the bound it is read within")

// Kinds of artifacts.
const (
	KindScreenshot = "screenshot"
	KindDownload   = "download"
	KindRecording  = "recording"
	KindLog        = "log"
	// KindSnapshot is a session's workspace and home as a tar.
	KindSnapshot = "snapshot"
	// KindSegment is a piece of a recording in progress; the finished
	// recording replaces its segments.
	KindSegment = "recording_segment"
)

// Artifact describes one stored object.
type Artifact struct {
	ID          string    `json:"id"`
	Session     string    `json:"session"`
	Kind        string    `json:"kind"`
	Name        string    `json:"name"`
	Size        int64     `json:"size"`
	SHA256      string    `json:"sha256"`
	ContentType string    `json:"content_type"`
	CreatedAt   time.Time `json:"created_at"`
	// SourceURL is where a download came from.
	SourceURL string `json:"source_url,omitempty"`
}

// Config says where the store is.
type Config struct {
	Endpoint   string
	AccessKey  string
	SecretKey  string
	Secure     bool
	Bucket     string
	PresignTTL time.Duration
}

// Store keeps artifacts in one bucket, keyed tenant/session/kind/id.
type Store struct {
	client *minio.Client
	cfg    Config
}

// New connects to MinIO and creates the bucket if it is missing.
func New(ctx context.Context, cfg Config) (*Store, error) {
	s, err := Open(cfg)
	if err != nil {
		return nil, err
	}
	if err := bucket.Ensure(ctx, s.client, cfg.Endpoint, cfg.Bucket); err != nil {
		return nil, err
	}
	return s, nil
}

var (
	idPattern   = regexp.MustCompile(`^(` + ids.SessionPattern + `)\.[0-9a-f]{16}$`)
	tenantChars = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
)

// IsArtifact says whether id is an artifact's id, as the store makes
// them.
func IsArtifact(id string) bool { return idPattern.MatchString(id) }

// validName accepts a file name as a browser would save it: 1-255 bytes
// of UTF-8 without path separators or control characters.
func validName(n string) bool {
	if n == "" || len(n) > 255 || !utf8.ValidString(n) || n == "." || n == ".." {
		return false
	}
	for _, r := range n {
		if r == '/' || r == '\\' || unicode.IsControl(r) {
			return false
		}
	}
	return true
}

func newArtifactID(session string) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return session + "." + hex.EncodeToString(b)
}

func key(tenant, session, kind, id string) string {
	return tenant + "/" + session + "/" + kind + "/" + id
}

// Put stores data as a new artifact of the session.
func (s *Store) Put(ctx context.Context, tenant, session, kind, name, contentType string, data []byte) (Artifact, error) {
	sum := sha256.Sum256(data)
	a := Artifact{
		ID: newArtifactID(session), Session: session, Kind: kind, Name: name,
		Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), ContentType: contentType,
	}
	return s.put(ctx, tenant, a, bytes.NewReader(data), nil)
}

// PutFile stores a file as an artifact, reading it twice: once for its
// digest, once to upload. id may be empty (a new one is made) or a stable
// id from SegmentID, which makes a retried upload replace the same object.
func (s *Store) PutFile(ctx context.Context, tenant string, a Artifact, path string) (Artifact, error) {
	f, err := os.Open(path)
	if err != nil {
		return Artifact{}, err
	}
	defer f.Close()
	return s.PutFrom(ctx, tenant, a, f)
}

// PutFrom stores what f holds from its start, as PutFile does.
func (s *Store) PutFrom(ctx context.Context, tenant string, a Artifact, f io.ReadSeeker) (Artifact, error) {
	return s.putFrom(ctx, tenant, a, f, nil)
}

// PutNew is PutFrom for an artifact with a stable id (a.ID) that is
// stored once: ErrExists when the session has it already, which is kept
// as it is.
func (s *Store) PutNew(ctx context.Context, tenant string, a Artifact, f io.ReadSeeker) (Artifact, error) {
	absent := ""
	a, err := s.putFrom(ctx, tenant, a, f, &absent)
	var changed changedError
	switch {
	case errors.As(err, &changed) && changed.code == "PreconditionFailed":
		return Artifact{}, ErrExists
	case errors.As(err, &changed):
		// Another write of it under way (409), which may yet fail.
		return Artifact{}, fmt.Errorf("store artifact: %w: %s", errBusy, changed.code)
	}
	return a, err
}

// changedError is a conditional write that did not hold, with the
// store's code for why.
type changedError struct{ code string }

func (e changedError) Error() string {
	return "store artifact: " + ErrChanged.Error() + " (" + e.code + ")"
}
func (e changedError) Is(target error) bool { return target == ErrChanged }

// errBusy: the store could not take the write now.
var errBusy = errors.New("the store is busy with the same artifact")

// Unavailable says whether err is the store's not answering, or
// answering that it cannot now (a 5xx, a write of the same artifact
// under way): a later try may succeed. Errors in what was to be stored
// are not, nor any other the HTTP client gives (it wraps the body's own
// errors, and those of a body longer than declared): a caller that
// reads its own data tells those apart first.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, errBusy) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // the connection's own error, if it was one
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return true // the store went away mid-answer
		}
	}
	var oe *net.OpError
	var ne net.Error
	if errors.As(err, &oe) || (errors.As(err, &ne) && ne.Timeout()) {
		return true
	}
	r := minio.ToErrorResponse(err)
	return r.StatusCode >= 500 || r.Code == "SlowDown" || r.Code == "ServiceUnavailable" || r.Code == "XMinioServerNotInitialized"
}

// ValidName says whether the store takes n as an artifact's name.
func ValidName(n string) bool { return validName(n) }

// ErrExists: the artifact PutNew was to store is there already.
var ErrExists = errors.New("the artifact is stored already")

// Has says whether the session has the artifact of that kind and id.
func (s *Store) Has(ctx context.Context, tenant, session, kind, id string) (bool, error) {
	if !tenantChars.MatchString(tenant) || !ids.IsSession(session) || !idPattern.MatchString(id) {
		return false, fmt.Errorf("recordings: bad tenant, session or id")
	}
	_, err := s.client.StatObject(ctx, s.cfg.Bucket, key(tenant, session, kind, id), minio.StatObjectOptions{})
	if minio.ToErrorResponse(err).Code == "NoSuchKey" {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat artifact: %w", err)
	}
	return true, nil
}

// DownloadID is the stable id of a session's download, from the
// browser's id for it: a download stored twice (found again by a
// gateway that restarted) is one artifact.
func DownloadID(session, guid string) string { return SegmentID(session, "download/"+guid) }

func (s *Store) putFrom(ctx context.Context, tenant string, a Artifact, f io.ReadSeeker, match *string) (Artifact, error) {
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return Artifact{}, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Artifact{}, err
	}
	if a.ID == "" {
		a.ID = newArtifactID(a.Session)
	}
	a.Size, a.SHA256 = n, hex.EncodeToString(h.Sum(nil))
	return s.put(ctx, tenant, a, f, match)
}

// SegmentID is the stable artifact id of a named piece of a session's
// recording.
func SegmentID(session, name string) string {
	sum := sha256.Sum256([]byte(session + "/" + name))
	return session + "." + hex.EncodeToString(sum[:8])
}

// put stores a; with match, only if the stored artifact still has that
// ETag, or is still absent when match is "" (else ErrChanged).
func (s *Store) put(ctx context.Context, tenant string, a Artifact, r io.Reader, match *string) (Artifact, error) {
	if !tenantChars.MatchString(tenant) || !ids.IsSession(a.Session) || !validName(a.Name) || !idPattern.MatchString(a.ID) {
		return Artifact{}, fmt.Errorf("recordings: bad tenant, session, id or name")
	}
	if a.CreatedAt.IsZero() {
		a.CreatedAt = time.Now().UTC()
	}
	a.CreatedAt = a.CreatedAt.UTC().Truncate(time.Millisecond)
	meta := map[string]string{
		// Metadata travels in headers: names are escaped to ASCII.
		"Sandgate-Name":    url.PathEscape(a.Name),
		"Sandgate-Sha256":  a.SHA256,
		"Sandgate-Created": a.CreatedAt.Format(time.RFC3339Nano),
	}
	if a.SourceURL != "" {
		meta["Sandgate-Source"] = url.PathEscape(a.SourceURL)
	}
	opts := minio.PutObjectOptions{
		ContentType:        a.ContentType,
		ContentDisposition: mime.FormatMediaType("attachment", map[string]string{"filename": a.Name}),
		UserMetadata:       meta,
		SendContentMd5:     true,
	}
	switch {
	case match == nil:
	case *match == "":
		opts.SetMatchETagExcept("*")
	default:
		opts.SetMatchETag(*match)
	}
	_, err := s.client.PutObject(ctx, s.cfg.Bucket, key(tenant, a.Session, a.Kind, a.ID), r, a.Size, opts)
	if code := minio.ToErrorResponse(err).Code; match != nil && (code == "PreconditionFailed" || code == "NoSuchKey" || code == "ConditionalRequestConflict") {
		// Written, or removed, since it was read.
		return Artifact{}, changedError{code}
	}
	if err != nil {
		return Artifact{}, fmt.Errorf("store artifact: %w", err)
	}
	return a, nil
}

// Update rewrites one of a session's artifacts that has a stable id
// (a.ID) from what it holds. change gets the stored bytes (nil when
// there are none), read up to max (ErrTooLarge past it), and returns the
// new ones, or false to leave the artifact as it is. The write holds
// only if the artifact is still as it was read (its ETag, or its
// absence): of two writers at once, the one that loses reads again and
// changes that, so neither loses the other's change. The stored
// artifact's creation time is kept.
func (s *Store) Update(ctx context.Context, tenant string, a Artifact, max int64, change func(old []byte) ([]byte, bool)) error {
	if !tenantChars.MatchString(tenant) || !ids.IsSession(a.Session) || !idPattern.MatchString(a.ID) {
		return fmt.Errorf("recordings: bad tenant, session or id")
	}
	created := a.CreatedAt
	for try := 0; try < updateTries; try++ {
		if try > 0 {
			// Writers that lost a race to one another step apart.
			t := time.NewTimer(time.Duration(try) * time.Duration(1+mrand.Int64N(int64(5*time.Millisecond))))
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("store artifact: %w", ctx.Err())
			case <-t.C:
			}
		}
		old, prev, etag, err := s.read(ctx, tenant, a.Session, a.Kind, a.ID, max)
		switch {
		case errors.Is(err, ErrNotFound):
			etag = "" // written only if it is still absent
			a.CreatedAt = created
		case err != nil:
			return err
		default:
			a.CreatedAt = prev.CreatedAt
		}
		data, ok := change(old)
		if !ok {
			return nil
		}
		sum := sha256.Sum256(data)
		a.Size, a.SHA256 = int64(len(data)), hex.EncodeToString(sum[:])
		_, err = s.put(ctx, tenant, a, bytes.NewReader(data), &etag)
		if !errors.Is(err, ErrChanged) {
			return err
		}
	}
	return fmt.Errorf("store artifact: %w (%d times)", ErrChanged, updateTries)
}

// updateTries bounds how often an Update reads again after losing a race.
const updateTries = 8

// ErrChanged: an artifact changed between an Update's read and its write.
var ErrChanged = errors.New("the artifact changed while it was being updated")

// read is an artifact whose kind and id the caller knows, up to max
// bytes, with its record and ETag; ErrNotFound when there is none. The
// bytes, the record and the ETag come from one GET. (minio-go's Object
// would not do: its Stat before a read is a HEAD of its own, and the
// GET after it asks for the HEAD's ETag, so a write between the two
// failed the read; its Stat after a read gives what is left to read as
// the size, or fails on an answer without a Content-Length.)
func (s *Store) read(ctx context.Context, tenant, session, kind, id string, max int64) ([]byte, Artifact, string, error) {
	body, info, _, err := minio.Core{Client: s.client}.GetObject(ctx, s.cfg.Bucket, key(tenant, session, kind, id), minio.GetObjectOptions{})
	if err != nil {
		return nil, Artifact{}, "", readErr(err)
	}
	defer body.Close()
	raw, err := io.ReadAll(io.LimitReader(body, max+1))
	if err != nil {
		return nil, Artifact{}, "", readErr(err)
	}
	if int64(len(raw)) > max {
		return nil, Artifact{}, "", fmt.Errorf("read artifact: %w (%d bytes)", ErrTooLarge, max)
	}
	return raw, artifactOf(session, info), info.ETag, nil
}

// readErr is ErrNotFound for an artifact that is not there, else err.
func readErr(err error) error {
	if minio.ToErrorResponse(err).Code == "NoSuchKey" {
		return ErrNotFound
	}
	return fmt.Errorf("read artifact: %w", err)
}

// Fetch copies an artifact's bytes to w.
func (s *Store) Fetch(ctx context.Context, tenant, id string, w io.Writer) error {
	_, k, err := s.Find(ctx, tenant, id)
	if err != nil {
		return err
	}
	obj, err := s.client.GetObject(ctx, s.cfg.Bucket, k, minio.GetObjectOptions{})
	if err != nil {
		return err
	}
	defer obj.Close()
	_, err = io.Copy(w, obj)
	return err
}

// Delete removes one of the tenant's artifacts.
func (s *Store) Delete(ctx context.Context, tenant, id string) error {
	_, k, err := s.Find(ctx, tenant, id)
	if err != nil {
		return err
	}
	return s.client.RemoveObject(ctx, s.cfg.Bucket, k, minio.RemoveObjectOptions{})
}

// Expire removes the tenant's artifacts created before cutoff and returns
// how many went.
func (s *Store) Expire(ctx context.Context, tenant string, cutoff time.Time) (int, error) {
	if !tenantChars.MatchString(tenant) {
		return 0, ErrNotFound
	}
	n := 0
	for obj := range s.client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: tenant + "/", Recursive: true, WithMetadata: true}) {
		if obj.Err != nil {
			return n, fmt.Errorf("list artifacts: %w", obj.Err)
		}
		parts := strings.Split(obj.Key, "/")
		if len(parts) != 4 {
			continue
		}
		if artifactOf(parts[1], obj).CreatedAt.Before(cutoff) {
			if err := s.client.RemoveObject(ctx, s.cfg.Bucket, obj.Key, minio.RemoveObjectOptions{}); err != nil {
				return n, fmt.Errorf("remove %s: %w", obj.Key, err)
			}
			n++
		}
	}
	return n, nil
}

// TenantBytes sums what the tenant's artifacts take in the store.
func (s *Store) TenantBytes(ctx context.Context, tenant string) (int64, error) {
	if !tenantChars.MatchString(tenant) {
		return 0, ErrNotFound
	}
	var n int64
	for obj := range s.client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: tenant + "/", Recursive: true}) {
		if obj.Err != nil {
			return n, fmt.Errorf("list artifacts: %w", obj.Err)
		}
		n += obj.Size
	}
	return n, nil
}

// List returns the session's artifacts, oldest first.
func (s *Store) List(ctx context.Context, tenant, session string) ([]Artifact, error) {
	if !tenantChars.MatchString(tenant) || !ids.IsSession(session) {
		return nil, ErrNotFound
	}
	out := []Artifact{}
	for obj := range s.client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{
		Prefix: tenant + "/" + session + "/", Recursive: true, WithMetadata: true,
	}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("list artifacts: %w", obj.Err)
		}
		out = append(out, artifactOf(session, obj))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

func artifactOf(session string, obj minio.ObjectInfo) Artifact {
	parts := strings.Split(obj.Key, "/")
	meta := func(k string) string {
		for mk, v := range obj.UserMetadata {
			if strings.EqualFold(strings.TrimPrefix(strings.ToLower(mk), "x-amz-meta-"), k) {
				return v
			}
		}
		return ""
	}
	a := Artifact{
		ID: parts[len(parts)-1], Session: session, Kind: parts[len(parts)-2], Size: obj.Size,
		Name: meta("sandgate-name"), SHA256: meta("sandgate-sha256"), ContentType: obj.ContentType,
	}
	if t, err := time.Parse(time.RFC3339Nano, meta("sandgate-created")); err == nil {
		a.CreatedAt = t
	} else {
		a.CreatedAt = obj.LastModified
	}
	if a.ContentType == "" {
		a.ContentType = meta("content-type")
	}
	if src, err := url.PathUnescape(meta("sandgate-source")); err == nil {
		a.SourceURL = src
	}
	if name, err := url.PathUnescape(a.Name); err == nil {
		a.Name = name
	}
	return a
}

// Find returns one artifact of the tenant.
func (s *Store) Find(ctx context.Context, tenant, id string) (Artifact, string, error) {
	m := idPattern.FindStringSubmatch(id)
	if m == nil || !tenantChars.MatchString(tenant) {
		return Artifact{}, "", ErrNotFound
	}
	for obj := range s.client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{
		Prefix: tenant + "/" + m[1] + "/", Recursive: true, WithMetadata: true,
	}) {
		if obj.Err != nil {
			return Artifact{}, "", fmt.Errorf("find artifact: %w", obj.Err)
		}
		if strings.HasSuffix(obj.Key, "/"+id) {
			return artifactOf(m[1], obj), obj.Key, nil
		}
	}
	return Artifact{}, "", ErrNotFound
}

// Open is the store at cfg without a word to MinIO: Ready says when it
// answers (an error is a config that names no store).
func Open(cfg Config) (*Store, error) {
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure: cfg.Secure,
	})
	if err != nil {
		return nil, fmt.Errorf("minio client: %w", err)
	}
	if cfg.PresignTTL <= 0 {
		cfg.PresignTTL = 5 * time.Minute
	}
	return &Store{client: c, cfg: cfg}, nil
}

// Ready tells whether MinIO answers and the bucket is there.
func (s *Store) Ready(ctx context.Context) error {
	ok, err := s.client.BucketExists(ctx, s.cfg.Bucket)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("bucket %s is missing", s.cfg.Bucket)
	}
	return nil
}

// PresignedURL returns a short-lived URL serving the tenant's artifact.
func (s *Store) PresignedURL(ctx context.Context, tenant, id string) (*url.URL, error) {
	_, k, err := s.Find(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return s.client.PresignedGetObject(ctx, s.cfg.Bucket, k, s.cfg.PresignTTL, nil)
}

// ListKind returns the session's artifacts of one kind, oldest first.
func (s *Store) ListKind(ctx context.Context, tenant, session, kind string) ([]Artifact, error) {
	all, err := s.List(ctx, tenant, session)
	if err != nil {
		return nil, err
	}
	var out []Artifact
	for _, a := range all {
		if a.Kind == kind {
			out = append(out, a)
		}
	}
	return out, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Audit trails of running sessions are kept as pieces under a prefix no
// tenant name can take ("~" is not in tenantChars): they are the
// gateway's, not artifacts, until the session's log artifact replaces
// them.
const (
	trailPrefix   = "~trails/"
	maxTrailPiece = 64 << 20
)

func trailKey(tenant, session string, start int) string {
	return fmt.Sprintf("%s%s/%s/%010d.jsonl", trailPrefix, tenant, session, start)
}

func validTrail(tenant, session string) bool {
	return tenantChars.MatchString(tenant) && ids.IsSession(session)
}

// PutTrail stores the piece of a session's audit trail that starts at
// event start (session.TrailStore).
func (s *Store) PutTrail(ctx context.Context, tenant, session string, start int, lines []byte) error {
	return s.PutScopedTrail(ctx, tenant, session, "", start, lines)
}

// trailScopeMeta is the user metadata that marks a trail piece with the
// scope of the gateway that wrote it; the listing reads it back.
const trailScopeMeta = "Sandgate-Scope"

// validScope: a scope mark is a tag (session.Manager.scopeTag): 16 hex
// digits.
var validScope = regexp.MustCompile(`^[0-9a-f]{16}$`)

// PutScopedTrail is PutTrail, the piece marked with scope ("": none),
// which Trails reports (session.TrailLister).
func (s *Store) PutScopedTrail(ctx context.Context, tenant, session, scope string, start int, lines []byte) error {
	if !validTrail(tenant, session) || start < 0 || len(lines) > maxTrailPiece || scope != "" && !validScope.MatchString(scope) {
		return fmt.Errorf("recordings: bad tenant, session, scope or trail piece")
	}
	opts := minio.PutObjectOptions{ContentType: "application/x-ndjson", SendContentMd5: true}
	if scope != "" {
		opts.UserMetadata = map[string]string{trailScopeMeta: scope}
	}
	_, err := s.client.PutObject(ctx, s.cfg.Bucket, trailKey(tenant, session, start), bytes.NewReader(lines), int64(len(lines)), opts)
	if err != nil {
		return fmt.Errorf("store audit trail piece: %w", err)
	}
	return nil
}

// ReadTrail calls each with the session's trail pieces in order of their
// start, each read at most maxTrailPiece bytes (session.TrailStore).
func (s *Store) ReadTrail(ctx context.Context, tenant, session string, each func(start int, r io.Reader) error) error {
	if !validTrail(tenant, session) {
		return ErrNotFound
	}
	prefix := trailPrefix + tenant + "/" + session + "/"
	type piece struct {
		start int
		key   string
	}
	var pieces []piece
	for obj := range s.client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return fmt.Errorf("list audit trail pieces: %w", obj.Err)
		}
		var start int
		name := strings.TrimPrefix(obj.Key, prefix)
		if len(name) != len("0000000000.jsonl") {
			continue
		}
		if _, err := fmt.Sscanf(name, "%010d.jsonl", &start); err != nil {
			continue
		}
		pieces = append(pieces, piece{start, obj.Key})
	}
	sort.Slice(pieces, func(i, j int) bool { return pieces[i].start < pieces[j].start })
	for _, p := range pieces {
		obj, err := s.client.GetObject(ctx, s.cfg.Bucket, p.key, minio.GetObjectOptions{})
		if err != nil {
			return fmt.Errorf("read audit trail piece: %w", err)
		}
		err = each(p.start, io.LimitReader(obj, maxTrailPiece))
		obj.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// Trails calls each with the tenant and session of every trail the store
// holds pieces of, once each, with the scope its pieces are marked with
// (PutScopedTrail: the mark all of them carry; "" when one carries none,
// or they differ, as when a host that lost its scope adopted the
// session) and when its newest piece was written, until each returns
// false (session.TrailLister). Keys that are not a trail's are skipped.
func (s *Store) Trails(ctx context.Context, each func(tenant, session, scope string, newest time.Time) bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the listing when each stops early
	var tenant, session, scope string
	var newest time.Time
	opts := minio.ListObjectsOptions{Prefix: trailPrefix, Recursive: true, WithMetadata: true}
	for obj := range s.client.ListObjects(ctx, s.cfg.Bucket, opts) {
		if obj.Err != nil {
			return fmt.Errorf("list audit trail pieces: %w", obj.Err)
		}
		parts := strings.Split(strings.TrimPrefix(obj.Key, trailPrefix), "/")
		if len(parts) != 3 || !validTrail(parts[0], parts[1]) {
			continue
		}
		mark := pieceScope(obj.UserMetadata)
		// Listed in key order: a session's pieces come together.
		if parts[0] != tenant || parts[1] != session {
			if session != "" && !each(tenant, session, scope, newest) {
				return nil
			}
			tenant, session, scope, newest = parts[0], parts[1], mark, time.Time{}
		}
		if mark != scope {
			scope = ""
		}
		if obj.LastModified.After(newest) {
			newest = obj.LastModified
		}
	}
	if session != "" {
		each(tenant, session, scope, newest)
	}
	return nil
}

// pieceScope is the scope mark in a listed piece's metadata ("" when it
// has none, or none well formed). The listing names user metadata with
// or without its X-Amz-Meta- prefix, in any case.
func pieceScope(meta map[string]string) string {
	for k, v := range meta {
		k = strings.TrimPrefix(strings.ToLower(k), "x-amz-meta-")
		if k == strings.ToLower(trailScopeMeta) && validScope.MatchString(v) {
			return v
		}
	}
	return ""
}

// DropTrail removes a session's trail pieces (session.TrailStore).
func (s *Store) DropTrail(ctx context.Context, tenant, session string) error {
	if !validTrail(tenant, session) {
		return ErrNotFound
	}
	prefix := trailPrefix + tenant + "/" + session + "/"
	for obj := range s.client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return fmt.Errorf("list audit trail pieces: %w", obj.Err)
		}
		if err := s.client.RemoveObject(ctx, s.cfg.Bucket, obj.Key, minio.RemoveObjectOptions{}); err != nil {
			return fmt.Errorf("remove audit trail piece: %w", err)
		}
	}
	return nil
}

// Revoked previews are kept as empty objects whose key says it all,
// ~revocations/<session>/<preview>.<until, unix seconds>, so that one
// listing reads them (session.RevocationStore).
const revocationPrefix = "~revocations/"

// PutRevocation stores a preview's revocation until its expiry.
func (s *Store) PutRevocation(ctx context.Context, session, preview string, until time.Time) error {
	if !ids.IsSession(session) || !ids.IsPreview(preview) {
		return fmt.Errorf("recordings: bad session or preview id")
	}
	k := fmt.Sprintf("%s%s/%s.%d", revocationPrefix, session, preview, until.Unix())
	if _, err := s.client.PutObject(ctx, s.cfg.Bucket, k, bytes.NewReader(nil), 0, minio.PutObjectOptions{}); err != nil {
		return fmt.Errorf("store revocation: %w", err)
	}
	return nil
}

// Revocations calls each with the stored revocations that hold at now,
// and removes those that do not (a failed removal is tried again at the
// next reading).
func (s *Store) Revocations(ctx context.Context, now time.Time, each func(session, preview string, until time.Time)) error {
	return s.revocations(ctx, now, true, each)
}

// revocations lists the stored revocations that hold at now; prune:
// and removes those that do not.
func (s *Store) revocations(ctx context.Context, now time.Time, prune bool, each func(session, preview string, until time.Time)) error {
	for obj := range s.client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: revocationPrefix, Recursive: true}) {
		if obj.Err != nil {
			return fmt.Errorf("list revocations: %w", obj.Err)
		}
		session, rest, ok := strings.Cut(strings.TrimPrefix(obj.Key, revocationPrefix), "/")
		preview, unix, ok2 := strings.Cut(rest, ".")
		sec, err := strconv.ParseInt(unix, 10, 64)
		if !ok || !ok2 || err != nil || !ids.IsSession(session) || !ids.IsPreview(preview) {
			continue
		}
		if until := time.Unix(sec, 0); until.After(now) {
			each(session, preview, until)
			continue
		}
		if prune {
			s.client.RemoveObject(ctx, s.cfg.Bucket, obj.Key, minio.RemoveObjectOptions{})
		}
	}
	return nil
}

// The gateway's tenant registries (tenant.Mirror), one per name (a
// Kubernetes namespace's gateways share one): no tenant's name starts
// with "~", so no tenant's listing reaches them.
const (
	tenantsPrefix   = "~tenants/"
	maxTenantsBytes = 64 << 20
)

func tenantsKey(name string) (string, error) {
	if !tenantChars.MatchString(name) {
		return "", fmt.Errorf("recordings: bad registry name %q", name)
	}
	return tenantsPrefix + name + ".json", nil
}

// ReadTenants reads the tenant registry stored under name; nil when
// there is none.
func (s *Store) ReadTenants(ctx context.Context, name string) ([]byte, error) {
	k, err := tenantsKey(name)
	if err != nil {
		return nil, err
	}
	obj, err := s.client.GetObject(ctx, s.cfg.Bucket, k, minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the tenant registry: %w", err)
	}
	defer obj.Close()
	raw, err := io.ReadAll(io.LimitReader(obj, maxTenantsBytes+1))
	if minio.ToErrorResponse(err).Code == "NoSuchKey" {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the tenant registry: %w", err)
	}
	if len(raw) > maxTenantsBytes {
		return nil, fmt.Errorf("the stored tenant registry is over %d bytes", maxTenantsBytes)
	}
	return raw, nil
}

// TenantsVersion is the version (ETag) of the tenant registry stored
// under name, "" when there is none: asking it costs a HEAD, not the
// registry's bytes.
func (s *Store) TenantsVersion(ctx context.Context, name string) (string, error) {
	k, err := tenantsKey(name)
	if err != nil {
		return "", err
	}
	st, err := s.client.StatObject(ctx, s.cfg.Bucket, k, minio.StatObjectOptions{})
	if minio.ToErrorResponse(err).Code == "NoSuchKey" {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("stat the tenant registry: %w", err)
	}
	return st.ETag, nil
}

// TenantsMirror keeps the tenant registry stored under Name (a
// Kubernetes namespace's gateways share one) in Store: a
// tenant.VersionedMirror.
type TenantsMirror struct {
	Store *Store
	Name  string
}

func (m TenantsMirror) ReadTenants(ctx context.Context) ([]byte, error) {
	return m.Store.ReadTenants(ctx, m.Name)
}

func (m TenantsMirror) WriteTenants(ctx context.Context, raw []byte) error {
	return m.Store.WriteTenants(ctx, m.Name, raw)
}

func (m TenantsMirror) TenantsVersion(ctx context.Context) (string, error) {
	return m.Store.TenantsVersion(ctx, m.Name)
}

// WriteTenants stores the tenant registry under name.
func (s *Store) WriteTenants(ctx context.Context, name string, raw []byte) error {
	k, err := tenantsKey(name)
	if err != nil {
		return err
	}
	if len(raw) > maxTenantsBytes {
		return fmt.Errorf("the tenant registry is over %d bytes", maxTenantsBytes)
	}
	_, err = s.client.PutObject(ctx, s.cfg.Bucket, k, bytes.NewReader(raw), int64(len(raw)),
		minio.PutObjectOptions{ContentType: "application/json", SendContentMd5: true})
	if err != nil {
		return fmt.Errorf("store the tenant registry: %w", err)
	}
	return nil
}
