// Package profile owns what sessions keep between runs on request:
// tenants' browser profiles, stored in MinIO sealed under a key derived
// from the vault key with the tenant, profile and version bound in,
// versioned with rollback; and the cleaning of the tars that carry
// profiles and workspace snapshots out of sessions.
package profile

import (
	"bytes"
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sandgate/sandgate/bucket"
)

// Error classes; messages wrapped around them are safe to show.
var (
	ErrNotFound = errors.New("profile not found")
	ErrInvalid  = errors.New("invalid profile request")
	// ErrChanged: the profile was changed or deleted by another (a
	// gateway replica) while this change was made; nothing was written.
	ErrChanged = errors.New("the profile was changed meanwhile; try again")
)

// Profile is what the API shows of a profile.
type Profile struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Current is the version a session starts with (0: none yet, a
	// fresh profile).
	Current  int       `json:"current_version"`
	Versions []Version `json:"versions"`
}

// Version is one saved state of a profile.
type Version struct {
	Version int `json:"version"`
	// Size and SHA256 are of the profile's tar; StoredBytes of the sealed
	// object.
	Size        int64     `json:"size"`
	SHA256      string    `json:"sha256"`
	StoredBytes int64     `json:"stored_bytes"`
	Files       int       `json:"files"`
	CreatedAt   time.Time `json:"created_at"`
	Session     string    `json:"session"` // the session that saved it
}

// Config says where profiles live and how many versions each keeps.
type Config struct {
	Endpoint  string
	AccessKey string
	SecretKey string
	Secure    bool
	Bucket    string
	// VaultKey is the vault's 32-byte key; profiles are sealed under a
	// key derived from it.
	VaultKey []byte
	// Keep is how many versions a profile keeps (default 5).
	Keep int
}

// Store keeps profiles: per profile a metadata object and one sealed
// object per version, under the tenant's prefix.
type Store struct {
	client  *minio.Client
	bucket  string
	key     []byte // seals versions
	metaKey []byte // MACs metadata
	keep    int
	mu      sync.Mutex
	locks   map[string]*profileLock // per profile: orders the read-modify-write of its metadata
}

type profileLock struct {
	sync.Mutex
	users int
}

// lock takes the profile's lock; the returned func releases it.
func (s *Store) lock(tenant, id string) func() {
	k := tenant + "/" + id
	s.mu.Lock()
	l := s.locks[k]
	if l == nil {
		l = &profileLock{}
		s.locks[k] = l
	}
	l.users++
	s.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		s.mu.Lock()
		if l.users--; l.users == 0 {
			delete(s.locks, k)
		}
		s.mu.Unlock()
	}
}

// Open connects to MinIO and creates the bucket if it is missing.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if len(cfg.VaultKey) != 32 {
		return nil, errors.New("profiles: the vault key must be 32 bytes")
	}
	key, err := hkdf.Key(sha256.New, cfg.VaultKey, nil, "sandgate profiles", 32)
	if err != nil {
		return nil, err
	}
	metaKey, err := hkdf.Key(sha256.New, cfg.VaultKey, nil, "sandgate profile metadata", 32)
	if err != nil {
		return nil, err
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 5
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""), Secure: cfg.Secure})
	if err != nil {
		return nil, fmt.Errorf("minio client: %w", err)
	}
	if err := bucket.Ensure(ctx, c, cfg.Endpoint, cfg.Bucket); err != nil {
		return nil, err
	}
	return &Store{client: c, bucket: cfg.Bucket, key: key, metaKey: metaKey, keep: cfg.Keep, locks: map[string]*profileLock{}}, nil
}

var (
	idPattern     = regexp.MustCompile(`^prof_[0-9a-f]{16}$`)
	tenantPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
)

// IsID tells whether s is a profile id.
func IsID(s string) bool { return idPattern.MatchString(s) }

func newID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "prof_" + hex.EncodeToString(b)
}

