// Package sandgate is the Go client of Sandgate's management API:
// sessions, previews, exec with streaming output, the shell, files,
// computer-use actions, artifacts, events and the credential vault.
//
// It depends on nothing else of Sandgate, so a program that only talks
// to a gateway pulls in neither containerd nor Fiber:
//
//	c := sandgate.New("http://127.0.0.1:8080", os.Getenv("SANDGATE_API_KEY"))
//	s, err := c.CreateSession(ctx, sandgate.SessionRequest{Kind: "browser"})
//	p, err := c.CreatePreview(ctx, s.ID, sandgate.PreviewRequest{Scope: "cdp"})
//	// p.URL is a CDP endpoint for Playwright, Puppeteer, chromedp or rod.
package sandgate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// Client talks to one gateway with one API key. It is safe for
// concurrent use.
type Client struct {
	base     string
	key      string
	http     *http.Client
	host     string
	retryFor time.Duration
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client. Its CheckRedirect should not
// follow redirects: artifact downloads read the redirect themselves.
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// WithHost sends every request with this Host header: for a client that
// reaches the gateway on another address than its public one (the
// gateway's own MCP server talks to it over loopback).
func WithHost(host string) Option { return func(c *Client) { c.host = host } }

// WithRetry sets how long, in all, a request is sent again while the
// gateway says nothing was done and to retry: a 503 unavailable with a
// Retry-After (a gateway replica taking over the sessions from one that
// died, none leading yet, one stopping), waiting as it says; or while
// no connection can be made (nothing was sent). Default
// DefaultRetryFor (a request no connection could be made for, at most 5
// s); 0 sends each request once. A request whose body cannot be read
// again (a file put from a stream) is sent once.
func WithRetry(d time.Duration) Option { return func(c *Client) { c.retryFor = max(d, 0) } }

// DefaultRetryFor is how long a request is retried by default
// (WithRetry): longer than a gateway replica takes to take over from one
// that died.
const DefaultRetryFor = time.Minute

// dialRetryFor bounds the retries of a request no connection could be
// made for: a replica behind a Service that has just gone, or no
// gateway at that address at all, which a caller should hear of soon.
const dialRetryFor = 5 * time.Second

// New returns a client of the gateway at baseURL ("http://host:port").
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{
		base:     strings.TrimRight(baseURL, "/"),
		key:      apiKey,
		retryFor: DefaultRetryFor,
		// No timeout: exec, the shell and downloads run for as long as
		// they run; the caller's context ends them.
		http: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// FromEnv returns a client of SANDGATE_URL (default
// http://127.0.0.1:8080) with SANDGATE_API_KEY.
func FromEnv(opts ...Option) (*Client, error) {
	base := os.Getenv("SANDGATE_URL")
	if base == "" {
		base = "http://127.0.0.1:8080"
	}
	key := os.Getenv("SANDGATE_API_KEY")
	if key == "" {
		return nil, errors.New("SANDGATE_API_KEY is not set")
	}
	return New(base, key, opts...), nil
}

// BaseURL is the gateway's address as given to New.
func (c *Client) BaseURL() string { return c.base }

// Error is an error answer of the gateway:
// {"error":{"code":"not_found","message":"..."}} with its HTTP status.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// RetryAfter is the gateway's hint on a quota_exceeded create or an
	// unavailable answer: try again after this long (0: none given).
	RetryAfter time.Duration `json:"-"`
}

func (e *Error) Error() string { return fmt.Sprintf("%s (%d): %s", e.Code, e.Status, e.Message) }

// IsNotFound reports whether err is the gateway's not_found.
func IsNotFound(err error) bool { return codeOf(err) == "not_found" }

// IsUnauthenticated reports whether the gateway refused the API key.
func IsUnauthenticated(err error) bool { return codeOf(err) == "unauthenticated" }

// IsUnavailable reports whether err is the gateway's unavailable: it
// could not serve the request now (one its RetryAfter says to retry was
// retried for as long as WithRetry lets).
func IsUnavailable(err error) bool { return codeOf(err) == "unavailable" }

// IsQuotaExceeded reports whether err is the gateway's quota_exceeded: a
// tenant quota or the gateway's capacity left no room.
func IsQuotaExceeded(err error) bool { return codeOf(err) == "quota_exceeded" }

func codeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 1 << 20

// maxJSONBody bounds a JSON answer (a list of sessions, events or
// artifacts; a screenshot action's base64 PNG).
const maxJSONBody = 64 << 20

// send makes one request and returns the response when its status is
// below 400; otherwise the gateway's error.
func (c *Client) send(ctx context.Context, method, path string, body io.Reader, ctype string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	if body != nil {
		req.Header.Set("Content-Type", ctype)
	}
	if c.host != "" {
		req.Host = c.host
	}
	start := time.Now()
	for {
		resp, err := c.sendOnce(req)
		wait, again := retryable(err)
		until := start.Add(c.retryFor)
		if e := (*Error)(nil); !errors.As(err, &e) {
			until = start.Add(min(c.retryFor, dialRetryFor)) // no gateway at the address, perhaps
		}
		if !again || (req.Body != nil && req.GetBody == nil) || time.Now().Add(wait).After(until) {
			return resp, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting to send again after %w: %w", err, ctx.Err())
		case <-time.After(wait):
		}
		if req.GetBody != nil {
			if req.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
		}
	}
}

// retryable says whether a request that failed with err was not carried
// out and may be sent again, and after how long: a 503 unavailable with
// a Retry-After, or a connection that could not be made.
func retryable(err error) (time.Duration, bool) {
	var e *Error
	var op *net.OpError
	switch {
	case errors.As(err, &e):
		return e.RetryAfter, e.Status == http.StatusServiceUnavailable && e.Code == "unavailable" && e.RetryAfter > 0
	case errors.As(err, &op):
		return time.Second, op.Op == "dial"
	}
	return 0, false
}

// sendOnce sends req and returns the response when its status is below
// 400; otherwise the gateway's error.
func (c *Client) sendOnce(req *http.Request) (*http.Response, error) {
	method, path := req.Method, req.URL.RequestURI()
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 400 {
		return resp, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var e struct {
		Error *Error `json:"error"`
	}
	if json.Unmarshal(raw, &e) != nil || e.Error == nil || e.Error.Code == "" {
		return nil, &Error{Status: resp.StatusCode, Code: "http_" + fmt.Sprint(resp.StatusCode), Message: fmt.Sprintf("%s %s: %s", method, path, resp.Status)}
	}
	e.Error.Status = resp.StatusCode
	// A day at most: a larger number would overflow a Duration.
	if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && n > 0 {
		e.Error.RetryAfter = time.Duration(min(n, 86400)) * time.Second
	}
	return nil, e.Error
}

// call sends in (JSON, when not nil) and decodes the answer into out
// (when not nil).
func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.send(ctx, method, path, body, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxJSONBody+1))
	if err != nil {
		return err
	}
	if len(raw) > maxJSONBody {
		return fmt.Errorf("%s %s: answer larger than %d bytes", method, path, maxJSONBody)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s %s: bad answer: %w", method, path, err)
	}
	return nil
}
