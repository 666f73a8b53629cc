// Package vault owns tenants' credentials for QA test accounts: stored in
// MinIO sealed with AES-256-GCM under a key from the gateway's config,
// write-only through the API (metadata comes back, the secret never does),
// and opened only for the egress proxy and the fill_credential action.
package vault

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sandgate/sandgate/bucket"
	"github.com/sandgate/sandgate/ids"
)

// Error classes; messages wrapped around them are safe to show.
var (
	ErrNotFound = errors.New("credential not found")
	ErrInvalid  = errors.New("invalid credential")
	// errGarbled: an object in the vault's bucket that is no credential.
	errGarbled = errors.New("credential object is not one")
)

// Kinds of credential, matching how the egress proxy applies them.
const (
	KindBasic  = "basic"
	KindBearer = "bearer"
	KindHeader = "header"
	KindCookie = "cookie"
	// KindForm is a username and secret for login forms only: the proxy
	// adds nothing to headers for it; fill_credential types the username
	// and the session's placeholder, which the proxy swaps for the secret
	// in requests to the bound destinations.
	KindForm = "form"
)

// Meta is what the API shows of a credential: everything but the secret.
type Meta struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Kind      string `json:"kind"`
	Username  string `json:"username,omitempty"`
	FieldName string `json:"field_name,omitempty"` // header or cookie name
	// Destinations are where the credential may go: a session binds it
	// only within one of them. They are sealed with the secret and never
	// change: whoever may bind the credential may not widen where it
	// goes, which would hand it the secret.
	Destinations []Destination `json:"destinations"`
	// AllowValueFill lets a binding type the secret itself into a page
	// (fill "value"), where the session's agent can read it.
	AllowValueFill bool      `json:"allow_value_fill,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
}

// Destination is where a credential may be sent: a scheme, a host (or a
// wildcard "*.example.com"), a port (the scheme's when 0) and a path
// prefix ("/" when empty).
type Destination struct {
	Scheme     string `json:"scheme"`
	Host       string `json:"host"`
	Port       uint16 `json:"port,omitempty"`
	PathPrefix string `json:"path_prefix,omitempty"`
}

// MaxDestinations bounds a credential's destinations.
const MaxDestinations = 16

// New is a credential to store. The caller checks the destinations'
// form (the gateway, with the egress rules); Create checks that there
// are some.
type New struct {
	Name           string        `json:"name"`
	Kind           string        `json:"kind"`
	Username       string        `json:"username"`
	FieldName      string        `json:"field_name"`
	Secret         string        `json:"secret"`
	Destinations   []Destination `json:"destinations"`
	AllowValueFill bool          `json:"allow_value_fill"`
}

// Opened is a credential with its secret, for the proxy and actions only.
type Opened struct {
	Meta
	Secret string
}

// sealed is the stored object.
type sealed struct {
	Meta
	Nonce      []byte `json:"nonce"`
	Ciphertext []byte `json:"ciphertext"`
}

// Config says where credentials live and how they are sealed.
type Config struct {
	Endpoint  string
	AccessKey string
	SecretKey string
	Secure    bool
	Bucket    string
	Key       []byte // 32 bytes
}

// Vault stores credentials in their own bucket, one object per credential
// under the tenant's prefix.
type Vault struct {
	client *minio.Client
	bucket string
	aead   cipher.AEAD
	phKey  []byte // placeholder key, derived from the vault key
}

// Open connects to MinIO and creates the bucket if it is missing.
func Open(ctx context.Context, cfg Config) (*Vault, error) {
	if len(cfg.Key) != 32 {
		return nil, errors.New("vault key must be 32 bytes")
	}
	block, err := aes.NewCipher(cfg.Key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""), Secure: cfg.Secure})
	if err != nil {
		return nil, fmt.Errorf("minio client: %w", err)
	}
	if err := bucket.Ensure(ctx, c, cfg.Endpoint, cfg.Bucket); err != nil {
		return nil, err
	}
	phKey, err := placeholderKey(cfg.Key)
	if err != nil {
		return nil, err
	}
	return &Vault{client: c, bucket: cfg.Bucket, aead: aead, phKey: phKey}, nil
}

// placeholderLabel versions the derivation: changing it changes every
// placeholder.
const placeholderLabel = "sandgate placeholder v1"

func placeholderKey(vaultKey []byte) ([]byte, error) {
	return hkdf.Key(sha256.New, vaultKey, nil, placeholderLabel, 32)
}

// Placeholder returns what fill_credential types into a page instead of
// a credential's secret in a session: "sgph_" and 32 lower-case hex
// digits, an HMAC-SHA256 of the session and credential ids under a key
// derived from the vault key. The same for the same session and
// credential (across restarts), different for any other, and not
// guessable without the vault key. The egress proxy swaps it for the
// secret in requests to the credential's bound destinations.
func (v *Vault) Placeholder(sessionID, credentialID string) string {
	return placeholder(v.phKey, sessionID, credentialID)
}

func placeholder(key []byte, sessionID, credentialID string) string {
	m := hmac.New(sha256.New, key)
	// Ids are fixed-alphabet tokens; the NULs keep the fields apart
	// whatever they hold.
	m.Write([]byte(placeholderLabel + "\x00" + sessionID + "\x00" + credentialID))
	return "sgph_" + hex.EncodeToString(m.Sum(nil)[:16])
}

var (
	namePattern = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_|~-]{1,64}$`) // an HTTP token
)