func metaKey(tenant, id string) string { return tenant + "/" + id + "/profile.json" }
func versionKey(tenant, id string, v int) string {
	return tenant + "/" + id + "/v" + strconv.Itoa(v) + ".sealed"
}
func bind(tenant, id string, v int) string {
	return tenant + "\x00" + id + "\x00" + strconv.Itoa(v)
}

// maxMeta bounds a metadata object read back.
const maxMeta = 1 << 20

func (s *Store) load(ctx context.Context, tenant, id string) (Profile, error) {
	p, _, err := s.loadTagged(ctx, tenant, id)
	return p, err
}

// loadTagged is load, with the metadata object's ETag: a change written
// back is conditional on it (write), so that what another gateway
// replica changed or deleted meanwhile is not overwritten; the lock
// (lock) only orders this process's changes.
func (s *Store) loadTagged(ctx context.Context, tenant, id string) (Profile, string, error) {
	if !IsID(id) || !tenantPattern.MatchString(tenant) {
		return Profile{}, "", ErrNotFound
	}
	obj, err := s.client.GetObject(ctx, s.bucket, metaKey(tenant, id), minio.GetObjectOptions{})
	if err != nil {
		return Profile{}, "", fmt.Errorf("read profile: %w", err)
	}
	defer obj.Close()
	raw, err := io.ReadAll(io.LimitReader(obj, maxMeta))
	if err != nil {
		if minio.ToErrorResponse(err).Code == "NoSuchKey" {
			return Profile{}, "", ErrNotFound
		}
		return Profile{}, "", fmt.Errorf("read profile: %w", err)
	}
	info, err := obj.Stat()
	if err == nil && info.ETag == "" {
		err = errors.New("the store gave no ETag")
	}
	if err != nil {
		return Profile{}, "", fmt.Errorf("read profile: %w", err)
	}
	var m storedMeta
	if err := json.Unmarshal(raw, &m); err != nil || !hmac.Equal([]byte(m.MAC), []byte(s.metaMAC(tenant, m.Profile))) {
		return Profile{}, "", fmt.Errorf("%w: the metadata of profile %s was altered", ErrTampered, id)
	}
	var p Profile
	if err := json.Unmarshal(m.Profile, &p); err != nil || p.ID != id {
		return Profile{}, "", fmt.Errorf("%w: the metadata of profile %s is another's", ErrTampered, id)
	}
	return p, info.ETag, nil
}

// storedMeta is a profile's metadata object: the profile and a MAC over
// it and its tenant, so that which versions exist and which is current
// cannot be changed in the store unnoticed. (A whole earlier state put
// back, metadata and objects together, still reads: that needs a counter
// kept outside the store.)
type storedMeta struct {
	Profile json.RawMessage `json:"profile"`
	MAC     string          `json:"mac"`
}

func (s *Store) metaMAC(tenant string, raw []byte) string {
	m := hmac.New(sha256.New, s.metaKey)
	m.Write([]byte("sandgate profile metadata v1\x00" + tenant + "\x00"))
	m.Write(raw)
	return hex.EncodeToString(m.Sum(nil))
}

// write stores a profile's metadata: a new profile's (match "", its id
// fresh), a changed one's only when the object is still the version
// match names (its ETag, loadTagged): ErrChanged when it was changed
// or deleted since, or when the client's own retry of a write that was
// stored found it so (the caller reads again to tell).
func (s *Store) write(ctx context.Context, tenant string, p Profile, match string) error {
	pr, err := json.Marshal(p)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(storedMeta{Profile: pr, MAC: s.metaMAC(tenant, pr)})
	if err != nil {
		return err
	}
	opts := minio.PutObjectOptions{ContentType: "application/json"}
	if match != "" {
		opts.SetMatchETag(match)
	}
	_, err = s.client.PutObject(ctx, s.bucket, metaKey(tenant, p.ID), bytes.NewReader(raw), int64(len(raw)), opts)
	switch minio.ToErrorResponse(err).Code {
	case "":
	case "PreconditionFailed", "NoSuchKey", "ConditionalRequestConflict":
		return fmt.Errorf("%w: profile %s", ErrChanged, p.ID)
	default:
		return fmt.Errorf("store profile: %w", err)
	}
	return nil
}

