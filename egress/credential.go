package egress

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

// Credential kinds: how the proxy puts a secret on a request.
const (
	KindBasic  = "basic"  // Authorization: Basic user:secret
	KindBearer = "bearer" // Authorization: Bearer secret
	KindHeader = "header" // <Name>: secret
	KindCookie = "cookie" // Cookie: <Name>=secret
)

// Credential is an opened secret, held by the proxy only while it adds it
// to a request.
type Credential struct {
	Kind     string
	Name     string // header or cookie name
	Username string // for basic
	Secret   string
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

// scrub removes response headers that carry the secret, so a server that
// echoes it cannot hand it to the session.
func (c *Credential) scrub(h http.Header) {
	for name, vals := range h {
		for _, v := range vals {
			if c.Secret != "" && strings.Contains(v, c.Secret) {
				h.Del(name)
				break
			}
		}
	}
}

// Binding ties a credential to destinations: scheme, host (or a wildcard
// below a registrable domain), port and path prefix.
type Binding struct {
	Credential string `json:"credential"`
	Scheme     string `json:"scheme"`
	Host       string `json:"host"`
	Port       uint16 `json:"port,omitempty"`
	PathPrefix string `json:"path_prefix,omitempty"`
}

var credentialID = regexp.MustCompile(`^cred_[0-9a-f]{16}$`)

// ValidCredentialID tells whether s has the form of a vault id.
func ValidCredentialID(s string) bool { return credentialID.MatchString(s) }

// CheckBinding validates a binding and fills its defaults (port from the
// scheme, path prefix "/").
func CheckBinding(b *Binding) error {
	if !ValidCredentialID(b.Credential) {
		return fmt.Errorf("%w: credential %q is not a credential id", ErrInvalid, b.Credential)
	}
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
	if !strings.HasPrefix(b.PathPrefix, "/") {
		return fmt.Errorf("%w: path_prefix %q must start with /", ErrInvalid, b.PathPrefix)
	}
	return nil
}

func (b Binding) pattern() Pattern {
	p, _ := ParsePattern(b.Host + ":" + strconv.Itoa(int(b.Port)))
	return p
}

func bindingsFor(bs []Binding, scheme, host string, port uint16) []Binding {
	var out []Binding
	for _, b := range bs {
		if b.Scheme == scheme && b.pattern().Matches(host, port) {
			out = append(out, b)
		}
	}
	return out
}
