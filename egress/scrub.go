package egress

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// A bound host may echo what it was sent: a login page that fills the
// password back in, an API that reflects headers, a redirect that carries
// a token. The proxy masks every echo of a bound secret in the responses
// of bound hosts before the session sees them, in the forms servers write
// it: plain, base64 (standard and URL alphabets, at any alignment inside
// a longer encoded string such as a basic Authorization value), percent
// encoded (upper and lower case hex, "+" or "%20" for spaces) and JSON
// escaped.

// minNeedle is the shortest encoded form worth masking: shorter cores of
// base64 at an offset would mask unrelated bytes and reveal nothing.
const minNeedle = 4

// maskByte replaces every byte of an echo; the length stays, so a
// Content-Length the server sent stays true.
const maskByte = '*'

// needles returns the byte strings that show a secret, longest first.
func needles(secrets ...string) [][]byte {
	seen := map[string]bool{}
	out := [][]byte{} // never nil: nil means "nothing to scrub" to forward
	add := func(s string) {
		if len(s) >= minNeedle && !seen[s] {
			seen[s] = true
			out = append(out, []byte(s))
		}
	}
	for _, s := range secrets {
		if s == "" {
			continue
		}
		add(s)
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			for a := 0; a < 3; a++ {
				add(base64Core(enc, s, a))
			}
		}
		for _, e := range []string{url.QueryEscape(s), url.PathEscape(s), strings.ReplaceAll(url.QueryEscape(s), "+", "%20")} {
			add(e)
			add(lowerHexEscapes(e))
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		enc.Encode(s)
		plain := strings.TrimSuffix(strings.TrimSpace(b.String()), `"`)[1:]
		add(plain)
		add(strings.ReplaceAll(plain, "/", `\/`))
		jsonHTML, _ := json.Marshal(s)
		add(string(jsonHTML[1 : len(jsonHTML)-1]))
		// Written back into a page: HTML entities as Go's html and
		// html/template, and other servers, write them.
		h := html.EscapeString(s)
		add(h)
		add(strings.ReplaceAll(h, "+", "&#43;"))
		add(strings.NewReplacer("&#34;", "&quot;", "&#39;", "&#x27;").Replace(h))
		add(numericEntities(s))
		add(hexEntities(s, "&#x%x;"))
		add(hexEntities(s, "&#x%X;"))
		// Mustache.js, and Handlebars.
		add(strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#39;", "/", "&#x2F;", "`", "&#x60;", "=", "&#x3D;").Replace(s))
		add(strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#x27;", "`", "&#x60;", "=", "&#x3D;").Replace(s))
		// The quotes as other libraries write them: Rails, Lodash and
		// Spring (&#39;), PHP (&#039;, or &apos; for HTML5), hex.
		if strings.ContainsAny(s, `"'`) {
			for _, apos := range []string{"'", "&#39;", "&#039;", "&apos;", "&#x27;", "&#X27;"} {
				for _, quot := range []string{`"`, "&quot;", "&#34;", "&#034;", "&#x22;", "&#X22;"} {
					add(strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, quot, "'", apos).Replace(s))
				}
			}
		}
		// Written into a script: JavaScript string escapes.
		for _, q := range [][2]string{{`\'`, `\"`}, {`\u0027`, `\u0022`}, {`\x27`, `\x22`}} {
			add(strings.NewReplacer(`\`, `\\`, "'", q[0], `"`, q[1]).Replace(s))
			add(strings.NewReplacer(`\`, `\\`, "'", q[0], `"`, q[1], "/", `\/`).Replace(s))
		}
		for _, f := range []string{`\u%04x`, `\u%04X`, `\x%02x`, `\x%02X`} {
			add(jsEscapes(s, f))
		}
	}
	// Longest first, so a longer form is masked whole before a shorter
	// one inside it.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && len(out[j]) > len(out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// base64Core is the part of the encoding of s that does not depend on
// the bytes around it when s starts at offset a (mod 3) of the encoded
// data: the characters that mix in a neighbour's bits are dropped.
func base64Core(enc *base64.Encoding, s string, a int) string {
	e := enc.EncodeToString(append(make([]byte, a), s...))
	lead := []int{0, 2, 3}[a]
	if (a+len(s))%3 != 0 {
		e = e[:len(e)-1]
	}
	if len(e) <= lead {
		return ""
	}
	return e[lead:]
}

// hexEntities writes every character of s but letters and digits as a
// hexadecimal character reference in format (&#x%x; or &#x%X;).
func hexEntities(s, format string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			b.WriteRune(r)
			continue
		}
		fmt.Fprintf(&b, format, r)
	}
	return b.String()
}

// jsEscapes writes every ASCII character of s but letters and digits
// with a JavaScript escape in format (\u%04x or \x%02x), as some
// templates escape everything they put into a script.
func jsEscapes(s, format string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 128 || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			continue
		}
		fmt.Fprintf(&b, format, r)
	}
	return b.String()
}

// numericEntities writes every byte of s but letters and digits as a
// decimal character reference.
func numericEntities(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			b.WriteRune(r)
			continue
		}
		b.WriteString("&#" + strconv.Itoa(int(r)) + ";")
	}
	return b.String()
}