// Create makes a new, empty profile for the tenant.
func (s *Store) Create(ctx context.Context, tenant, name string) (Profile, error) {
	if name == "" || len(name) > 128 || strings.ContainsAny(name, "\x00\r\n") {
		return Profile{}, fmt.Errorf("%w: name must be 1-128 bytes without line breaks", ErrInvalid)
	}
	if !tenantPattern.MatchString(tenant) {
		return Profile{}, ErrNotFound
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	p := Profile{ID: newID(), Name: name, CreatedAt: now, UpdatedAt: now, Versions: []Version{}}
	return p, s.write(ctx, tenant, p, "")
}

// Get returns one of the tenant's profiles.
func (s *Store) Get(ctx context.Context, tenant, id string) (Profile, error) {
	return s.load(ctx, tenant, id)
}

// List returns the tenant's profiles, oldest first.
func (s *Store) List(ctx context.Context, tenant string) ([]Profile, error) {
	out := []Profile{}
	if !tenantPattern.MatchString(tenant) {
		return out, nil
	}
	for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: tenant + "/"}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("list profiles: %w", obj.Err)
		}
		id := strings.TrimSuffix(strings.TrimPrefix(obj.Key, tenant+"/"), "/")
		p, err := s.load(ctx, tenant, id)
		if err != nil {
			continue
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// Delete removes a profile and all its versions.
func (s *Store) Delete(ctx context.Context, tenant, id string) error {
	defer s.lock(tenant, id)()
	if _, err := s.load(ctx, tenant, id); err != nil {
		return err
	}
	// The metadata last, so that a failure before leaves a profile to
	// delete again.
	if err := s.removeVersions(ctx, tenant, id); err != nil {
		return err
	}
	if err := s.client.RemoveObject(ctx, s.bucket, metaKey(tenant, id), minio.RemoveObjectOptions{}); err != nil {
		return err
	}
	// A version another gateway replica stored meanwhile (its save-back
	// began before the metadata went): removed now, at best; one stored
	// after this finds no metadata, and its saver removes it.
	s.removeVersions(ctx, tenant, id)
	return nil
}

// removeVersions removes what is stored under a profile but its
// metadata.
func (s *Store) removeVersions(ctx context.Context, tenant, id string) error {
	for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: tenant + "/" + id + "/", Recursive: true}) {
		if obj.Err != nil {
			return fmt.Errorf("list profile: %w", obj.Err)
		}
		if obj.Key == metaKey(tenant, id) {
			continue
		}
		if err := s.client.RemoveObject(ctx, s.bucket, obj.Key, minio.RemoveObjectOptions{}); err != nil {
			return fmt.Errorf("remove version: %w", err)
		}
	}
	return nil
}

// Rollback makes an earlier kept version the current one.
func (s *Store) Rollback(ctx context.Context, tenant, id string, version int) (Profile, error) {
	defer s.lock(tenant, id)()
	p, tag, err := s.loadTagged(ctx, tenant, id)
	if err != nil {
		return Profile{}, err
	}
	found := version == 0
	for _, v := range p.Versions {
		found = found || v.Version == version
	}
	if !found {
		return Profile{}, fmt.Errorf("%w: version %d is not kept (kept: %s)", ErrInvalid, version, kept(p))
	}
	p.Current, p.UpdatedAt = version, time.Now().UTC().Truncate(time.Millisecond)
	return p, s.write(ctx, tenant, p, tag)
}

func kept(p Profile) string {
	var vs []string
	for _, v := range p.Versions {
		vs = append(vs, strconv.Itoa(v.Version))
	}
	if len(vs) == 0 {
		return "none"
	}
	return strings.Join(vs, ", ")
}

