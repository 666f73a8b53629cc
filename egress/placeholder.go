package egress

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
)

// Placeholders: fill_credential types a session's placeholder for a
// credential ("sgph_" and 32 hex digits, from the vault) instead of the
// secret, so the page, and the agent reading it, never holds the secret.
// When the session sends that placeholder in the body of a submission
// (POST, PUT or PATCH) to a destination one of the credential's bindings
// covers (scheme, host, port, cleaned path prefix), the proxy puts the
// secret in its place, encoded for the body. Sent anywhere else, or in
// a query or a GET, a placeholder stays a placeholder: a search box or
// an error page that writes its query back would show the agent the
// secret, and URLs land in logs and Referer headers. (A credential's
// own destinations are where its owner narrows this to the login
// endpoint.)

// MaxPlaceholderBody bounds the request bodies the proxy reads to swap
// placeholders: a login form is far smaller. A larger body is forwarded
// as it is, streamed, placeholders and all (the login fails at the site,
// and the secret goes nowhere), and the trail gets placeholder_not_swapped.
const MaxPlaceholderBody = 1 << 20

// MaxPlaceholderSwaps bounds the placeholders swapped in one request (a
// login form holds one or two); a request with more is passed unchanged.
const MaxPlaceholderSwaps = 8

// swap is one placeholder and the secret it stands for.
type swap struct {
	placeholder string
	secret      string
}

// swapResult says what swapPlaceholders did.
type swapResult struct {
	swapped  map[string]bool // placeholders replaced
	tooLarge bool            // a body over MaxPlaceholderBody held a placeholder in its first part
}

// swapPlaceholders replaces the placeholders in the body of r, a POST,
// PUT or PATCH. The body is read only up to MaxPlaceholderBody+1 bytes.
func swapPlaceholders(r *http.Request, swaps []swap) (swapResult, error) {
	res := swapResult{swapped: map[string]bool{}}
	if len(swaps) == 0 {
		return res, nil
	}
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
	default:
		return res, nil
	}
	// Each swap grows the request by the secret's encoded length: a
	// body full of placeholders must not become hundreds of MB.
	count := 0
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return res, nil
	}
	head, err := io.ReadAll(io.LimitReader(r.Body, MaxPlaceholderBody+1))
	if err != nil {
		return res, err
	}
	if len(head) > MaxPlaceholderBody {
		for _, s := range swaps {
			res.tooLarge = res.tooLarge || bytes.Contains(head, []byte(s.placeholder))
		}
		r.Body = readCloser{io.MultiReader(bytes.NewReader(head), r.Body), r.Body}
		return res, nil
	}
	for _, s := range swaps {
		count += bytes.Count(head, []byte(s.placeholder))
	}
	if count > MaxPlaceholderSwaps {
		res.tooLarge = true
		r.Body = readCloser{io.MultiReader(bytes.NewReader(head), r.Body), r.Body}
		return res, nil
	}
	r.Body.Close()
	encode := encoderFor(r.Header.Get("Content-Type"))
	body := head
	for _, s := range swaps {
		if bytes.Contains(body, []byte(s.placeholder)) {
			body = bytes.ReplaceAll(body, []byte(s.placeholder), []byte(encode(s.secret)))
			res.swapped[s.placeholder] = true
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	r.Header.Del("Content-Length")
	return res, nil
}

// encoderFor says how a secret is written into a body of a content type:
// query-escaped in a form, JSON-escaped in JSON, as it is otherwise
// (multipart fields, text).
func encoderFor(contentType string) func(string) string {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case mt == "application/x-www-form-urlencoded":
		return url.QueryEscape
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		return func(s string) string {
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false)
			enc.Encode(s)
			q := strings.TrimSpace(b.String())
			return q[1 : len(q)-1]
		}
	default:
		return func(s string) string { return s }
	}
}

type readCloser struct {
	io.Reader
	io.Closer
}
