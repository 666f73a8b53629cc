package gateway

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/session"
)

// newTestServer builds the gateway without sessions or a store: enough for
// everything that is refused before either is used.
// goodKey is the digest of "good-key", tenant-a's API key in newTestServer.
var goodKey = sha256.Sum256([]byte("good-key"))

func newTestServer(t *testing.T, opts ...Option) *Server {
	t.Helper()
	u, _ := url.Parse("http://gw.test:8080")
	s, err := New(Config{
		PublicURL: u, APIKeys: map[string]string{hex.EncodeToString(goodKey[:]): "tenant-a"},
		TokenKeys: map[string]string{"k1": strings.Repeat("a", 32)}, ActiveKey: "k1",
	}, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRefusals(t *testing.T) {
	s := newTestServer(t)
	cases := []struct {
		name, method, target, host, auth, origin string
		status                                   int
		code                                     string
	}{
		{"no key", "GET", "/v1/sessions", "gw.test:8080", "", "", 401, "unauthenticated"},
		{"not bearer", "GET", "/v1/sessions", "gw.test:8080", "Basic abc", "", 401, "unauthenticated"},
		{"unknown key", "GET", "/v1/sessions", "gw.test:8080", "Bearer nope", "", 401, "unauthenticated"},
		{"foreign host", "GET", "/v1/sessions", "evil.test", "Bearer nope", "", 403, "permission_denied"},
		{"cdp bad token", "GET", "/cdp/abc/json/version", "gw.test:8080", "", "", 401, "unauthenticated"},
		{"cdp no token", "GET", "/cdp/", "gw.test:8080", "", "", 401, "unauthenticated"},
		{"cdp foreign origin", "GET", "/cdp/abc/json/version", "gw.test:8080", "", "http://evil.test", 403, "permission_denied"},
		{"unknown route", "GET", "/nothing", "gw.test:8080", "", "", 404, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.target, nil)
			req.Host = tc.host
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
			}
			resp, err := s.App().Test(req)
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			json.NewDecoder(resp.Body).Decode(&body)
			if resp.StatusCode != tc.status || body.Error.Code != tc.code || body.Error.Message == "" {
				t.Fatalf("got %d %+v, want %d %s", resp.StatusCode, body.Error, tc.status, tc.code)
			}
		})
	}
}