// Saver seals a new version of a profile into a file of the host's
// until Commit stores it; Abort (or a Commit that fails) removes the
// file. Nothing of the profile reaches the host's disk unsealed.
type Saver struct {
	s       *Store
	tenant  string
	id      string
	version int
	f       *os.File
	seal    *sealer
	hash    hashCounter
	w       io.Writer
}

type hashCounter struct {
	h interface {
		io.Writer
		Sum([]byte) []byte
	}
	n int64
}

func (h *hashCounter) Write(p []byte) (int, error) {
	h.n += int64(len(p))
	return h.h.Write(p)
}

// NewSaver begins a new version of one of the tenant's profiles; what is
// written to it is the profile's tar.
func (s *Store) NewSaver(ctx context.Context, tenant, id string) (*Saver, error) {
	p, err := s.load(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	next := 1
	for _, v := range p.Versions {
		next = max(next, v.Version+1)
	}
	f, err := os.CreateTemp("", "sandgate-profile-*.sealed")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name()) // gone with its last descriptor, whatever happens
	seal, err := newSealer(f, s.key, bind(tenant, id, next))
	if err != nil {
		f.Close()
		return nil, err
	}
	sv := &Saver{s: s, tenant: tenant, id: id, version: next, f: f, seal: seal, hash: hashCounter{h: sha256.New()}}
	sv.w = io.MultiWriter(seal, &sv.hash)
	return sv, nil
}

func (sv *Saver) Write(p []byte) (int, error) { return sv.w.Write(p) }

// Abort drops the version.
func (sv *Saver) Abort() { sv.f.Close() }

// Commit stores the version, makes it the current one, drops versions
// beyond the store's keep (never the current one) and returns it.
func (sv *Saver) Commit(ctx context.Context, session string, files int) (Version, error) {
	defer sv.f.Close()
	if err := sv.seal.Close(); err != nil {
		return Version{}, err
	}
	size, err := sv.f.Seek(0, io.SeekCurrent)
	if err != nil {
		return Version{}, err
	}
	if _, err := sv.f.Seek(0, io.SeekStart); err != nil {
		return Version{}, err
	}
	s := sv.s
	defer s.lock(sv.tenant, sv.id)()
	if _, err := s.load(ctx, sv.tenant, sv.id); err != nil {
		return Version{}, err // deleted meanwhile: nothing stored
	}
	if _, err := s.client.PutObject(ctx, s.bucket, versionKey(sv.tenant, sv.id, sv.version), sv.f, size,
		minio.PutObjectOptions{ContentType: "application/octet-stream"}); err != nil {
		return Version{}, fmt.Errorf("store profile version: %w", err)
	}
	v := Version{Version: sv.version, Size: sv.hash.n, SHA256: hex.EncodeToString(sv.hash.h.Sum(nil)), StoredBytes: size,
		Files: files, CreatedAt: time.Now().UTC().Truncate(time.Millisecond), Session: session}
	// The version made current by a write conditional on the metadata
	// read just before, read again when another replica changed it
	// meanwhile (a rollback, say); deleted meanwhile, nothing is kept.
	var drop []int
	for try := 0; ; try++ {
		p, tag, err := s.loadTagged(ctx, sv.tenant, sv.id)
		if i := slices.IndexFunc(p.Versions, func(k Version) bool { return k.Version == v.Version }); err == nil && i >= 0 {
			// Listed already: this write, stored though its answer was
			// lost (the client retried it), or another's of the same
			// number, whose object this one's has overwritten.
			if k := p.Versions[i]; k.SHA256 == v.SHA256 && k.Session == v.Session && k.CreatedAt.Equal(v.CreatedAt) {
				s.removeUnlisted(ctx, sv.tenant, p) // what that write dropped
				return k, nil
			}
			return Version{}, fmt.Errorf("%w: version %d of profile %s was saved by another", ErrChanged, v.Version, sv.id)
		}
		if err == nil {
			p.Versions = append(p.Versions, v)
			p.Current, p.UpdatedAt = v.Version, v.CreatedAt
			drop = nil
			for len(p.Versions) > s.keep {
				drop = append(drop, p.Versions[0].Version)
				p.Versions = p.Versions[1:]
			}
			err = s.write(ctx, sv.tenant, p, tag)
		}
		if err == nil {
			break
		}
		if !errors.Is(err, ErrChanged) || try == 2 {
			s.client.RemoveObject(ctx, s.bucket, versionKey(sv.tenant, sv.id, sv.version), minio.RemoveObjectOptions{})
			return Version{}, err
		}
	}
	for _, d := range drop {
		s.client.RemoveObject(ctx, s.bucket, versionKey(sv.tenant, sv.id, d), minio.RemoveObjectOptions{})
	}
	return v, nil
}

