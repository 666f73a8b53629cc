package egress

import (
	"net/url"
	"path"
	"strings"
)

// CleanPath returns the path a server will act on for u: percent-decoded,
// with "." and ".." segments resolved and repeated slashes collapsed. It
// reports false for a path servers disagree about, which the proxy does
// not guess at for hosts with bound credentials: an encoded slash or
// backslash ("/api%2f..%2fadmin"), a backslash, a NUL, an invalid escape,
// or a dot segment dressed with parameters ("/api/..;/admin", read as
// ".." by some servlet containers).
func CleanPath(u *url.URL) (string, bool) {
	raw := u.EscapedPath()
	if raw == "" {
		raw = "/"
	}
	if u.Opaque != "" || !strings.HasPrefix(raw, "/") {
		return "", false
	}
	low := strings.ToLower(raw)
	for _, bad := range []string{"%2f", "%5c", "%00", "\\"} {
		if strings.Contains(low, bad) {
			return "", false
		}
	}
	dec, err := url.PathUnescape(raw)
	if err != nil || strings.ContainsAny(dec, "\\\x00") {
		return "", false
	}
	for _, seg := range strings.Split(dec, "/") {
		if i := strings.IndexByte(seg, ';'); i >= 0 {
			if s := seg[:i]; s == "." || s == ".." {
				return "", false
			}
		}
	}
	c := path.Clean(dec)
	if strings.HasSuffix(dec, "/") && c != "/" {
		c += "/"
	}
	return c, true
}

// PathUnder tells whether a cleaned path lies under prefix at a segment
// boundary: prefix "/api" (or "/api/") covers "/api", "/api/" and
// "/api/x", not "/apiary". Prefix "/" covers every path.
func PathUnder(clean, prefix string) bool {
	p := strings.TrimSuffix(path.Clean("/"+prefix), "/")
	if p == "" {
		return true
	}
	return clean == p || strings.HasPrefix(clean, p+"/")
}
