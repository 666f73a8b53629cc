package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// fillPort is the port of the fill tests' login site on the test hosts.
const fillPort = "8181"

// fillSite is a login form at /app/login.html (and the same form at
// /apparel/login.html, outside the prefix /app), posting to /app/login.
// It remembers the passwords it was sent.
type fillSite struct {
	mu   sync.Mutex
	seen []string
}

var (
	fillOnce    sync.Once
	fillSiteErr error
	theFillSite = &fillSite{}
)

func (e *testEnv) fillSite(t *testing.T) *fillSite {
	t.Helper()
	fillOnce.Do(func() {
		form := `<!doctype html><html><head><title>log in</title></head><body>
<form method="post" action="/app/login"><input id="user" name="user"><input id="pass" name="pass" type="password">
<button id="submit" type="submit">Log in</button></form></body></html>`
		mux := http.NewServeMux()
		for _, p := range []string{"GET /app/login.html", "GET /apparel/login.html"} {
			mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, form) })
		}
		mux.HandleFunc("POST /app/login", func(w http.ResponseWriter, r *http.Request) {
			pass := r.FormValue("pass")
			theFillSite.mu.Lock()
			theFillSite.seen = append(theFillSite.seen, pass)
			theFillSite.mu.Unlock()
			title := "denied"
			if r.FormValue("user") == basicUser && strings.HasPrefix(pass, "fill-secret-") {
				title = "welcome"
			}
			fmt.Fprintf(w, `<!doctype html><html><head><title>%s</title></head><body>%s</body></html>`, title, title)
		})
		fillSiteErr = e.hosts.serve(sitesIP+":"+fillPort, nil, mux)
	})
	if fillSiteErr != nil {
		t.Fatal(fillSiteErr)
	}
	return theFillSite
}

func (f *fillSite) saw(secret string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.seen {
		if s == secret {
			return true
		}
	}
	return false
}

