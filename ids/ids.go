// Package ids owns the form of Sandgate's identifiers: session ids
// (s-<16 hex digits>), preview ids (p-<16 hex digits>) and credential ids
// (cred_<16 hex digits>): how a new one is made and how one read from a
// request, a path or a store is checked. Every room may import it; it
// imports nothing of Sandgate.
package ids

import (
	"crypto/rand"
	"encoding/hex"
)

const (
	sessionPrefix    = "s-"
	previewPrefix    = "p-"
	credentialPrefix = "cred_"
	digits           = 16 // lower-case hex digits after the prefix
)

// SessionPattern is a session id as regular expression text, without
// anchors, for patterns that embed one (artifact ids).
const SessionPattern = `s-[0-9a-f]{16}`

// NewSession returns a fresh session id.
func NewSession() string { return newID(sessionPrefix) }

// NewPreview returns a fresh preview id.
func NewPreview() string { return newID(previewPrefix) }

// NewCredential returns a fresh credential id.
func NewCredential() string { return newID(credentialPrefix) }

// IsSession tells whether s is a session id.
func IsSession(s string) bool { return valid(s, sessionPrefix) }

// IsPreview tells whether s is a preview id.
func IsPreview(s string) bool { return valid(s, previewPrefix) }

// IsCredential tells whether s is a credential id.
func IsCredential(s string) bool { return valid(s, credentialPrefix) }

func newID(prefix string) string {
	b := make([]byte, digits/2)
	rand.Read(b) // never fails (crypto/rand panics if the system cannot)
	return prefix + hex.EncodeToString(b)
}

func valid(s, prefix string) bool {
	if len(s) != len(prefix)+digits || s[:len(prefix)] != prefix {
		return false
	}
	for i := len(prefix); i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
