package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	cdpc "github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/security"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
)

const basicUser = "qa-user"

// serveTestSites starts the test's servers in the hosts namespace: the
// pages and a login form over HTTP, HTTPS sites (one open, one behind
// basic auth, one behind a bearer token), a site off every allow list,
// servers on a private and the metadata address and on IPv6, and UDP
// echoes standing in for a DNS server.
func (e *testEnv) serveTestSites() error {
	h := e.hosts
	pages := pagesMux()
	login := http.NewServeMux()
	login.HandleFunc("GET /login.html", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<!doctype html><html><head><title>log in</title></head><body>
<form method="post" action="/login"><input id="user" name="user"><input id="pass" name="pass" type="password">
<button id="submit" type="submit">Log in</button></form></body></html>`)
	})
	login.HandleFunc("POST /login", func(w http.ResponseWriter, r *http.Request) {
		if r.FormValue("user") == basicUser && r.FormValue("pass") == e.canary {
			fmt.Fprint(w, `<!doctype html><html><head><title>welcome</title></head><body>logged in</body></html>`)
			return
		}
		fmt.Fprint(w, `<!doctype html><html><head><title>denied</title></head><body>wrong</body></html>`)
	})
	page := func(title string) string {
		return `<!doctype html><html><head><title>` + title + `</title></head><body>` + title + `</body></html>`
	}
	http80 := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch strings.Split(r.Host, ":")[0] {
		case "login.sandgate.test":
			login.ServeHTTP(w, r)
		default:
			pages.ServeHTTP(w, r)
		}
	})
	https := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch strings.Split(r.Host, ":")[0] {
		case "site.sandgate.test", "intercepted.sandgate.test":
			fmt.Fprint(w, page("allowed site"))
		case "basic.sandgate.test":
			if u, p, ok := r.BasicAuth(); !ok || u != basicUser || p != e.canary {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, "who are you", http.StatusUnauthorized)
				return
			}
			fmt.Fprint(w, page("basic ok"))
		case "bearer.sandgate.test":
			if r.Header.Get("Authorization") != "Bearer "+e.canary {
				http.Error(w, "no token", http.StatusUnauthorized)
				return
			}
			fmt.Fprint(w, page("bearer ok"))
		default:
			http.NotFound(w, r)
		}
	})
	for _, s := range []struct {
		addr    string
		tls     bool
		handler http.Handler
	}{
		{sitesIP + ":80", false, http80},
		{sitesIP + ":443", true, https},
		{otherIP + ":80", false, text("other site")},
		{hostsPrivate + ":80", false, text("private host")},
		{metadataIP + ":80", false, text("metadata")},
		{"[" + hostsIPv6 + "]:80", false, text("ipv6 host")},
	} {
		var cert = siteCert
		if !s.tls {
			cert = nil
		}
		if err := h.serve(s.addr, cert, s.handler); err != nil {
			return err
		}
	}
	for _, a := range []string{dnsIP + ":53", otherIP + ":9999"} {
		_, pc, err := listenIn("udp", a)
		if err != nil {
			return fmt.Errorf("udp %s: %w", a, err)
		}
		h.closers = append(h.closers, func() { pc.Close() })
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(buf[:n], from)
			}
		}()
	}
	return nil
}

func text(s string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, s) })
}

// hostListener listens on the bridge's host address, as a service on the
// host would, for the test that sessions cannot reach it.
func hostListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", bridgeIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host service\n"))
			c.Close()
		}
	}()
	return l.Addr().String()
}

// reachableFromHost checks that the targets the tests expect to be
// blocked do answer from the host, so a failure from a session means a
// rule held, not that nothing was there.
func reachableFromHost(t *testing.T, hostPort string) {
	t.Helper()
	for _, a := range []string{sitesIP + ":80", metadataIP + ":80", "[" + hostsIPv6 + "]:80", hostsPrivate + ":80", hostPort} {
		c, err := net.DialTimeout("tcp", a, 3*time.Second)
		if err != nil {
			t.Fatalf("control: %s does not answer from the host: %v", a, err)
		}
		c.Close()
	}
	for _, a := range []string{dnsIP + ":53", otherIP + ":9999"} {
		c, err := net.Dial("udp", a)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(3 * time.Second))
		c.Write([]byte("ping"))
		buf := make([]byte, 16)
		if _, err := c.Read(buf); err != nil {
			t.Fatalf("control: UDP %s does not echo from the host: %v", a, err)
		}
		c.Close()
	}
}

// events returns the session's audit trail.
func (e *testEnv) events(t testing.TB, key, id string) []struct {
	Type   string         `json:"type"`
	Fields map[string]any `json:"fields"`
} {
	t.Helper()
	st, body := e.api(t, key, "GET", "/v1/sessions/"+id+"/events", nil)
	if st != 200 {
		t.Fatalf("events: %d %s", st, body)
	}
	var ev struct {
		Events []struct {
			Type   string         `json:"type"`
			Fields map[string]any `json:"fields"`
		} `json:"events"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		t.Fatalf("events: %v: %s", err, body)
	}
	return ev.Events
}