// TestFillCredential: fill_credential types only credentials bound to the
// session, only on a page of the binding (scheme, host, port, path prefix
// at a segment boundary); by default it types a placeholder that the
// egress proxy swaps for the secret on the way to the bound site, so the
// page, and the agent reading it, never holds the secret. A binding that
// opts in to "value" gets the real value typed (the control that shows
// the agent could read a typed secret).
func TestFillCredential(t *testing.T) {
	e := needE2E(t)
	site := e.fillSite(t)
	secret, valueSecret := "fill-secret-"+randHex(12), "fill-secret-"+randHex(12)
	create := func(name, secret string) string {
		t.Helper()
		st, body := e.api(t, e.keyA, "POST", "/v1/credentials", map[string]any{"name": name, "kind": "form", "username": basicUser, "secret": secret,
			"destinations":     []map[string]any{{"scheme": "http", "host": "login.sandgate.test", "port": 8181, "path_prefix": "/app"}},
			"allow_value_fill": strings.Contains(name, "value")})
		if st != 201 || strings.Contains(string(body), secret) {
			t.Fatalf("create credential: %d %s", st, body)
		}
		id := jsonField(body, "id")
		t.Cleanup(func() { e.api(t, e.keyA, "DELETE", "/v1/credentials/"+id, nil) })
		return id
	}
	placeholder := create("fill placeholder", secret)
	value := create("fill value", valueSecret)
	unbound := create("fill unbound", "fill-secret-"+randHex(12))
	loginHost := "login.sandgate.test"
	s := e.createSession(t, e.keyA, map[string]any{
		"egress": map[string]any{"allow": []string{loginHost + ":" + fillPort, loginHost + ":80"}},
		"credentials": []map[string]any{
			{"credential": placeholder, "scheme": "http", "host": loginHost, "port": 8181, "path_prefix": "/app"},
			{"credential": value, "scheme": "http", "host": loginHost, "port": 8181, "path_prefix": "/app", "fill": "value"},
		},
	})
	ctx := e.cdpContext(t, s.ID)
	base := "http://" + loginHost + ":" + fillPort
	fill := func(cred, field, sel string) (int, []byte) {
		t.Helper()
		st, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/actions",
			map[string]any{"action": "fill_credential", "credential": cred, "field": field, "selector": sel})
		for _, x := range []string{secret, valueSecret} {
			if strings.Contains(string(body), x) {
				t.Fatalf("the fill answer holds a secret: %s", body)
			}
		}
		return st, body
	}
	open := func(t *testing.T, u string) {
		t.Helper()
		if title, err := navigateTitle(ctx, u); err != nil || title != "log in" {
			t.Fatalf("%s: %q, %v", u, title, err)
		}
	}
	fieldValue := func(t *testing.T, sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("`+sel+`").value`))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	submit := func(t *testing.T) string {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#submit"))); err != nil {
			t.Fatal(err)
		}
		title := ""
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
			if title, _ = chromedp.Run(ctx, chromedp.Title()); title == "welcome" || title == "denied" {
				break
			}
			chromedp.Do(ctx, chromedp.Sleep(100*time.Millisecond))
		}
		return title
	}

	t.Run("placeholder", func(t *testing.T) {
		open(t, base+"/app/login.html")
		for _, f := range []struct{ field, sel string }{{"username", "#user"}, {"secret", "#pass"}} {
			if st, body := fill(placeholder, f.field, f.sel); st != 200 {
				t.Fatalf("fill %s: %d %s", f.field, st, body)
			}
		}
		if got := fieldValue(t, "#user"); got != basicUser {
			t.Fatalf("username field holds %q", got)
		}
		got := fieldValue(t, "#pass")
		if got == secret || !strings.HasPrefix(got, "sgph_") || len(got) != len("sgph_")+32 {
			t.Fatalf("the password field holds %q, want the placeholder (sgph_ and 32 hex digits), never the secret", redactSecret(got, secret))
		}
		if title := submit(t); title != "welcome" {
			t.Fatalf("login with the placeholder: %q (the proxy should have swapped in the secret)", title)
		}
		if !site.saw(secret) {
			t.Fatal("the login site never received the secret")
		}
		if site.saw(got) {
			t.Fatal("the login site received the placeholder itself")
		}
	})

	t.Run("value-opt-in", func(t *testing.T) {
		open(t, base+"/app/login.html")
		for _, f := range []struct{ field, sel string }{{"username", "#user"}, {"secret", "#pass"}} {
			if st, body := fill(value, f.field, f.sel); st != 200 {
				t.Fatalf("fill %s: %d %s", f.field, st, body)
			}
		}
		// The control: with the opt-in the agent can read the secret,
		// which is why it is not the default.
		if got := fieldValue(t, "#pass"); got != valueSecret {
			t.Fatal("with fill \"value\" the password field does not hold the secret")
		}
		if title := submit(t); title != "welcome" {
			t.Fatalf("login with the value: %q", title)
		}
	})

	t.Run("refused", func(t *testing.T) {
		for _, tc := range []struct {
			name, page, cred string
		}{
			{"unbound credential", base + "/app/login.html", unbound},
			{"same host, another port", "http://" + loginHost + "/login.html", placeholder},
			{"outside the path prefix at a segment boundary", base + "/apparel/login.html", placeholder},
			{"value binding on another port", "http://" + loginHost + "/login.html", value},
		} {
			t.Run(tc.name, func(t *testing.T) {
				open(t, tc.page)
				st, body := fill(tc.cred, "secret", "#pass")
				if st != 403 || !strings.Contains(string(body), `"permission_denied"`) {
					t.Fatalf("%d %s, want 403 permission_denied", st, body)
				}
				if !strings.Contains(string(body), `"message"`) {
					t.Fatalf("the refusal says nothing: %s", body)
				}
				if got := fieldValue(t, "#pass"); got != "" {
					t.Fatalf("the refused fill typed %d characters", len(got))
				}
			})
		}
		// Control: the same page, the same field, a bound credential on
		// its binding: filled.
		open(t, base+"/app/login.html")
		if st, body := fill(placeholder, "secret", "#pass"); st != 200 || fieldValue(t, "#pass") == "" {
			t.Fatalf("control fill: %d %s", st, body)
		}
	})

	t.Run("audit", func(t *testing.T) {
		st, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID+"/events", nil)
		if st != 200 {
			t.Fatalf("events: %d", st)
		}
		for _, x := range []string{secret, valueSecret} {
			if strings.Contains(string(body), x) {
				t.Fatal("a secret is in the audit trail")
			}
		}
		var trail struct {
			Events []struct {
				Type   string         `json:"type"`
				Fields map[string]any `json:"fields"`
			} `json:"events"`
		}
		if err := json.Unmarshal(body, &trail); err != nil {
			t.Fatal(err)
		}
		has := func(typ string, want map[string]any) bool {
			for _, ev := range trail.Events {
				if ev.Type != typ {
					continue
				}
				ok := true
				for k, v := range want {
					ok = ok && ev.Fields[k] == v
				}
				if ok {
					return true
				}
			}
			return false
		}
		for _, c := range []struct {
			typ  string
			want map[string]any
		}{
			{"fill_credential", map[string]any{"credential": placeholder, "field": "secret", "mode": "placeholder"}},
			{"fill_credential", map[string]any{"credential": value, "field": "secret", "mode": "value"}},
			{"fill_credential_denied", map[string]any{"credential": unbound, "reason": "not_bound"}},
			{"fill_credential_denied", map[string]any{"credential": placeholder, "reason": "origin"}},
			{"fill_credential_denied", map[string]any{"credential": value, "reason": "origin"}},
		} {
			if !has(c.typ, c.want) {
				t.Errorf("the audit trail has no %s with %v", c.typ, c.want)
			}
		}
	})
}

func redactSecret(s, secret string) string {
	if s == secret {
		return "<the secret>"
	}
	return s
}
