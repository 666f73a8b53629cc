package test

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"
)

// TestCredentials: test accounts log in with secrets the sandbox never
// holds. The proxy adds basic and bearer credentials to the bound HTTPS
// hosts it intercepts with the session's own CA, and fill_credential types
// a password into a form from the gateway's side.
func TestCredentials(t *testing.T) {
	e := needE2E(t)
	create := func(req map[string]any) string {
		t.Helper()
		req["secret"] = e.canary
		st, body := e.api(t, e.keyA, "POST", "/v1/credentials", req)
		if st != 201 || strings.Contains(string(body), e.canary) {
			t.Fatalf("create credential: %d %s (the secret must not come back)", st, body)
		}
		return jsonField(body, "id")
	}
	basic := create(map[string]any{"name": "qa basic", "kind": "basic", "username": basicUser, "destinations": []map[string]any{
		{"scheme": "https", "host": "basic.sandgate.test"}, {"scheme": "http", "host": "login.sandgate.test"}}})
	bearer := create(map[string]any{"name": "qa token", "kind": "bearer", "destinations": []map[string]any{{"scheme": "https", "host": "bearer.sandgate.test"}}})
	for _, path := range []string{"/v1/credentials", "/v1/credentials/" + basic} {
		if st, body := e.api(t, e.keyA, "GET", path, nil); st != 200 || strings.Contains(string(body), e.canary) || !strings.Contains(string(body), basic) {
			t.Fatalf("GET %s: %d %s", path, st, body)
		}
	}

	s := e.createSession(t, e.keyA, map[string]any{
		"egress": map[string]any{"allow": []string{"login.sandgate.test:80"}},
		"credentials": []map[string]any{
			{"credential": basic, "scheme": "https", "host": "basic.sandgate.test"},
			// fill_credential types only on a page of a binding; the page
			// gets a placeholder that the proxy swaps on the way out.
			{"credential": basic, "scheme": "http", "host": "login.sandgate.test"},
			{"credential": bearer, "scheme": "https", "host": "bearer.sandgate.test", "path_prefix": "/"},
		},
	})
	ctx := e.cdpContext(t, s.ID)

	// Everything the agent's CDP connection can observe of the network.
	var mu sync.Mutex
	var observed []string
	if err := chromedp.Listen(ctx, func(ev any) {
		raw, _ := json.Marshal(ev)
		mu.Lock()
		observed = append(observed, string(raw))
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}

	t.Run("proxy-adds-credentials", func(t *testing.T) {
		// No certificate errors are ignored here: Chromium trusts the
		// session's CA by key hash, for the bound hosts the proxy
		// intercepts.
		if title, err := navigateTitle(ctx, "https://basic.sandgate.test/"); err != nil || title != "basic ok" {
			t.Fatalf("site behind basic auth: %q, %v", title, err)
		}
		if title, err := navigateTitle(ctx, "https://bearer.sandgate.test/"); err != nil || title != "bearer ok" {
			t.Fatalf("site behind a bearer token: %q, %v", title, err)
		}
	})

	t.Run("fill-credential", func(t *testing.T) {
		if title, err := navigateTitle(ctx, "http://login.sandgate.test/login.html"); err != nil || title != "log in" {
			t.Fatalf("login form: %q, %v", title, err)
		}
		for _, f := range []struct{ field, sel string }{{"username", "#user"}, {"secret", "#pass"}} {
			st, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/actions",
				map[string]any{"action": "fill_credential", "credential": basic, "field": f.field, "selector": f.sel})
			if st != 200 || strings.Contains(string(body), e.canary) || strings.Contains(string(body), basicUser) {
				t.Fatalf("fill_credential %s: %d %s", f.field, st, body)
			}
		}
		if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#submit"))); err != nil {
			t.Fatal(err)
		}
		if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("body"))); err != nil {
			t.Fatal(err)
		}
		deadlineTitle := ""
		for i := 0; i < 50 && deadlineTitle != "welcome"; i++ {
			deadlineTitle, _ = chromedp.Run(ctx, chromedp.Title())
			if deadlineTitle != "welcome" {
				chromedp.Do(ctx, chromedp.Sleep(100e6))
			}
		}
		if deadlineTitle != "welcome" {
			t.Fatalf("after fill_credential the login page says %q", deadlineTitle)
		}
		for _, tc := range []struct {
			name   string
			key    string
			req    map[string]any
			status int
		}{
			{"missing field on the page", e.keyA, map[string]any{"action": "fill_credential", "credential": basic, "selector": "#nothing-here"}, 409},
			{"another tenant's session", e.keyB, map[string]any{"action": "fill_credential", "credential": basic, "selector": "#pass"}, 404},
			{"unknown credential", e.keyA, map[string]any{"action": "fill_credential", "credential": "cred_0000000000000000", "selector": "#pass"}, 403},
			{"bearer has no username", e.keyA, map[string]any{"action": "fill_credential", "credential": bearer, "field": "username", "selector": "#user"}, 403},
		} {
			st, body := e.api(t, tc.key, "POST", "/v1/sessions/"+s.ID+"/actions", tc.req)
			if st != tc.status || strings.Contains(string(body), e.canary) {
				t.Errorf("%s: %d %s, want %d", tc.name, st, body, tc.status)
			}
		}
	})

	t.Run("secret-absent-from-session", func(t *testing.T) {
		// The search pattern is written so that the command line does not
		// contain the secret itself.
		pat := "c[a]" + strings.TrimPrefix(e.canary, "ca")
		script := `env | grep -c -- '` + pat + `';
cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' '\n' | grep -c -- '` + pat + `';
ps auxww | grep -c -- '` + pat + `';
grep -rlas -- '` + pat + `' /tmp /home /run /dev/shm /etc /var 2>/dev/null | head; echo done`
		out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"bash", "-c", script}, "timeout_seconds": 120})
		if got := string(out.Stdout); got != "0\n0\n0\ndone\n" {
			t.Fatalf("the secret shows up in the session (env, processes, ps, files): %q %q", got, out.Stderr)
		}
		mu.Lock()
		all := strings.Join(observed, "\n")
		n := len(observed)
		mu.Unlock()
		if n == 0 {
			t.Fatal("the agent observed no CDP events at all; the check below would prove nothing")
		}
		if strings.Contains(all, e.canary) {
			t.Fatalf("the secret is in a CDP event the agent can observe")
		}
		if !strings.Contains(all, "basic.sandgate.test") {
			t.Fatalf("the agent's CDP events do not mention the bound site; were network events observed at all?")
		}
	})

	t.Run("audit", func(t *testing.T) {
		st, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID+"/events", nil)
		if st != 200 || strings.Contains(string(body), e.canary) {
			t.Fatalf("events: %d (the secret must not be in them)", st)
		}
		for _, want := range []string{`"credential_used"`, `"fill_credential"`, `"credential":"` + basic + `"`, `"credential":"` + bearer + `"`} {
			if !strings.Contains(string(body), want) {
				t.Errorf("audit trail lacks %s: %s", want, body)
			}
		}
	})
}
