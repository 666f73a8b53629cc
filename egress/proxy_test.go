package egress

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
)

type onePolicy struct{ p Policy }

func (o onePolicy) Policy(netip.Addr) (Policy, bool) { return o.p, true }

type secretsMap map[string]Credential

func (s secretsMap) Credential(_ context.Context, _ string, id string) (Credential, error) {
	c, ok := s[id]
	if !ok {
		return Credential{}, errors.New("no such credential")
	}
	return c, nil
}

// Placeholder stands in for the vault's: deterministic per session and
// credential, of the same form.
func (s secretsMap) Placeholder(session, credential string) string {
	sum := sha256.Sum256([]byte(session + "\x00" + credential))
	return "sgph_" + hex.EncodeToString(sum[:16])
}

// startProxy serves p on loopback and returns its address.
func startProxy(t *testing.T, p *Proxy) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(l)
	t.Cleanup(func() { p.Close() })
	return l.Addr().String()
}

// proxyClient sends requests through the proxy at addr, trusting roots
// for HTTPS (the session CA's, for intercepted hosts).
func proxyClient(addr string, roots *x509.CertPool) *http.Client {
	u, _ := url.Parse("http://" + addr)
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u), TLSClientConfig: &tls.Config{RootCAs: roots}, DisableCompression: true}}
}

