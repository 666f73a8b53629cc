package egress

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// TestProxyPlaceholders: a session's placeholder for a form credential,
// sent to a bound destination, reaches the login server as the secret,
// encoded for the body (form, JSON, multipart) or the query, with a true
// Content-Length, over plain HTTP and intercepted HTTPS; the server's
// echo of the secret comes back masked. Sent to an unbound path, an
// unbound host, or in another session's form, the placeholder arrives as
// a placeholder. A body over the bound is passed on unchanged.
func TestProxyPlaceholders(t *testing.T) {
	const secret = `p@ss w0rd&"x"+/`
	const user = "qa-user"
	type got struct {
		path, pass, auth string
		length           int64
		bodyLen          int
	}
	var mu sync.Mutex
	var seen []got
	login := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		g := got{path: r.URL.Path, auth: r.Header.Get("Authorization"), length: r.ContentLength, bodyLen: len(raw)}
		ct := r.Header.Get("Content-Type")
		switch {
		case r.URL.Query().Get("pw") != "":
			g.pass = r.URL.Query().Get("pw")
		case strings.HasPrefix(ct, "application/json"):
			var v struct{ Password string }
			json.Unmarshal(raw, &v)
			g.pass = v.Password
		case strings.HasPrefix(ct, "multipart/form-data"):
			r.Body = io.NopCloser(bytes.NewReader(raw))
			r.ParseMultipartForm(1 << 20)
			g.pass = r.FormValue("pass")
		case len(raw) > MaxPlaceholderBody:
			g.pass = string(raw[:len("sgph_")+32])
		default:
			v, _ := url.ParseQuery(string(raw))
			g.pass = v.Get("pass")
		}
		mu.Lock()
		seen = append(seen, g)
		mu.Unlock()
		// A failed login page that fills the password back in.
		fmt.Fprintf(w, `<form><input name="user" value="%s"><input name="pass" value="%s"></form>`, user, g.pass)
	})
	up := httptest.NewServer(login)
	defer up.Close()
	tlsUp := httptest.NewTLSServer(login)
	defer tlsUp.Close()
	port := uint16(up.Listener.Addr().(*net.TCPAddr).Port)
	tlsPort := uint16(tlsUp.Listener.Addr().(*net.TCPAddr).Port)

	const cred = "cred_00000000000000f1"
	bindings := []Binding{
		{Credential: cred, Scheme: "http", Host: "login.example.test", Port: port, PathPrefix: "/login"},
		{Credential: cred, Scheme: "http", Host: "login.example.test", Port: port, PathPrefix: "/api/"},
		{Credential: cred, Scheme: "https", Host: "secure.example.com", Port: tlsPort, PathPrefix: "/login"},
	}
	for i := range bindings {
		if err := CheckBinding(&bindings[i]); err != nil || bindings[i].Fill != FillPlaceholder {
			t.Fatalf("binding: %v, fill %q", err, bindings[i].Fill)
		}
	}
	var allow []Pattern
	for _, a := range []string{fmt.Sprintf("elsewhere.example.test:%d", port), fmt.Sprintf("elsewhere.example.com:%d", tlsPort)} {
		p, _ := ParsePattern(a)
		allow = append(allow, p)
	}
	secrets := secretsMap{cred: {Kind: KindForm, Username: user, Secret: secret, Destinations: bindings}}
	ph, other := secrets.Placeholder("s", cred), secrets.Placeholder("s2", cred)
	var audit []string
	caSecret := bytes.Repeat([]byte{7}, 32)
	roots := x509.NewCertPool()
	roots.AddCert(tlsUp.Certificate())
	loop := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	p := New(Config{
		Resolver:      NewResolver("", map[string][]netip.Addr{"login.example.test": loop, "secure.example.com": loop, "elsewhere.example.test": loop, "elsewhere.example.com": loop}),
		Exempt:        []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		UpstreamRoots: roots,
		CASecret:      caSecret,
		Audit: func(_, typ string, f map[string]any) {
			mu.Lock()
			audit = append(audit, fmt.Sprint(typ, " ", f["via"], f["reason"]))
			mu.Unlock()
		},
	}, onePolicy{Policy{Session: "s", Tenant: "t", Allow: allow, Bindings: bindings}}, secrets)
	addr := startProxy(t, p)
	ca, err := NewCA(caSecret, "s")
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := ca.Certificate("secure.example.com")
	caCert, _ := x509.ParseCertificate(leaf.Certificate[1])
	sessionRoots := x509.NewCertPool()
	sessionRoots.AddCert(caCert)
	client := proxyClient(addr, sessionRoots)

	form := func(pass string) (string, io.Reader) {
		return "application/x-www-form-urlencoded", strings.NewReader(url.Values{"user": {user}, "pass": {pass}}.Encode())
	}
	jsonBody := func(pass string) (string, io.Reader) {
		b, _ := json.Marshal(map[string]string{"user": user, "password": pass})
		return "application/json", bytes.NewReader(b)
	}
	multi := func(pass string) (string, io.Reader) {
		var b bytes.Buffer
		mw := multipart.NewWriter(&b)
		mw.WriteField("user", user)
		mw.WriteField("pass", pass)
		mw.Close()
		return mw.FormDataContentType(), &b
	}
	huge := func(pass string) (string, io.Reader) {
		return "text/plain", bytes.NewReader(append([]byte(pass), make([]byte, MaxPlaceholderBody)...))
	}
	for _, tc := range []struct {
		name string
		url  string
		body func(string) (string, io.Reader)
		pass string // what the placeholder is sent as
		want string // what the server must get
	}{
		{"form", "http://login.example.test:%[1]d/login", form, ph, secret},
		{"json", "http://login.example.test:%[1]d/api/session", jsonBody, ph, secret},
		{"multipart", "http://login.example.test:%[1]d/login/multi", multi, ph, secret},
		// Not in a query, nor in a GET: a page that writes its query
		// back would show the secret.
		{"query", "http://login.example.test:%[1]d/login?pw=" + ph, nil, ph, ph},
		{"https-form", "https://secure.example.com:%[2]d/login", form, ph, secret},
		{"unbound-path", "http://login.example.test:%[1]d/other", form, ph, ph},
		{"path-beside-prefix", "http://login.example.test:%[1]d/loginx", form, ph, ph},
		{"dot-segments-out", "http://login.example.test:%[1]d/login/../other", form, ph, ph},
		{"unbound-host", "http://elsewhere.example.test:%[1]d/login", form, ph, ph},
		{"https-unbound-host", "https://elsewhere.example.com:%[2]d/login", form, ph, ph},
		{"https-unbound-path", "https://secure.example.com:%[2]d/other", form, ph, ph},
		{"other-session", "http://login.example.test:%[1]d/login", form, other, other},
		{"body-over-the-bound", "http://login.example.test:%[1]d/login", huge, ph, ph},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := fmt.Sprintf(tc.url, port, tlsPort)
			var req *http.Request
			var err error
			if tc.body == nil {
				req, err = http.NewRequest("GET", u, nil)
			} else {
				ct, body := tc.body(tc.pass)
				req, err = http.NewRequest("POST", u, body)
				req.Header.Set("Content-Type", ct)
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(u, "elsewhere") {
				// Unbound HTTPS is tunnelled: the client checks the
				// upstream's own certificate.
				client = proxyClient(addr, roots)
				defer func() { client = proxyClient(addr, sessionRoots) }()
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			page, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			mu.Lock()
			g := seen[len(seen)-1]
			mu.Unlock()
			if resp.StatusCode != 200 || g.pass != tc.want {
				t.Fatalf("%d: the server got %q, want %q", resp.StatusCode, g.pass, tc.want)
			}
			if g.auth != "" {
				t.Errorf("a form credential put %q in a header", g.auth)
			}
			if tc.body != nil && g.length != int64(g.bodyLen) {
				t.Errorf("Content-Length %d for a body of %d bytes", g.length, g.bodyLen)
			}
			if strings.Contains(string(page), secret) || strings.Contains(string(page), url.QueryEscape(secret)) {
				t.Errorf("the echoed secret reached the session: %s", page)
			}
			if !strings.Contains(string(page), `value="`+user+`"`) {
				t.Errorf("control: the page lost what is no secret: %s", page)
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	joined := strings.Join(audit, "\n")
	if n := strings.Count(joined, "credential_used placeholder"); n != 4 {
		t.Errorf("%d credential_used placeholder events, want 4:\n%s", n, joined)
	}
	if !strings.Contains(joined, "placeholder_not_swapped") {
		t.Errorf("no placeholder_not_swapped event:\n%s", joined)
	}
	if strings.Contains(joined, "via header") {
		t.Errorf("a form credential was used as a header:\n%s", joined)
	}
}

// A body full of placeholders is not expanded (each would grow it by the
// secret); a login form's one or two are (the control).
func TestSwapBounded(t *testing.T) {
	const ph, secret = "sgph_00112233445566778899aabbccddeeff", "a-long-secret-value"
	sw := []swap{{placeholder: ph, secret: secret}}
	for _, tc := range []struct {
		n       int
		swapped bool
	}{{1, true}, {MaxPlaceholderSwaps, true}, {MaxPlaceholderSwaps + 1, false}, {20000, false}} {
		body := strings.Repeat("p="+ph+"&", tc.n)
		r, _ := http.NewRequest("POST", "http://login.example/", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		res, err := swapPlaceholders(r, sw)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(r.Body)
		if tc.swapped != strings.Contains(string(got), secret) || tc.swapped == res.tooLarge || len(got) > len(body)+MaxPlaceholderSwaps*len(secret) {
			t.Errorf("%d placeholders: swapped %v, tooLarge %v, %d bytes from %d", tc.n, strings.Contains(string(got), secret), res.tooLarge, len(got), len(body))
		}
	}
}

// TestSwapOnlySubmissions: a placeholder is swapped in the body of a
// POST, PUT or PATCH only; in a query, or in the body of any other
// method, it stays a placeholder.
func TestSwapOnlySubmissions(t *testing.T) {
	const ph, secret = "sgph_0123456789abcdef0123456789abcdef", "hunter2"
	sw := []swap{{placeholder: ph, secret: secret}}
	for _, method := range []string{"POST", "PUT", "PATCH", "GET", "DELETE", "OPTIONS", "HEAD"} {
		r, _ := http.NewRequest(method, "http://login.example/login?q="+ph, strings.NewReader("pass="+ph))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		res, err := swapPlaceholders(r, sw)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(r.Body)
		want := method == "POST" || method == "PUT" || method == "PATCH"
		if got := string(body) == "pass="+secret; got != want || res.swapped[ph] != want {
			t.Errorf("%s: body %q, swapped %v; want swapped %v", method, body, res.swapped[ph], want)
		}
		if r.URL.RawQuery != "q="+ph {
			t.Errorf("%s: the query became %q", method, r.URL.RawQuery)
		}
	}
}
