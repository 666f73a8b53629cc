package egress

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
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
	return s[id], nil
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
	for _, b := range []*Binding{&hdr, &ck} {
		if err := CheckBinding(b); err != nil {
			t.Fatal(err)
		}
	}
	secrets := secretsMap{
		hdr.Credential: {Kind: KindHeader, Name: "X-Api-Key", Secret: "key-canary"},
		ck.Credential:  {Kind: KindCookie, Name: "session", Secret: "cookie-canary"},
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
	}, onePolicy{Policy{Session: "s", Tenant: "t", Allow: []Pattern{allow}, Bindings: []Binding{hdr, ck}}}, secrets)
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
	for _, want := range []string{"egress_allowed " + host, "egress_denied elsewhere.example.test", "egress_denied local.example.test"} {
		if !strings.Contains(joined, want) {
			t.Errorf("audit lacks %q:\n%s", want, joined)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