// removeUnlisted removes the version objects of p that its metadata no
// longer lists, numbered below the newest it lists (a version being
// saved now is numbered above it): those a write dropped and did not
// remove, its answer lost. Best effort: what is left is tried again by
// the next such write, or by the profile's delete.
func (s *Store) removeUnlisted(ctx context.Context, tenant string, p Profile) {
	newest := 0
	listed := map[int]bool{}
	for _, v := range p.Versions {
		listed[v.Version], newest = true, max(newest, v.Version)
	}
	prefix := tenant + "/" + p.ID + "/v"
	for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix}) {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(obj.Key, prefix), ".sealed"))
		if obj.Err == nil && err == nil && n < newest && !listed[n] && obj.Key == versionKey(tenant, p.ID, n) {
			s.client.RemoveObject(ctx, s.bucket, obj.Key, minio.RemoveObjectOptions{})
		}
	}
}

// Open returns the current version of one of the tenant's profiles and a
// reader of its tar, which fails with ErrTampered where the stored
// object does not open; version 0 (none saved yet) reads as an empty
// tar. The reader's bytes are authenticated chunk by chunk; Verify
// checks a whole version before anything of it is used.
func (s *Store) Open(ctx context.Context, tenant, id string) (Version, io.ReadCloser, error) {
	p, err := s.load(ctx, tenant, id)
	if err != nil {
		return Version{}, nil, err
	}
	if p.Current == 0 {
		return Version{}, io.NopCloser(bytes.NewReader(make([]byte, 1024))), nil // two zero blocks: an empty tar
	}
	var v Version
	for _, x := range p.Versions {
		if x.Version == p.Current {
			v = x
		}
	}
	if v.Version == 0 {
		return Version{}, nil, fmt.Errorf("%w: version %d of profile %s is not kept", ErrTampered, p.Current, id)
	}
	obj, err := s.client.GetObject(ctx, s.bucket, versionKey(tenant, id, v.Version), minio.GetObjectOptions{})
	if err != nil {
		return Version{}, nil, err
	}
	o, err := newOpener(obj, s.key, bind(tenant, id, v.Version))
	if err != nil {
		obj.Close()
		if minio.ToErrorResponse(err).Code == "NoSuchKey" {
			return Version{}, nil, fmt.Errorf("%w: version %d of profile %s is missing from the store", ErrTampered, v.Version, id)
		}
		return Version{}, nil, err
	}
	return v, &checked{r: o, c: obj, h: sha256.New(), want: v.SHA256, size: v.Size}, nil
}

// Verify reads the current version of one of the tenant's profiles whole
// and returns it, or ErrTampered where it does not open.
func (s *Store) Verify(ctx context.Context, tenant, id string) (Version, error) {
	v, r, err := s.Open(ctx, tenant, id)
	if err != nil {
		return Version{}, err
	}
	defer r.Close()
	if _, err := io.Copy(io.Discard, r); err != nil {
		return Version{}, err
	}
	return v, nil
}