func TestHealthzNeedsNoHost(t *testing.T) {
	s := newTestServer(t)
	req := httptest.NewRequest("GET", "/healthz", nil)
	req.Host = "10.0.0.1:8080"
	resp, err := s.App().Test(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
}

// TestForwardedHost: X-Forwarded-Host counts only from a trusted proxy.
// app.Test's connections come from 0.0.0.0.
func TestForwardedHost(t *testing.T) {
	newServer := func(trusted ...string) *Server {
		u, _ := url.Parse("http://gw.test:8080")
		s, err := New(Config{
			PublicURL: u, APIKeys: map[string]string{}, TrustedProxies: trusted,
			TokenKeys: map[string]string{"k1": strings.Repeat("a", 32)}, ActiveKey: "k1",
		}, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	untrusted, trusted := newServer(), newServer("0.0.0.0/32")
	cases := []struct {
		name      string
		s         *Server
		host, xfh string
		status    int
	}{
		{"own host", untrusted, "gw.test:8080", "", 200},
		{"foreign host naming the gateway in X-Forwarded-Host", untrusted, "evil.test", "gw.test:8080", 403},
		{"own host, foreign X-Forwarded-Host from a client", untrusted, "gw.test:8080", "evil.test", 200},
		{"trusted proxy forwarding the gateway's host", trusted, "backend.internal", "gw.test:8080", 200},
		{"trusted proxy forwarding a foreign host", trusted, "gw.test:8080", "evil.test", 403},
		{"trusted proxy, first of a list", trusted, "backend.internal", "gw.test:8080, evil.test", 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest("GET", "/openapi.json", nil)
			req.Host = tc.host
			if tc.xfh != "" {
				req.Header.Set("X-Forwarded-Host", tc.xfh)
			}
			resp, err := tc.s.App().Test(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("GET /openapi.json Host %q X-Forwarded-Host %q: %d, want %d", tc.host, tc.xfh, resp.StatusCode, tc.status)
			}
		})
	}
	u, _ := url.Parse("http://gw.test:8080")
	if _, err := New(Config{PublicURL: u, TrustedProxies: []string{"not-an-ip"}, TokenKeys: map[string]string{"k1": strings.Repeat("a", 32)}, ActiveKey: "k1"}, nil, nil, slog.Default()); err == nil {
		t.Fatal("a trusted proxy that is not an address was accepted")
	}
}

// TestCDPHostsAgree: the readiness check keeps a /json/version asked with
// the Host the gateway's CDP code sends; with another, Chromium writes
// that authority into its URLs and the gateway refuses the kept answer.
func TestCDPHostsAgree(t *testing.T) {
	if session.CDPHost != browser.UpstreamHost {
		t.Fatalf("session.CDPHost %q, browser.UpstreamHost %q", session.CDPHost, browser.UpstreamHost)
	}
}

// TestForwardedCloses: a request a replica standing by forwarded ends its
// connection once answered, refused or not (the client's next request
// is routed again); any other keeps it.
func TestForwardedCloses(t *testing.T) {
	s := newTestServer(t)
	for _, tc := range []struct {
		target, forwarded string
		status            int
		closes            bool
	}{
		{"/healthz", "", 200, false},
		{"/healthz", "standby", 200, true},
		{"/v1/sessions", "", 401, false},
		{"/v1/sessions", "standby", 401, true},
	} {
		req := httptest.NewRequest("GET", tc.target, nil)
		req.Host = "gw.test:8080"
		if tc.forwarded != "" {
			req.Header.Set(ForwardedHeader, tc.forwarded)
		}
		resp, err := s.App().Test(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status || resp.Close != tc.closes {
			t.Errorf("%s forwarded %q: %d, closes %v; want %d, %v", tc.target, tc.forwarded, resp.StatusCode, resp.Close, tc.status, tc.closes)
		}
	}
}

// TestCodedBodyRefused: a body with a Content-Encoding is refused 415
// before it is unpacked (Fiber's Body would unpack nested gzip without
// a bound, before the key is checked): the same request uncoded gets as
// far as the key check (401, the control), and an "identity" coding is
// no coding.
func TestCodedBodyRefused(t *testing.T) {
	s := newTestServer(t)
	// 64 MiB of zeros, gzipped twice: a kilobyte or so on the wire.
	bomb := bytes.Repeat([]byte{0}, 64<<20)
	for range 2 {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		w.Write(bomb)
		w.Close()
		bomb = b.Bytes()
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, tc := range []struct {
		encoding string
		body     []byte
		key      bool // a good key: the handler reads the body
		status   int
	}{
		{"gzip, gzip", bomb, true, 415},
		{"gzip, gzip", bomb, false, 415},
		{"br", []byte("{}"), false, 415},
		{"", []byte("{}"), false, 401},
		{"identity", []byte("{}"), false, 401},
	} {
		req := httptest.NewRequest("POST", "/v1/sessions/"+ids.NewSession()+"/actions", bytes.NewReader(tc.body))
		req.Host = "gw.test:8080"
		req.Header.Set("Content-Type", "application/json")
		if tc.encoding != "" {
			req.Header.Set("Content-Encoding", tc.encoding)
		}
		if tc.key {
			req.Header.Set("Authorization", "Bearer good-key")
		}
		resp, err := s.App().Test(req, 10000)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.status || !strings.Contains(string(body), "invalid_argument") != (tc.status != 415) {
			t.Errorf("Content-Encoding %q (%d bytes): %d %s, want %d", tc.encoding, len(tc.body), resp.StatusCode, body, tc.status)
		}
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 32<<20 {
		t.Errorf("the requests allocated %d MiB: the body was unpacked", grew>>20)
	}
}

// TestUnreadableRequest: a request the server's parser refuses (a
// control byte in a header) gets a 400 whose message does not quote it,
// its API key with it; the same request without the byte reaches the
// key check (the control).
func TestUnreadableRequest(t *testing.T) {
	s := newTestServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.App().Listener(ln)
	defer s.App().Shutdown()
	const key = "sk-unreadable-0123456789"
	for _, tc := range []struct {
		ctype string
		want  int
	}{{"a\x7fb", 400}, {"application/json", 401}} {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET /v1/sessions HTTP/1.1\r\nHost: gw.test:8080\r\nAuthorization: Bearer %s\r\nContent-Type: %s\r\n\r\n", key, tc.ctype)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("content type %q: %v", tc.ctype, err)
		}
		body, _ := io.ReadAll(resp.Body)
		c.Close()
		if resp.StatusCode != tc.want || strings.Contains(string(body), key) || !strings.Contains(string(body), `"error"`) {
			t.Errorf("content type %q: %d %s, want %d without the key", tc.ctype, resp.StatusCode, body, tc.want)
		}
	}
}
