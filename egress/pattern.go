// Package egress owns the only way out of a session: the egress proxy the
// gateway side runs on the session bridge, its allow patterns, the address
// checks it makes after resolving names, the per-session certificate
// authority it intercepts bound HTTPS hosts with, and the credentials it
// adds to their requests. The kernel rules that force sessions through it
// belong to the session package, which owns their network.
package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// ErrInvalid marks a pattern or binding the caller got wrong; the message
// is safe to show.
var ErrInvalid = errors.New("invalid egress setting")

// Pattern is one allow-list entry: "host:port" or "*.example.com:443".
// A wildcard covers subdomains, not the domain itself.
type Pattern struct {
	Host     string // lower case; for a wildcard, the suffix without "*."
	Wildcard bool
	Port     uint16
}

func (p Pattern) String() string {
	h := p.Host
	if p.Wildcard {
		h = "*." + h
	}
	if a, err := netip.ParseAddr(p.Host); err == nil && a.Is6() {
		h = "[" + h + "]"
	}
	return h + ":" + strconv.Itoa(int(p.Port))
}

// ParsePattern checks one allow-list entry. It refuses a bare "*", a port
// wildcard and a wildcard over a public suffix ("*.com", "*.co.uk"): they
// would allow nearly everything.
func ParsePattern(s string) (Pattern, error) {
	host, portStr, err := splitHostPort(s)
	if err != nil {
		return Pattern{}, fmt.Errorf("%w: %q: want host:port, e.g. \"example.com:443\"", ErrInvalid, s)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return Pattern{}, fmt.Errorf("%w: %q: the port must be a number from 1 to 65535", ErrInvalid, s)
	}
	p := Pattern{Port: uint16(port)}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return Pattern{}, fmt.Errorf("%w: %q: zones are not allowed", ErrInvalid, s)
		}
		p.Host = a.Unmap().String()
		return p, nil
	}
	if suffix, ok := strings.CutPrefix(host, "*."); ok {
		p.Wildcard, host = true, suffix
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if !validHostname(host) {
		return Pattern{}, fmt.Errorf("%w: %q: %q is not a host name", ErrInvalid, s, host)
	}
	if p.Wildcard {
		if ps, _ := publicsuffix.PublicSuffix(host); ps == host || !strings.Contains(host, ".") {
			return Pattern{}, fmt.Errorf("%w: %q: a wildcard must sit below a registrable domain, not over a public suffix", ErrInvalid, s)
		}
	}
	p.Host = host
	return p, nil
}

// Matches tells whether the pattern covers host (already normalised with
// NormalizeHost) and port.
func (p Pattern) Matches(host string, port uint16) bool {
	if port != p.Port {
		return false
	}
	if p.Wildcard {
		return strings.HasSuffix(host, "."+p.Host)
	}
	return host == p.Host
}

// NormalizeHost lower-cases a host name and strips its trailing dot and
// any IPv6 brackets; it reports false for anything that is neither a host
// name nor an IP literal.
func NormalizeHost(h string) (string, bool) {
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return "", false
		}
		return a.Unmap().String(), true
	}
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	return h, validHostname(h)
}

// validHostname accepts LDH labels (and "_", seen in real names), refusing
// names a resolver might read as a number, such as "2130706433" or "0x7f.1".
func validHostname(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	if _, err := strconv.ParseUint(last, 0, 64); err == nil {
		return false
	}
	return !strings.HasPrefix(last, "0x")
}

func splitHostPort(s string) (host, port string, err error) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 {
		return "", "", errors.New("no port")
	}
	host, port = s[:i], s[i+1:]
	if strings.HasPrefix(host, "[") {
		if !strings.HasSuffix(host, "]") {
			return "", "", errors.New("bad brackets")
		}
		host = host[1 : len(host)-1]
	}
	return host, port, nil
}

// Allowed tells whether any pattern covers host and port.
func Allowed(patterns []Pattern, host string, port uint16) bool {
	for _, p := range patterns {
		if p.Matches(host, port) {
			return true
		}
	}
	return false
}

// MatchesSite is Matches, and for a wildcard also that host has the
// wildcard's own public suffix: "*.amazonaws.com" covers
// "www.amazonaws.com" but not "bucket.s3.amazonaws.com", whose public
// suffix "s3.amazonaws.com" hands every name below it to whoever
// registers one. Credentials go only where this holds.
func (p Pattern) MatchesSite(host string, port uint16) bool {
	return p.Matches(host, port) && (!p.Wildcard || sameSuffix(host, p.Host))
}

// sameSuffix tells whether host and base have the same public suffix.
func sameSuffix(host, base string) bool {
	h, _ := publicsuffix.PublicSuffix(host)
	b, _ := publicsuffix.PublicSuffix(base)
	return h == b
}
