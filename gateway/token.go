package gateway

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/sandgate/sandgate/ids"
)

// Preview scopes.
const (
	ScopeCDP    = "cdp"
	ScopeVNC    = "vnc"
	ScopeView   = "view"
	ScopeReview = "review"
)

// previewClaims are the signed content of a preview token. The expiry is
// inside the signed part; the key id is in the header, so keys rotate.
type previewClaims struct {
	Session  string `json:"sid"`
	Tenant   string `json:"tnt"`
	Scope    string `json:"scp"`
	ViewOnly bool   `json:"vo,omitempty"`
	jwt.RegisteredClaims
	// raw is the token these were read from (a relaying replica passes
	// it on to the leader).
	raw string
	// allowRoot, in a shell's claims: the tenant may run commands as
	// root.
	allowRoot bool
	// maxFileBytes, in a shell's claims: the largest file the tenant
	// may upload (0: the default).
	maxFileBytes int64
	// maxArtifactBytes, in a shell's claims: the tenant's artifact
	// quota (0: none), when quotaSaid (the leader that admitted it
	// said; one of the version before did not).
	maxArtifactBytes int64
	quotaSaid        bool
}

// signer issues and checks preview tokens with HMAC-SHA256 keys.
type signer struct {
	active string
	keys   map[string][]byte
}

func newSigner(active string, keys map[string]string) (*signer, error) {
	s := &signer{active: active, keys: map[string][]byte{}}
	for id, k := range keys {
		if len(k) < 32 {
			return nil, fmt.Errorf("token key %q is shorter than 32 bytes", id)
		}
		s.keys[id] = []byte(k)
	}
	if s.keys[active] == nil {
		return nil, fmt.Errorf("active token key %q is not configured", active)
	}
	return s, nil
}

func newPreviewID() string { return ids.NewPreview() }

func (s *signer) issue(c previewClaims) (string, error) {
	t := jwt.NewWithClaims(jwt.SigningMethodHS256, c)
	t.Header["kid"] = s.active
	return t.SignedString(s.keys[s.active])
}

var errBadToken = errors.New("invalid preview token")

// verify checks signature, key id, algorithm and expiry.
func (s *signer) verify(token string, now time.Time) (*previewClaims, error) {
	if len(token) > 4096 {
		return nil, errBadToken
	}
	var c previewClaims
	_, err := jwt.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		k, ok := s.keys[kid]
		if !ok {
			return nil, errBadToken
		}
		return k, nil
	},
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(func() time.Time { return now }),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errBadToken, err)
	}
	if c.Session == "" || c.Tenant == "" || c.ID == "" {
		return nil, errBadToken
	}
	c.raw = token
	return &c, nil
}

// knows reports whether token names (in its header, unchecked) a key
// this signer has.
func (s *signer) knows(token string) bool {
	if len(token) > 4096 {
		return false
	}
	t, _, err := jwt.NewParser().ParseUnverified(token, &previewClaims{})
	if err != nil {
		return true // not a token at all: nothing to ask anyone
	}
	kid, _ := t.Header["kid"].(string)
	return s.keys[kid] != nil
}

// viewer is a short keyed digest of a caller's address within one
// session: it tells one session's callers apart in a trail that its
// links' holders read, without giving them each other's addresses, and
// without letting the holders of two sessions' links match a caller
// across them. (It changes with the active key.)
func (s *signer) viewer(tenant, session, addr string) string {
	m := hmac.New(sha256.New, s.keys[s.active])
	m.Write([]byte("sandgate review viewer\x00" + tenant + "\x00" + session + "\x00" + addr))
	return hex.EncodeToString(m.Sum(nil)[:8])
}