func key(tenant, id string) string { return tenant + "/" + id + ".json" }

// additional data binds the ciphertext to its tenant, id and use, so a
// sealed secret moved elsewhere does not open.
func aad(tenant string, m Meta) []byte {
	parts := []string{"sandgate-vault-v1", tenant, m.ID, m.Kind, m.FieldName, m.Username}
	if len(m.Destinations) > 0 || m.AllowValueFill {
		// Where it may go is sealed with it. (Credentials stored before
		// destinations existed have none, and are bound nowhere.)
		where, _ := json.Marshal(struct {
			D []Destination
			V bool
		}{m.Destinations, m.AllowValueFill})
		parts = append(parts, string(where))
	}
	return []byte(strings.Join(parts, "\x00"))
}

// Create seals and stores a credential for the tenant.
func (v *Vault) Create(ctx context.Context, tenant string, n New) (Meta, error) {
	if err := check(n); err != nil {
		return Meta{}, err
	}
	m := Meta{ID: ids.NewCredential(), Name: n.Name, Kind: n.Kind, Username: n.Username, FieldName: n.FieldName,
		Destinations: n.Destinations, AllowValueFill: n.AllowValueFill, CreatedAt: time.Now().UTC()}
	nonce := make([]byte, v.aead.NonceSize())
	rand.Read(nonce)
	s := sealed{Meta: m, Nonce: nonce, Ciphertext: v.aead.Seal(nil, nonce, []byte(n.Secret), aad(tenant, m))}
	raw, err := json.Marshal(s)
	if err != nil {
		return Meta{}, err
	}
	if _, err := v.client.PutObject(ctx, v.bucket, key(tenant, m.ID), bytes.NewReader(raw), int64(len(raw)),
		minio.PutObjectOptions{ContentType: "application/json"}); err != nil {
		return Meta{}, fmt.Errorf("store credential: %w", err)
	}
	return m, nil
}

