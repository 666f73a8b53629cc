package egress

import (
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/sandgate/sandgate/ids"
)

// Credential kinds: how the proxy puts a secret on a request.
const (
	KindBasic  = "basic"  // Authorization: Basic user:secret
	KindBearer = "bearer" // Authorization: Bearer secret
	KindHeader = "header" // <Name>: secret
	KindCookie = "cookie" // Cookie: <Name>=secret
	// KindForm is a username and secret for login forms only: the proxy
	// puts nothing in headers for it, it swaps the session's placeholder
	// for the secret in request bodies to the bound destinations.
	KindForm = "form"
)

// How fill_credential types a bound credential into a page.
const (
	// FillPlaceholder types the session's placeholder, which the proxy
	// swaps for the secret in requests to the bound destinations: the
	// secret never enters the sandbox. The default.
	FillPlaceholder = "placeholder"
	// FillValue types the real secret: an explicit opt-in per binding.
	FillValue = "value"
)

// Credential is an opened secret, held by the proxy only while it adds it
// to a request.
type Credential struct {
	Kind     string
	Name     string // header or cookie name
	Username string // for basic
	Secret   string
	// Destinations are where its owner lets it go (checked with
	// CheckDestination); a binding outside them is not used.
	Destinations []Binding
}

// WithinAny tells whether b lies within one of ds (see Within).
func (b Binding) WithinAny(ds []Binding) bool {
	for _, d := range ds {
		if b.Within(d) {
			return true
		}
	}
	return false
}

func (c *Credential) apply(r *http.Request) {
	switch c.Kind {
	case KindBasic:
		r.SetBasicAuth(c.Username, c.Secret)
	case KindBearer:
		r.Header.Set("Authorization", "Bearer "+c.Secret)
	case KindHeader:
		r.Header.Set(c.Name, c.Secret)
	case KindCookie:
		var keep []string
		for _, ck := range r.Cookies() {
			if ck.Name != c.Name {
				keep = append(keep, ck.Name+"="+ck.Value)
			}
		}
		keep = append(keep, c.Name+"="+c.Secret)
		r.Header.Set("Cookie", strings.Join(keep, "; "))
	}
}

// Binding ties a credential to destinations: scheme, host (or a wildcard
// below a registrable domain), port and path prefix (matched on the
// cleaned path at segment boundaries, see CleanPath and PathUnder).
type Binding struct {
	Credential string `json:"credential"`
	Scheme     string `json:"scheme"`
	Host       string `json:"host"`
	Port       uint16 `json:"port,omitempty"`
	PathPrefix string `json:"path_prefix,omitempty"`
	// Fill is what fill_credential types: FillPlaceholder (the default)
	// or FillValue.
	Fill string `json:"fill,omitempty"`
}

// ValidCredentialID tells whether s has the form of a vault id.
func ValidCredentialID(s string) bool { return ids.IsCredential(s) }

// CheckBinding validates a binding and fills its defaults (port from the
// scheme, path prefix "/", fill "placeholder").
func CheckBinding(b *Binding) error {
	if !ValidCredentialID(b.Credential) {
		return fmt.Errorf("%w: credential %q is not a credential id", ErrInvalid, b.Credential)
	}
	if err := CheckDestination(b); err != nil {
		return err
	}
	switch b.Fill {
	case "":
		b.Fill = FillPlaceholder
	case FillPlaceholder, FillValue:
	default:
		return fmt.Errorf("%w: fill %q is not placeholder or value", ErrInvalid, b.Fill)
	}
	return nil
}

// CheckDestination validates where a binding sends its credential
// (scheme, host, port, path prefix; its credential and fill aside) and
// fills the defaults: the scheme's port, path prefix "/". A credential's
// own destinations are checked with it.
func CheckDestination(b *Binding) error {
	switch b.Scheme {
	case "https":
		if b.Port == 0 {
			b.Port = 443
		}
	case "http":
		if b.Port == 0 {
			b.Port = 80
		}
	default:
		return fmt.Errorf("%w: binding scheme %q is not http or https", ErrInvalid, b.Scheme)
	}
	if _, err := ParsePattern(b.Host + ":" + strconv.Itoa(int(b.Port))); err != nil {
		return fmt.Errorf("binding host: %w", err)
	}
	if b.PathPrefix == "" {
		b.PathPrefix = "/"
	}
	if !strings.HasPrefix(b.PathPrefix, "/") || len(b.PathPrefix) > 1024 {
		return fmt.Errorf("%w: path_prefix %q must start with / (at most 1024 bytes)", ErrInvalid, b.PathPrefix)
	}
	// The prefix is compared with cleaned request paths, so it must be
	// one itself: no dot segments, escapes or empty segments.
	if c, ok := CleanPath(&url.URL{Path: b.PathPrefix}); !ok || strings.TrimSuffix(c, "/") != strings.TrimSuffix(b.PathPrefix, "/") ||
		strings.ContainsAny(b.PathPrefix, "%?#;") {
		return fmt.Errorf("%w: path_prefix %q must be a clean path such as /api/", ErrInvalid, b.PathPrefix)
	}
	return nil
}

// Within tells whether every destination of b is one of d's: the same
// scheme and port, a host d's host covers (d's own pattern, or a name or
// narrower wildcard under d's wildcard), and a path prefix under d's.
// Both are checked (CheckDestination).
func (b Binding) Within(d Binding) bool {
	if b.Scheme != d.Scheme || b.Port != d.Port || !PathUnder(path.Clean(b.PathPrefix), d.PathPrefix) {
		return false
	}
	bp, dp := b.pattern(), d.pattern()
	switch {
	case bp == dp:
		return true
	case !dp.Wildcard:
		return false
	default:
		// Under "*.example.com": "a.example.com" and "*.a.example.com",
		// but nothing under another public suffix (MatchesSite).
		return strings.HasSuffix(bp.Host, "."+dp.Host) && sameSuffix(bp.Host, dp.Host)
	}
}

// MatchesURL tells whether u is one of the binding's destinations: same
// scheme, a host the binding's host covers, the same port (the scheme's
// default when u names none) and a cleaned path under the path prefix.
// An ambiguous path (see CleanPath) matches nothing.
func (b Binding) MatchesURL(u *url.URL) bool {
	if u == nil || u.Scheme != b.Scheme {
		return false
	}
	def := uint16(80)
	if u.Scheme == "https" {
		def = 443
	}
	host, port, ok := target(u.Host, def)
	if !ok || !b.pattern().MatchesSite(host, port) {
		return false
	}
	clean, ok := CleanPath(u)
	return ok && PathUnder(clean, b.PathPrefix)
}

func (b Binding) pattern() Pattern {
	p, _ := ParsePattern(b.Host + ":" + strconv.Itoa(int(b.Port)))
	return p
}

func bindingsFor(bs []Binding, scheme, host string, port uint16) []Binding {
	var out []Binding
	for _, b := range bs {
		if b.Scheme == scheme && b.pattern().MatchesSite(host, port) {
			out = append(out, b)
		}
	}
	return out
}
