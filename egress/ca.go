package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"time"
)

// CA is one session's certificate authority. Its key is derived from the
// gateway's secret and the session id, so a restarted gateway has the same
// CA and the session's Chromium, which trusts it by public-key hash
// (--ignore-certificate-errors-spki-list), keeps working. The key never
// enters the sandbox; the hash is all the session gets.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	leafKey *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// caValidity covers any session's life: the CA is trusted by key hash,
// and it is re-made, not renewed, after a restart.
const caValidity = 8 * 24 * time.Hour

// NewCA derives session's CA from secret (at least 32 bytes).
func NewCA(secret []byte, session string) (*CA, error) {
	if len(secret) < 32 {
		return nil, errors.New("the CA secret must be at least 32 bytes")
	}
	key, err := deriveKey(secret, "sandgate session ca "+session)
	if err != nil {
		return nil, err
	}
	leafKey, err := deriveKey(secret, "sandgate session leaf "+session)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: "Sandgate session " + session, Organization: []string{"Sandgate"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, leafKey: leafKey, leaves: map[string]*tls.Certificate{}}, nil
}

// deriveKey makes a P-256 key from the secret and a label: HKDF output
// used as the scalar, retried in the rare case it is out of range.
func deriveKey(secret []byte, label string) (*ecdsa.PrivateKey, error) {
	for i := 0; i < 8; i++ {
		d, err := hkdf.Key(sha256.New, secret, nil, fmt.Sprintf("%s/%d", label, i), 32)
		if err != nil {
			return nil, err
		}
		if k, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), d); err == nil {
			return k, nil
		}
	}
	return nil, errors.New("could not derive a key")
}

// SPKIHashes are the base64 SHA-256 hashes of the CA's and the leaves'
// public keys, the form Chromium's --ignore-certificate-errors-spki-list
// takes.
func (c *CA) SPKIHashes() []string {
	var out []string
	for _, k := range []*ecdsa.PrivateKey{c.key, c.leafKey} {
		der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
		if err != nil {
			continue
		}
		sum := sha256.Sum256(der)
		out = append(out, base64.StdEncoding.EncodeToString(sum[:]))
	}
	return out
}

// Certificate returns a certificate for host signed by the CA, with the
// CA in its chain.
func (c *CA) Certificate(host string) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leaves[host]; ok {
		return l, nil
	}
	now := time.Now()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     c.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &c.leafKey.PublicKey, c.key)
	if err != nil {
		return nil, err
	}
	l := &tls.Certificate{Certificate: [][]byte{der, c.cert.Raw}, PrivateKey: c.leafKey}
	c.leaves[host] = l
	return l, nil
}