func check(n New) error {
	bad := func(msg string) error { return fmt.Errorf("%w: %s", ErrInvalid, msg) }
	if n.Name == "" || len(n.Name) > 128 {
		return bad("name must be 1-128 bytes")
	}
	if n.Secret == "" || len(n.Secret) > 4096 {
		return bad("secret must be 1-4096 bytes")
	}
	if strings.ContainsAny(n.Secret, "\r\n\x00") {
		return bad("secret must not contain line breaks or NUL")
	}
	if len(n.Destinations) == 0 || len(n.Destinations) > MaxDestinations {
		return bad("destinations must name 1-16 places the credential may go (scheme, host, port, path_prefix); a session binds it only within them")
	}
	switch n.Kind {
	case KindBasic:
		if n.Username == "" || strings.ContainsAny(n.Username, ":\r\n\x00") || len(n.Username) > 256 {
			return bad("a basic credential needs a username of at most 256 bytes without ':' or line breaks")
		}
	case KindForm:
		if n.Username == "" || strings.ContainsAny(n.Username, "\r\n\x00") || len(n.Username) > 256 {
			return bad("a form credential needs a username of at most 256 bytes without line breaks")
		}
	case KindBearer:
	case KindHeader, KindCookie:
		if !namePattern.MatchString(n.FieldName) {
			return bad("a " + n.Kind + " credential needs field_name, a header or cookie name")
		}
		if n.Kind == KindHeader {
			switch strings.ToLower(n.FieldName) {
			case "host", "content-length", "transfer-encoding", "connection", "proxy-authorization":
				return bad("field_name " + n.FieldName + " cannot carry a credential")
			}
		}
		if n.Kind == KindCookie && strings.ContainsAny(n.Secret, "; ") {
			return bad("a cookie value must not contain ';' or spaces")
		}
	default:
		return bad(fmt.Sprintf("kind %q is not one of basic, bearer, header, cookie, form", n.Kind))
	}
	return nil
}

func (v *Vault) load(ctx context.Context, tenant, id string) (sealed, error) {
	if !ids.IsCredential(id) {
		return sealed{}, ErrNotFound
	}
	obj, err := v.client.GetObject(ctx, v.bucket, key(tenant, id), minio.GetObjectOptions{})
	if err != nil {
		return sealed{}, fmt.Errorf("read credential: %w", err)
	}
	defer obj.Close()
	raw, err := io.ReadAll(io.LimitReader(obj, 64<<10))
	if err != nil {
		if minio.ToErrorResponse(err).Code == "NoSuchKey" {
			return sealed{}, ErrNotFound
		}
		return sealed{}, fmt.Errorf("read credential: %w", err)
	}
	var s sealed
	if err := json.Unmarshal(raw, &s); err != nil {
		return sealed{}, fmt.Errorf("%w: %w", errGarbled, err)
	}
	if s.Destinations == nil {
		s.Destinations = []Destination{} // stored before they existed
	}
	return s, nil
}

// Get returns a credential's metadata.
func (v *Vault) Get(ctx context.Context, tenant, id string) (Meta, error) {
	s, err := v.load(ctx, tenant, id)
	return s.Meta, err
}

// Open returns a credential with its secret.
func (v *Vault) Open(ctx context.Context, tenant, id string) (Opened, error) {
	s, err := v.load(ctx, tenant, id)
	if err != nil {
		return Opened{}, err
	}
	plain, err := v.aead.Open(nil, s.Nonce, s.Ciphertext, aad(tenant, s.Meta))
	if err != nil {
		return Opened{}, errors.New("credential does not open with this gateway's key")
	}
	return Opened{Meta: s.Meta, Secret: string(plain)}, nil
}

// List returns the tenant's credentials, oldest first.
func (v *Vault) List(ctx context.Context, tenant string) ([]Meta, error) {
	out := []Meta{}
	for obj := range v.client.ListObjects(ctx, v.bucket, minio.ListObjectsOptions{Prefix: tenant + "/"}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("list credentials: %w", obj.Err)
		}
		id := strings.TrimSuffix(strings.TrimPrefix(obj.Key, tenant+"/"), ".json")
		m, err := v.Get(ctx, tenant, id)
		switch {
		case errors.Is(err, ErrNotFound), errors.Is(err, errGarbled):
			continue // (deleted since listed; not a credential)
		case err != nil:
			// MinIO, or the caller, gave up: a list without some is
			// no answer.
			return nil, err
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// Delete removes a credential; sessions bound to it get no secret after.
func (v *Vault) Delete(ctx context.Context, tenant, id string) error {
	if _, err := v.load(ctx, tenant, id); err != nil {
		return err
	}
	return v.client.RemoveObject(ctx, v.bucket, key(tenant, id), minio.RemoveObjectOptions{})
}
