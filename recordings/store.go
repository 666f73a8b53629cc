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
	"net/url"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// ErrNotFound: no such artifact for this tenant.
var ErrNotFound = errors.New("artifact not found")

// Kinds of artifacts.
const (
	KindScreenshot = "screenshot"
	KindDownload   = "download"
	KindRecording  = "recording"
	KindLog        = "log"
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
	s := &Store{client: c, cfg: cfg}
	ok, err := c.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("minio at %s: %w", cfg.Endpoint, err)
	}
	if !ok {
		if err := c.MakeBucket(ctx, cfg.Bucket, minio.MakeBucketOptions{}); err != nil {
			return nil, fmt.Errorf("create bucket %s: %w", cfg.Bucket, err)
		}
	}
	return s, nil
}

var (
	idPattern   = regexp.MustCompile(`^(s-[0-9a-f]{16})\.[0-9a-f]{16}$`)
	namePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
	sessPattern = regexp.MustCompile(`^s-[0-9a-f]{16}$`)
	tenantChars = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
)

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
	if !tenantChars.MatchString(tenant) || !sessPattern.MatchString(session) || !namePattern.MatchString(name) {
		return Artifact{}, fmt.Errorf("recordings: bad tenant, session or name")
	}
	sum := sha256.Sum256(data)
	a := Artifact{
		ID: newArtifactID(session), Session: session, Kind: kind, Name: name,
		Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), ContentType: contentType,
		CreatedAt: time.Now().UTC().Truncate(time.Millisecond),
	}
	_, err := s.client.PutObject(ctx, s.cfg.Bucket, key(tenant, session, kind, a.ID), bytes.NewReader(data), a.Size, minio.PutObjectOptions{
		ContentType:        contentType,
		ContentDisposition: fmt.Sprintf("attachment; filename=%q", name),
		UserMetadata: map[string]string{
			"Sandgate-Name":    name,
			"Sandgate-Sha256":  a.SHA256,
			"Sandgate-Created": a.CreatedAt.Format(time.RFC3339Nano),
		},
		SendContentMd5: true,
	})
	if err != nil {
		return Artifact{}, fmt.Errorf("store artifact: %w", err)
	}
	return a, nil
}

// List returns the session's artifacts, oldest first.
func (s *Store) List(ctx context.Context, tenant, session string) ([]Artifact, error) {
	if !tenantChars.MatchString(tenant) || !sessPattern.MatchString(session) {
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