// checked reads an opened version and, at its end, holds it to the size
// and digest its metadata records.
type checked struct {
	r io.Reader
	c io.Closer
	h interface {
		io.Writer
		Sum([]byte) []byte
	}
	n    int64
	want string
	size int64
}

func (c *checked) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	if errors.Is(err, io.EOF) && (c.n != c.size || hex.EncodeToString(c.h.Sum(nil)) != c.want) {
		return n, fmt.Errorf("%w: its contents do not match its recorded digest", ErrTampered)
	}
	return n, err
}

func (c *checked) Close() error { return c.c.Close() }

// TenantBytes sums what the tenant's profiles take in the store.
func (s *Store) TenantBytes(ctx context.Context, tenant string) (int64, error) {
	return tenantBytes(ctx, s.client, s.bucket, tenant)
}

// Counter counts what tenants' profiles take in the store, and does
// nothing else (it holds no key): what a gateway replica that takes
// no profiles' versions counts against a tenant's quota.
type Counter struct {
	client *minio.Client
	bucket string
}

// NewCounter makes a Counter of cfg's bucket (its VaultKey and Keep
// are not used); it asks nothing of MinIO until it counts.
func NewCounter(cfg Config) (*Counter, error) {
	c, err := minio.New(cfg.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""), Secure: cfg.Secure})
	if err != nil {
		return nil, fmt.Errorf("minio client: %w", err)
	}
	return &Counter{client: c, bucket: cfg.Bucket}, nil
}

// TenantBytes is Store.TenantBytes.
func (c *Counter) TenantBytes(ctx context.Context, tenant string) (int64, error) {
	return tenantBytes(ctx, c.client, c.bucket, tenant)
}

func tenantBytes(ctx context.Context, client *minio.Client, bucket, tenant string) (int64, error) {
	if !tenantPattern.MatchString(tenant) {
		return 0, nil
	}
	var n int64
	for obj := range client.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: tenant + "/", Recursive: true}) {
		if obj.Err != nil {
			return n, fmt.Errorf("list profiles: %w", obj.Err)
		}
		n += obj.Size
	}
	return n, nil
}

// Expire removes the tenant's profile versions saved before cutoff,
// except each profile's current one, and returns how many went.
func (s *Store) Expire(ctx context.Context, tenant string, cutoff time.Time) (int, error) {
	ps, err := s.List(ctx, tenant)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range ps {
		unlock := s.lock(tenant, p.ID)
		m, err := s.expireOne(ctx, tenant, p.ID, cutoff)
		unlock()
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// expireOne is Expire for one profile, under its lock.
func (s *Store) expireOne(ctx context.Context, tenant, id string, cutoff time.Time) (int, error) {
	p, tag, err := s.loadTagged(ctx, tenant, id)
	if err != nil {
		return 0, nil // deleted meanwhile, or unreadable: nothing to expire
	}
	var keep, drop []Version
	for _, v := range p.Versions {
		if v.Version != p.Current && v.CreatedAt.Before(cutoff) {
			drop = append(drop, v)
		} else {
			keep = append(keep, v)
		}
	}
	if len(drop) == 0 {
		return 0, nil
	}
	p.Versions = keep
	if p.Versions == nil {
		p.Versions = []Version{}
	}
	if err := s.write(ctx, tenant, p, tag); errors.Is(err, ErrChanged) {
		// Changed meanwhile (the next round looks again), or this write
		// stored though its answer was lost: what it dropped goes.
		if now, err := s.load(ctx, tenant, id); err == nil {
			s.removeUnlisted(ctx, tenant, now)
		}
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	n := 0
	for _, v := range drop {
		if err := s.client.RemoveObject(ctx, s.bucket, versionKey(tenant, p.ID, v.Version), minio.RemoveObjectOptions{}); err == nil {
			n++
		}
	}
	return n, nil
}

// Ready tells whether MinIO answers and the bucket is there.
func (s *Store) Ready(ctx context.Context) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("bucket %s is missing", s.bucket)
	}
	return nil
}