func hasEvent(evs []struct {
	Type   string         `json:"type"`
	Fields map[string]any `json:"fields"`
}, typ, host, reasonPart string) bool {
	for _, ev := range evs {
		if ev.Type == typ && ev.Fields["host"] == host && strings.Contains(fmt.Sprint(ev.Fields["reason"]), reasonPart) {
			return true
		}
	}
	return false
}

// cdpContext connects chromedp to a session of tenant A through the
// gateway.
func (e *testEnv) cdpContext(t testing.TB, id string) context.Context {
	t.Helper()
	return e.cdpContextKey(t, e.keyA, id)
}

// cdpContextKey connects chromedp to a session of the key's tenant.
func (e *testEnv) cdpContextKey(t testing.TB, key, id string) context.Context {
	t.Helper()
	p := e.preview(t, key, id, 300)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	actx, cancelA := remote.NewAllocator(ctx, browserWS(t, p.URL))
	t.Cleanup(cancelA)
	cctx, cancelC := chromedp.NewContext(actx)
	t.Cleanup(cancelC)
	return cctx
}

func navigateTitle(ctx context.Context, url string) (string, error) {
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		return "", err
	}
	return chromedp.Run(ctx, chromedp.Title())
}

// TestEgressDefaultDeny: a session reaches what its allow list names,
// through the proxy, and nothing else by any route.
func TestEgressDefaultDeny(t *testing.T) {
	e := needE2E(t)
	hostPort := hostListener(t)
	reachableFromHost(t, hostPort)
	s := e.createSession(t, e.keyA, map[string]any{"egress": map[string]any{"allow": []string{
		"site.sandgate.test:443", "private.sandgate.test:80", "metadata.sandgate.test:80", "mixed.sandgate.test:80", sitesIP + ":8080",
	}}})

	t.Run("chromium", func(t *testing.T) {
		ctx := e.cdpContext(t, s.ID)
		if title, err := navigateTitle(ctx, "http://pages.sandgate.test/hello.html"); err != nil || title != "Sandgate test page" {
			t.Fatalf("a page on the tenant's allow list: %q, %v", title, err)
		}
		// The site's certificate is the test's own CA; the proxy tunnels
		// it untouched, so the agent accepts it as any client of a
		// staging site would.
		if err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdpc.Call(ctx, tg, security.SetIgnoreCertificateErrors, security.SetIgnoreCertificateErrorsParams{Ignore: true})
			return err
		})); err != nil {
			t.Fatal(err)
		}
		if title, err := navigateTitle(ctx, "https://site.sandgate.test/"); err != nil || title != "allowed site" {
			t.Fatalf("an allowed HTTPS site: %q, %v", title, err)
		}
		title, _ := navigateTitle(ctx, "http://other.sandgate.test/")
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		if title == "other site" || strings.Contains(body, "other site") {
			t.Fatalf("a site off the allow list loaded: %q %q", title, body)
		}
	})

	t.Run("shell", func(t *testing.T) {
		if st, body := e.api(t, e.keyA, "PUT", "/v1/sessions/"+s.ID+"/files?path=/home/sandgate/workspace/ca.pem", readFile(t, e.hosts.caFile)); st/100 != 2 {
			t.Fatalf("upload CA: %d %s", st, body)
		}
		sh := func(script string) execOut {
			return e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"bash", "-c", script}, "timeout_seconds": 30})
		}
		if out := sh("curl -sS --max-time 10 --cacert /home/sandgate/workspace/ca.pem https://site.sandgate.test/"); !strings.Contains(string(out.Stdout), "allowed site") {
			t.Fatalf("curl through the proxy to an allowed site: exit %d %q %q", out.ExitCode, out.Stdout, out.Stderr)
		}
		tcp := func(addr string) string {
			return fmt.Sprintf(`perl -MIO::Socket::IP -e 'IO::Socket::IP->new(PeerAddr => "%s", Timeout => 3) or exit 1; exit 0'`, addr)
		}
		udp := func(addr string) string {
			return fmt.Sprintf(`perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(PeerAddr => "%s", Proto => "udp") or exit 1; $s->send("\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01"); $r = ""; eval { local $SIG{ALRM} = sub { die }; alarm 3; $s->recv($r, 512); alarm 0 }; exit(length($r) ? 0 : 1)'`, addr)
		}
		proxyReq := func(line string) string {
			return fmt.Sprintf(`printf '%s\r\nHost: x\r\n\r\n' | perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(PeerAddr => $ENV{SANDGATE_PROXY} =~ s{^http://}{}r, Timeout => 3) or exit 1; print $s <STDIN>; $l = <$s>; print $l; exit($l =~ / 2\d\d / ? 0 : 1)'`, line)
		}
		for name, script := range map[string]string{
			"allowed-host-ip-directly": tcp(sitesIP + ":80"),
			"allowed-ip-port-directly": tcp(sitesIP + ":8080"),
			"dns-to-a-server":          udp(dnsIP + ":53"),
			"dns-to-the-host":          udp(bridgeIP + ":53"),
			"udp-packet":               udp(otherIP + ":9999"),
			"ipv6":                     tcp("[" + hostsIPv6 + "]:80"),
			"metadata":                 tcp(metadataIP + ":80"),
			"host-service":             tcp(hostPort),
			"private-via-proxy":        "curl -sf --max-time 10 http://private.sandgate.test/",
			"metadata-via-proxy":       "curl -sf --max-time 10 http://metadata.sandgate.test/",
			"mixed-via-proxy":          "curl -sf --max-time 10 http://mixed.sandgate.test/",
			"off-list-via-proxy":       "curl -sf --max-time 10 http://other.sandgate.test/",
			"ip-literal-via-proxy":     "curl -sf --max-time 10 http://" + otherIP + "/",
			"file-scheme-via-proxy":    proxyReq("GET file:///etc/passwd HTTP/1.1"),
			"ftp-scheme-via-proxy":     proxyReq("GET ftp://site.sandgate.test/ HTTP/1.1"),
			"connect-loopback":         proxyReq("CONNECT 127.0.0.1:22 HTTP/1.1"),
		} {
			out := sh(script)
			t.Logf("%s: exit %d stdout %q stderr %q", name, out.ExitCode, out.Stdout, out.Stderr)
			if out.ExitCode == 0 {
				t.Errorf("%s: succeeded from the session", name)
			}
		}
	})

	t.Run("audit", func(t *testing.T) {
		evs := e.events(t, e.keyA, s.ID)
		for _, want := range []struct{ typ, host, reason string }{
			{"egress_allowed", "pages.sandgate.test", ""},
			{"egress_allowed", "site.sandgate.test", ""},
			{"egress_denied", "other.sandgate.test", "allow list"},
			{"egress_denied", "private.sandgate.test", "private"},
			{"egress_denied", "metadata.sandgate.test", "metadata"},
			{"egress_denied", otherIP, "allow list"},
		} {
			if !hasEvent(evs, want.typ, want.host, want.reason) {
				t.Errorf("no %s event for %s (%s) in the audit trail", want.typ, want.host, want.reason)
			}
		}
	})
}