// lowerHexEscapes writes the hex digits of %XX escapes in lower case.
func lowerHexEscapes(s string) string {
	b := []byte(s)
	for i := 0; i+2 < len(b); i++ {
		if b[i] == '%' {
			b[i+1], b[i+2] = bytes.ToLower(b[i+1 : i+2])[0], bytes.ToLower(b[i+2 : i+3])[0]
			i += 2
		}
	}
	return string(b)
}

// mask overwrites every occurrence of a needle that starts before limit;
// a needle must end within b, which the caller guarantees by holding back
// the longest needle's length less one.
func mask(b []byte, limit int, ns [][]byte) {
	for _, n := range ns {
		for i := 0; i < limit; {
			j := bytes.Index(b[i:], n)
			if j < 0 || i+j >= limit {
				break
			}
			for k := i + j; k < i+j+len(n); k++ {
				b[k] = maskByte
			}
			i += j + len(n)
		}
	}
}

// scrubHeader drops every header whose name or value shows a secret.
func scrubHeader(h http.Header, ns [][]byte) {
	for name, vals := range h {
		for _, v := range append([]string{name}, vals...) {
			if containsAny([]byte(v), ns) {
				delete(h, name)
				break
			}
		}
	}
}

func containsAny(b []byte, ns [][]byte) bool {
	for _, n := range ns {
		if bytes.Contains(b, n) {
			return true
		}
	}
	return false
}

// scrubReader masks needles in a stream with a sliding window: it holds
// back the longest needle's length less one byte until more data (or the
// end) shows whether an echo starts there. Memory is one read buffer and
// that window, whatever the body's size.
type scrubReader struct {
	src  io.ReadCloser
	ns   [][]byte
	keep int    // longest needle - 1
	buf  []byte // data not yet returned
	out  int    // buf[:out] is masked and may be returned
	err  error
}

const scrubChunk = 32 << 10

func newScrubReader(src io.ReadCloser, ns [][]byte) *scrubReader {
	keep := 0
	for _, n := range ns {
		keep = max(keep, len(n)-1)
	}
	return &scrubReader{src: src, ns: ns, keep: keep, buf: make([]byte, 0, scrubChunk+keep)}
}

func (s *scrubReader) Read(p []byte) (int, error) {
	for s.out == 0 {
		if s.err != nil {
			if len(s.buf) == 0 {
				return 0, s.err
			}
			// The end: everything left is scanned and may go.
			mask(s.buf, len(s.buf), s.ns)
			s.out = len(s.buf)
			break
		}
		if len(s.buf) == cap(s.buf) {
			// Not reached (a full buffer leaves a chunk to return), but
			// never loop on a zero-length read.
			mask(s.buf, len(s.buf)-s.keep, s.ns)
			s.out = len(s.buf) - s.keep
			break
		}
		n, err := s.src.Read(s.buf[len(s.buf):cap(s.buf)])
		s.buf = s.buf[:len(s.buf)+n]
		if err != nil {
			s.err = err
			continue
		}
		if limit := len(s.buf) - s.keep; limit > 0 {
			mask(s.buf, limit, s.ns)
			s.out = limit
		}
	}
	n := copy(p, s.buf[:s.out])
	s.out -= n
	s.buf = s.buf[:copy(s.buf, s.buf[n:])]
	return n, nil
}

func (s *scrubReader) Close() error { return s.src.Close() }