// TestProxyAddsBoundCredentials runs the proxy on loopback in front of an
// upstream on loopback (exempted, as an operator's staging network would
// be) and checks header and cookie credentials, path prefixes, the
// scrubbing of echoed secrets and the refusals.
func TestProxyAddsBoundCredentials(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("X-Echo", r.Header.Get("X-Api-Key"))
		io.WriteString(w, "ok "+r.URL.Path)
	}))
	defer up.Close()
	port := up.Listener.Addr().(*net.TCPAddr).Port
	host := "app.example.test"
	allow, _ := ParsePattern(host + ":" + itoa(port))
	hdr := Binding{Credential: "cred_0000000000000001", Scheme: "http", Host: host, Port: uint16(port), PathPrefix: "/api/"}
	ck := Binding{Credential: "cred_0000000000000002", Scheme: "http", Host: host, Port: uint16(port), PathPrefix: "/web/"}
	// A binding outside its credential's destinations (a session bound
	// before they existed) is not used.
	out := Binding{Credential: "cred_0000000000000003", Scheme: "http", Host: host, Port: uint16(port), PathPrefix: "/"}
	elsewhere := Binding{Scheme: "http", Host: "elsewhere.example.test", Port: uint16(port), PathPrefix: "/"}
	for _, b := range []*Binding{&hdr, &ck, &out, &elsewhere} {
		if err := CheckDestination(b); err != nil {
			t.Fatal(err)
		}
	}
	secrets := secretsMap{
		hdr.Credential: {Kind: KindHeader, Name: "X-Api-Key", Secret: "key-canary", Destinations: []Binding{{Scheme: "http", Host: host, Port: uint16(port), PathPrefix: "/"}}},
		ck.Credential:  {Kind: KindCookie, Name: "session", Secret: "cookie-canary", Destinations: []Binding{ck}},
		out.Credential: {Kind: KindHeader, Name: "X-Outside", Secret: "outside-canary", Destinations: []Binding{elsewhere}},
	}
	var audit []string
	p := New(Config{
		Resolver: NewResolver("", map[string][]netip.Addr{host: {netip.MustParseAddr("127.0.0.1")}, "local.example.test": {netip.MustParseAddr("127.0.0.1")}}),
		Exempt:   []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Audit: func(_, typ string, f map[string]any) {
			mu.Lock()
			audit = append(audit, typ+" "+f["host"].(string))
			mu.Unlock()
		},
	}, onePolicy{Policy{Session: "s", Tenant: "t", Allow: []Pattern{allow}, Bindings: []Binding{hdr, ck, out}}}, secrets)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(l)
	defer p.Close()
	proxyURL, _ := url.Parse("http://" + l.Addr().String())
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}
	get := func(u string, cookie string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", u, nil)
		if cookie != "" {
			req.Header.Set("Cookie", cookie)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	base := "http://" + host + ":" + itoa(port)

	resp, body := get(base+"/api/x", "")
	if resp.StatusCode != 200 || body != "ok /api/x" || resp.Header.Get("X-Echo") != "" {
		t.Fatalf("/api/x: %d %q echo %q (an echoed secret must be dropped)", resp.StatusCode, body, resp.Header.Get("X-Echo"))
	}
	get(base+"/web/y", "theme=dark; session=placeholder")
	get(base+"/other", "")
	mu.Lock()
	if got := seen[0].Get("X-Api-Key"); got != "key-canary" {
		t.Errorf("bound header: %q", got)
	}
	if got := seen[1].Get("Cookie"); got != "theme=dark; session=cookie-canary" {
		t.Errorf("bound cookie: %q", got)
	}
	if seen[2].Get("X-Api-Key") != "" || strings.Contains(seen[2].Get("Cookie"), "canary") {
		t.Errorf("a path outside the prefixes got a credential: %v", seen[2])
	}
	for i, h := range seen[:3] {
		if h.Get("X-Outside") != "" {
			t.Errorf("request %d got a credential bound outside its destinations", i)
		}
	}
	mu.Unlock()

	for _, u := range []string{"http://elsewhere.example.test/", "http://local.example.test:" + itoa(port) + "/"} {
		if resp, _ := get(u, ""); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", u, resp.StatusCode)
		}
	}
	// Without the exemption, loopback is refused after resolution.
	p.cfg.Exempt = nil
	if resp, body := get(base+"/api/x", ""); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "loopback") {
		t.Errorf("loopback without an exemption: %d %q", resp.StatusCode, body)
	}
	mu.Lock()
	defer mu.Unlock()
	joined := strings.Join(audit, "\n")
	for _, want := range []string{"egress_allowed " + host, "egress_denied elsewhere.example.test", "egress_denied local.example.test", "credential_refused " + host} {
		if !strings.Contains(joined, want) {
			t.Errorf("audit lacks %q:\n%s", want, joined)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// rawRequest sends one request line (and headers) to the proxy as a
// session would, byte for byte, and reads the answer.
func rawRequest(t *testing.T, addr, method, target string, hdr string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n", method, target, u.Host, hdr)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// TestProxyCredentialScope tries the ways around a binding's scope: dot
// segments plain and encoded, a prefix that is not a segment, encoded
// slashes and servlet-style dot segments, TRACE, and a server echoing
// the secret in its body, its headers, 1xx responses and compressed
// bodies. Each has its positive control.
func TestProxyCredentialScope(t *testing.T) {
	const secret = `k3y/Can+ary "q"&=?<>`
	var mu sync.Mutex
	type hit struct{ path, key, acceptEncoding string }
	var hits []hit
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits = append(hits, hit{r.URL.EscapedPath(), r.Header.Get("X-Api-Key"), r.Header.Get("Accept-Encoding")})
		mu.Unlock()
		key := r.Header.Get("X-Api-Key")
		switch r.URL.Path {
		case "/api/echo":
			js, _ := json.Marshal(map[string]string{"key": key})
			fmt.Fprintf(w, "marker plain=%s b64=%s b64url1=%s basic=%s q=%s path=%s lower=%s json=%s end",
				key, base64.StdEncoding.EncodeToString([]byte(key)), base64.URLEncoding.EncodeToString([]byte("x"+key)),
				base64.StdEncoding.EncodeToString([]byte("qa-user:"+key)), url.QueryEscape(key), url.PathEscape(key),
				strings.ToLower(url.QueryEscape(key)), js)
		case "/api/header":
			w.Header().Set("X-B64", base64.StdEncoding.EncodeToString([]byte(key)))
			w.Header().Set("Location", "/next?k="+url.QueryEscape(key))
			w.Header().Set("X-Fine", "fine")
			io.WriteString(w, "headers")
		case "/api/gzip":
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			io.WriteString(zw, key)
			zw.Close()
		case "/api/early", "/early":
			w.Header().Set("Link", "</style.css?k="+url.QueryEscape(key)+">; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
			io.WriteString(w, "after hints")
		default:
			io.WriteString(w, "ok "+r.URL.EscapedPath())
		}
	}))
	defer up.Close()
	port := up.Listener.Addr().(*net.TCPAddr).Port
	host, other := "app.example.test", "plain.example.test"
	allow, _ := ParsePattern(other + ":" + itoa(port))
	b := Binding{Credential: "cred_0000000000000001", Scheme: "http", Host: host, Port: uint16(port), PathPrefix: "/api"}
	if err := CheckBinding(&b); err != nil {
		t.Fatal(err)
	}
	var audit []string
	p := New(Config{
		Resolver: NewResolver("", map[string][]netip.Addr{host: {netip.MustParseAddr("127.0.0.1")}, other: {netip.MustParseAddr("127.0.0.1")}}),
		Exempt:   []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Audit: func(_, typ string, f map[string]any) {
			mu.Lock()
			audit = append(audit, fmt.Sprint(typ, " ", f["reason"], f["via"]))
			mu.Unlock()
		},
	}, onePolicy{Policy{Session: "s", Tenant: "t", Allow: []Pattern{allow}, Bindings: []Binding{b}}},
		secretsMap{b.Credential: {Kind: KindHeader, Name: "X-Api-Key", Secret: secret, Destinations: []Binding{b}}})
	addr := startProxy(t, p)
	base := "http://" + host + ":" + itoa(port)
	last := func() hit {
		mu.Lock()
		defer mu.Unlock()
		if len(hits) == 0 {
			return hit{}
		}
		h := hits[len(hits)-1]
		hits = nil
		return h
	}

	for _, tc := range []struct {
		target   string
		status   int
		withKey  bool
		seenPath string // "" when the upstream must not be asked
	}{
		{"/api/x", 200, true, "/api/x"},
		{"/api", 200, true, "/api"},
		{"/api/./x", 200, true, "/api/x"},
		{"/api//x", 200, true, "/api/x"},
		{"/%61pi/x", 200, true, "/api/x"},
		{"/api/../admin", 200, false, "/admin"},
		{"/api/%2e%2e/admin", 200, false, "/admin"},
		{"/api/%2E%2E/admin", 200, false, "/admin"},
		{"/api/x/../../admin", 200, false, "/admin"},
		{"/apiary", 200, false, "/apiary"},
		{"/API/x", 200, false, "/API/x"},
		{"/admin", 200, false, "/admin"},
		{"/api/..%2fadmin", 400, false, ""},
		{"/api%2f..%2fadmin", 400, false, ""},
		{"/api/..%5cadmin", 400, false, ""},
		{"/api/..;/admin", 400, false, ""},
		{"/api/x%00", 400, false, ""},
	} {
		resp, body := rawRequest(t, addr, "GET", base+tc.target, "")
		h := last()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %q, want %d", tc.target, resp.StatusCode, body, tc.status)
			continue
		}
		if tc.seenPath == "" {
			if h.path != "" {
				t.Errorf("%s: the upstream was asked (%s)", tc.target, h.path)
			}
			continue
		}
		if h.path != tc.seenPath || (h.key == secret) != tc.withKey {
			t.Errorf("%s: upstream saw %s with key %v; want %s with key %v", tc.target, h.path, h.key == secret, tc.seenPath, tc.withKey)
		}
	}
	// An unbound host gets paths as they are: nothing is refused there.
	if resp, body := rawRequest(t, addr, "GET", "http://"+other+":"+itoa(port)+"/a/..%2fb", ""); resp.StatusCode != 200 || body != "ok /a/..%2fb" || last().key != "" {
		t.Errorf("an encoded slash to an unbound host: %d %q", resp.StatusCode, body)
	}

	t.Run("trace", func(t *testing.T) {
		for _, m := range []string{"TRACE", "TRACK"} {
			if resp, _ := rawRequest(t, addr, m, base+"/api/x", ""); resp.StatusCode != http.StatusMethodNotAllowed || last().path != "" {
				t.Errorf("%s: %d, want 405 without asking the upstream", m, resp.StatusCode)
			}
		}
		if resp, _ := rawRequest(t, addr, "OPTIONS", base+"/api/x", ""); resp.StatusCode != 200 || last().key != secret {
			t.Errorf("control: OPTIONS: %d", resp.StatusCode)
		}
	})

	t.Run("echo-in-body", func(t *testing.T) {
		resp, body := rawRequest(t, addr, "GET", base+"/api/echo", "")
		if resp.StatusCode != 200 || !strings.HasPrefix(body, "marker plain=") || !strings.HasSuffix(body, " end") {
			t.Fatalf("echo: %d %q", resp.StatusCode, body)
		}
		if int64(len(body)) != resp.ContentLength {
			t.Errorf("the masked body is %d bytes, Content-Length says %d", len(body), resp.ContentLength)
		}
		for _, n := range needles(secret) {
			if strings.Contains(body, string(n)) {
				t.Errorf("the body shows the secret as %q: %s", n, body)
			}
		}
		if c := strings.Count(body, "****"); c < 8 {
			t.Errorf("only %d masked echoes in %s", c, body)
		}
	})

	t.Run("echo-in-headers", func(t *testing.T) {
		resp, body := rawRequest(t, addr, "GET", base+"/api/header", "")
		if resp.StatusCode != 200 || body != "headers" || resp.Header.Get("X-Fine") != "fine" {
			t.Fatalf("control: %d %q %v", resp.StatusCode, body, resp.Header)
		}
		if resp.Header.Get("X-B64") != "" || resp.Header.Get("Location") != "" {
			t.Errorf("headers echoing the secret reached the session: %v", resp.Header)
		}
	})

	t.Run("compressed", func(t *testing.T) {
		resp, body := rawRequest(t, addr, "GET", base+"/api/gzip", "Accept-Encoding: gzip\r\n")
		if h := last(); h.acceptEncoding != "identity" {
			t.Errorf("the bound host was asked for %q, want identity", h.acceptEncoding)
		}
		if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, secret) {
			t.Errorf("a compressed answer from a bound host: %d %q, want 502", resp.StatusCode, body)
		}
	})

	t.Run("early-hints", func(t *testing.T) {
		hints := func(u string) []string {
			var got []string
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				got = append(got, h.Get("Link"))
				return nil
			}})
			req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
			resp, err := proxyClient(addr, nil).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return got
		}
		// Control: an unbound host's hints reach the client.
		if got := hints("http://" + other + ":" + itoa(port) + "/early"); len(got) != 1 {
			t.Fatalf("control: hints from an unbound host: %q", got)
		}
		if got := hints(base + "/api/early"); len(got) != 0 {
			t.Errorf("1xx from a bound host reached the session: %q", got)
		}
	})

	mu.Lock()
	defer mu.Unlock()
	joined := strings.Join(audit, "\n")
	for _, want := range []string{"egress_denied an ambiguous path", "egress_denied method TRACE", "credential_used <nil>header"} {
		if !strings.Contains(joined, want) {
			t.Errorf("audit lacks %q:\n%s", want, joined)
		}
	}
}