// TestEgressBadInput: malformed patterns and bindings are 400s that say
// what is wrong; nothing is created.
func TestEgressBadInput(t *testing.T) {
	e := needE2E(t)
	st, body := e.api(t, e.keyA, "POST", "/v1/credentials", map[string]any{"name": "qa", "kind": "bearer", "secret": e.canary,
		"destinations": []map[string]any{{"scheme": "https", "host": "site.sandgate.test", "path_prefix": "/app/"}, {"scheme": "https", "host": "*.qa.sandgate.test"}}})
	if st != 201 || !strings.Contains(string(body), `"port":443`) {
		t.Fatalf("create credential: %d %s (its destinations, with their defaults, come back)", st, body)
	}
	cred := jsonField(body, "id")
	// The control: a binding within the credential's destinations is
	// taken.
	if st, body := e.api(t, e.keyA, "POST", "/v1/sessions", map[string]any{"runtime": "runc", "credentials": []map[string]any{
		{"credential": cred, "scheme": "https", "host": "site.sandgate.test", "path_prefix": "/app/login"},
		{"credential": cred, "scheme": "https", "host": "a.qa.sandgate.test"}}}); st != 201 {
		t.Fatalf("the control: a binding within the credential's destinations: %d %s", st, body)
	} else {
		e.api(t, e.keyA, "DELETE", "/v1/sessions/"+jsonField(body, "id"), nil)
	}
	before := len(e.listSessions(t, e.keyA))
	for _, tc := range []struct {
		name   string
		key    string
		req    map[string]any
		status int
	}{
		{"allow without port", e.keyA, map[string]any{"egress": map[string]any{"allow": []string{"example.com"}}}, 400},
		{"allow everything", e.keyA, map[string]any{"egress": map[string]any{"allow": []string{"*:443"}}}, 400},
		{"allow a public suffix", e.keyA, map[string]any{"egress": map[string]any{"allow": []string{"*.co.uk:443"}}}, 400},
		{"allow a numeric host", e.keyA, map[string]any{"egress": map[string]any{"allow": []string{"2130706433:80"}}}, 400},
		{"allow not a list", e.keyA, map[string]any{"egress": map[string]any{"allow": "example.com:443"}}, 400},
		{"bind to everything", e.keyA, map[string]any{"credentials": []map[string]any{{"credential": cred, "scheme": "https", "host": "*"}}}, 400},
		{"bind to a TLD", e.keyA, map[string]any{"credentials": []map[string]any{{"credential": cred, "scheme": "https", "host": "*.com"}}}, 400},
		{"bind with a bad scheme", e.keyA, map[string]any{"credentials": []map[string]any{{"credential": cred, "scheme": "ftp", "host": "site.sandgate.test"}}}, 400},
		{"bind a malformed id", e.keyA, map[string]any{"credentials": []map[string]any{{"credential": "x", "scheme": "https", "host": "site.sandgate.test"}}}, 400},
		{"bind another tenant's credential", e.keyB, map[string]any{"credentials": []map[string]any{{"credential": cred, "scheme": "https", "host": "site.sandgate.test"}}}, 404},
		{"bind a missing credential", e.keyA, map[string]any{"credentials": []map[string]any{{"credential": "cred_0000000000000000", "scheme": "https", "host": "site.sandgate.test"}}}, 404},
		// Whoever holds the API key may not send a credential where its
		// owner did not say (their own host would get the secret), nor
		// have the secret itself typed into a page it can read.
		{"bind to a host the credential does not name", e.keyA, map[string]any{"credentials": []map[string]any{{"credential": cred, "scheme": "https", "host": "evil.sandgate.test"}}}, 403},
		{"bind wider than the credential's path", e.keyA, map[string]any{"credentials": []map[string]any{{"credential": cred, "scheme": "https", "host": "site.sandgate.test"}}}, 403},
		{"bind over plain http", e.keyA, map[string]any{"credentials": []map[string]any{{"credential": cred, "scheme": "http", "host": "site.sandgate.test", "path_prefix": "/app/"}}}, 403},
		{"bind to another port", e.keyA, map[string]any{"credentials": []map[string]any{{"credential": cred, "scheme": "https", "host": "site.sandgate.test", "port": 8443, "path_prefix": "/app/"}}}, 403},
		{"bind to the wildcard's parent", e.keyA, map[string]any{"credentials": []map[string]any{{"credential": cred, "scheme": "https", "host": "qa.sandgate.test"}}}, 403},
		{"fill the value of a credential that does not allow it", e.keyA, map[string]any{"credentials": []map[string]any{{"credential": cred, "scheme": "https", "host": "site.sandgate.test", "path_prefix": "/app/", "fill": "value"}}}, 403},
	} {
		st, body := e.api(t, tc.key, "POST", "/v1/sessions", tc.req)
		if st != tc.status || !strings.Contains(string(body), `"error":{"code"`) {
			t.Errorf("%s: %d %s, want %d with a JSON error", tc.name, st, body, tc.status)
		}
		if strings.Contains(string(body), e.canary) {
			t.Errorf("%s: the answer carries the secret", tc.name)
		}
	}
	for _, tc := range []struct {
		name string
		req  any
	}{
		{"unknown kind", map[string]any{"name": "x", "kind": "magic", "secret": "s"}},
		{"no secret", map[string]any{"name": "x", "kind": "bearer"}},
		{"basic without user", map[string]any{"name": "x", "kind": "basic", "secret": "s"}},
		{"header without name", map[string]any{"name": "x", "kind": "header", "secret": "s"}},
		{"secret with a line break", map[string]any{"name": "x", "kind": "bearer", "secret": "a\r\nX-Evil: 1"}},
		{"unknown field", map[string]any{"name": "x", "kind": "bearer", "secret": "s", "owner": "me"}},
		{"no destinations", map[string]any{"name": "x", "kind": "bearer", "secret": "s"}},
		{"a destination everywhere", map[string]any{"name": "x", "kind": "bearer", "secret": "s", "destinations": []map[string]any{{"scheme": "https", "host": "*"}}}},
		{"a destination over a public suffix", map[string]any{"name": "x", "kind": "bearer", "secret": "s", "destinations": []map[string]any{{"scheme": "https", "host": "*.com"}}}},
		{"a destination with a bad scheme", map[string]any{"name": "x", "kind": "bearer", "secret": "s", "destinations": []map[string]any{{"scheme": "ftp", "host": "site.sandgate.test"}}}},
		{"a destination with a dirty path", map[string]any{"name": "x", "kind": "bearer", "secret": "s", "destinations": []map[string]any{{"scheme": "https", "host": "site.sandgate.test", "path_prefix": "/a/../b"}}}},
	} {
		if st, body := e.api(t, e.keyA, "POST", "/v1/credentials", tc.req); st != 400 {
			t.Errorf("credential %s: %d %s, want 400", tc.name, st, body)
		}
	}
	if st, _ := e.api(t, e.keyB, "GET", "/v1/credentials/"+cred, nil); st != 404 {
		t.Errorf("another tenant's credential: %d, want 404", st)
	}
	if st, _ := e.api(t, e.keyB, "DELETE", "/v1/credentials/"+cred, nil); st != 404 {
		t.Errorf("deleting another tenant's credential: %d, want 404", st)
	}
	if after := len(e.listSessions(t, e.keyA)); after != before {
		t.Errorf("bad requests left sessions behind: %d before, %d after", before, after)
	}
	if st, _ := e.api(t, e.keyA, "DELETE", "/v1/credentials/"+cred, nil); st != 204 {
		t.Errorf("delete credential: %d", st)
	}
}

func (e *testEnv) listSessions(t *testing.T, key string) []sessionInfo {
	t.Helper()
	_, body := e.api(t, key, "GET", "/v1/sessions", nil)
	var l struct{ Sessions []sessionInfo }
	json.Unmarshal(body, &l)
	var live []sessionInfo
	for _, s := range l.Sessions {
		if s.State == "running" || s.State == "starting" {
			live = append(live, s)
		}
	}
	return live
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
