package test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

type adminTenant struct {
	Name        string `json:"name"`
	Source      string `json:"source"`
	Disabled    bool   `json:"disabled"`
	MaxSessions int    `json:"max_sessions"`
	Usage       struct {
		Sessions int `json:"sessions"`
	} `json:"usage"`
}

type adminKey struct {
	ID         string     `json:"id"`
	Prefix     string     `json:"prefix"`
	APIKey     string     `json:"api_key"`
	LastUsedAt *time.Time `json:"last_used_at"`
}

func (e *testEnv) admin(t testing.TB, method, path string, body any, want int, out any) []byte {
	t.Helper()
	status, raw := e.api(t, e.adminKey, method, "/admin/v1"+path, body)
	if status != want {
		t.Fatalf("%s /admin/v1%s: %d %s, want %d", method, path, status, raw, want)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %v %s", method, path, err, raw)
		}
	}
	return raw
}

// TestAdminTenantsAndKeys: a tenant and a key made through the admin API
// work at once, without a restart; a revoked key stops within a second;
// a disabled tenant's keys and open previews stop; all of it survives a
// restart. Each refusal has its control beside it.
func TestAdminTenantsAndKeys(t *testing.T) {
	e := needE2E(t)
	name := "team-" + randHex(4)

	// Who may use the admin API: the admin key only.
	var list struct{ Tenants []adminTenant }
	e.admin(t, "GET", "/tenants", nil, 200, &list)
	if len(list.Tenants) < 3 || list.Tenants[0].Name != "tenant-a" || list.Tenants[0].Source != "config" {
		t.Fatalf("tenants: %+v", list.Tenants)
	}
	for _, key := range []string{"", e.keyA, "sg_admin_wrong"} {
		if st, body := e.api(t, key, "GET", "/admin/v1/tenants", nil); st != 401 || !bytes.Contains(body, []byte("unauthenticated")) {
			t.Fatalf("the admin API with key %q: %d %s", key, st, body)
		}
	}
	if st, _ := e.api(t, e.adminKey, "GET", "/v1/sessions", nil); st != 401 {
		t.Fatalf("the admin key on the tenant API: %d", st)
	}

	// Bad input.
	e.admin(t, "POST", "/tenants", map[string]any{"name": "Bad/Name"}, 400, nil)
	e.admin(t, "POST", "/tenants", map[string]any{"name": name, "colour": "red"}, 400, nil)
	e.admin(t, "POST", "/tenants", map[string]any{"name": name, "max_sessions": -1}, 400, nil)
	e.admin(t, "POST", "/tenants", map[string]any{"name": name, "egress_allow": []string{"no port"}}, 400, nil)
	e.admin(t, "POST", "/tenants", map[string]any{}, 400, nil)
	e.admin(t, "GET", "/tenants/"+name, nil, 404, nil)
	e.admin(t, "PATCH", "/tenants/tenant-a", map[string]any{"max_sessions": 100}, 409, nil)

	var tn adminTenant
	e.admin(t, "POST", "/tenants", map[string]any{"name": name, "max_sessions": 1, "max_ttl_seconds": 3600}, 201, &tn)
	if tn.Name != name || tn.Source != "api" || tn.MaxSessions != 1 || tn.Disabled {
		t.Fatalf("created: %+v", tn)
	}
	e.admin(t, "POST", "/tenants", map[string]any{"name": name}, 409, nil)
	var k1, k2 adminKey
	e.admin(t, "POST", "/tenants/"+name+"/keys", map[string]any{"name": "ci"}, 201, &k1)
	e.admin(t, "POST", "/tenants/"+name+"/keys", map[string]any{"name": "laptop"}, 201, &k2)
	if !strings.HasPrefix(k1.APIKey, "sg_") || !strings.HasPrefix(k1.APIKey, k1.Prefix) || k1.APIKey == k2.APIKey {
		t.Fatalf("issued: %+v %+v", k1, k2)
	}
	e.admin(t, "POST", "/tenants/nobody-here/keys", map[string]any{}, 404, nil)

	// The new key works at once, with the tenant's limits: one session.
	s := e.createSession(t, k1.APIKey, nil)
	status, retry, body := e.rawCreate(t, k1.APIKey, map[string]any{})
	checkRetryAfter(t, status, retry, body)
	p := e.preview(t, k1.APIKey, s.ID, 600)
	c := wsDial(t, browserWS(t, p.URL))
	defer c.Close()
	cdpPing(t, c, 1)
	// Another tenant cannot see it.
	if st, _ := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID, nil); st != 404 {
		t.Fatalf("tenant A sees the new tenant's session: %d", st)
	}

	var keys struct{ Keys []adminKey }
	e.admin(t, "GET", "/tenants/"+name+"/keys", nil, 200, &keys)
	raw, _ := json.Marshal(keys)
	if len(keys.Keys) != 2 || keys.Keys[0].LastUsedAt == nil || bytes.Contains(raw, []byte(k1.APIKey)) {
		t.Fatalf("keys: %s", raw)
	}

	// Revoked: refused within a second; the other key still works.
	if st, _ := e.api(t, k2.APIKey, "GET", "/v1/sessions", nil); st != 200 {
		t.Fatalf("k2 before revoke: %d", st)
	}
	e.admin(t, "DELETE", "/tenants/"+name+"/keys/"+k2.ID, nil, 204, nil)
	revoked := time.Now()
	if st, _ := e.api(t, k2.APIKey, "GET", "/v1/sessions", nil); st != 401 || time.Since(revoked) > time.Second {
		t.Fatalf("a revoked key: %d after %s", st, time.Since(revoked))
	}
	if st, _ := e.api(t, k1.APIKey, "GET", "/v1/sessions", nil); st != 200 {
		t.Fatalf("the other key after a revoke: %d", st)
	}
	e.admin(t, "DELETE", "/tenants/"+name+"/keys/"+k2.ID, nil, 404, nil)

	// Disabled: keys refused, the open CDP connection closed, the preview
	// refused, the session stopped.
	closed := make(chan bool, 1)
	go func() { _, ok := closedAt(c, 30*time.Second); closed <- ok }()
	e.admin(t, "PATCH", "/tenants/"+name, map[string]any{"disabled": true}, 200, &tn)
	disabled := time.Now()
	if st, body := e.api(t, k1.APIKey, "GET", "/v1/sessions", nil); st != 403 || !bytes.Contains(body, []byte("disabled")) || time.Since(disabled) > time.Second {
		t.Fatalf("a disabled tenant's key: %d %s", st, body)
	}
	if _, err := browserWSErr(p.URL); err == nil {
		t.Fatal("a disabled tenant's preview still answers discovery")
	}
	if !<-closed {
		t.Fatal("a disabled tenant's open CDP connection stayed open for 30 s")
	}
	t.Logf("open CDP connection closed %s after the disable", time.Since(disabled).Round(time.Millisecond))
	deadline := time.Now().Add(time.Minute)
	for {
		var got adminTenant
		e.admin(t, "GET", "/tenants/"+name, nil, 200, &got)
		if got.Usage.Sessions == 0 && got.Disabled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a disabled tenant still holds sessions: %+v", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.admin(t, "PATCH", "/tenants/"+name, map[string]any{"disabled": false}, 200, nil)
	if st, _ := e.api(t, k1.APIKey, "GET", "/v1/sessions", nil); st != 200 {
		t.Fatalf("enabled again: %d", st)
	}
	e.admin(t, "PATCH", "/tenants/"+name, map[string]any{"max_sessions": 2}, 200, &tn)
	if tn.MaxSessions != 2 {
		t.Fatalf("raised: %+v", tn)
	}

	// A restart keeps all of it; the keys appear in no log.
	e.stopGateway(syscall.SIGTERM)
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.api(t, k1.APIKey, "GET", "/v1/sessions", nil); st != 200 {
		t.Fatalf("the key after a restart: %d", st)
	}
	if st, _ := e.api(t, k2.APIKey, "GET", "/v1/sessions", nil); st != 401 {
		t.Fatalf("the revoked key after a restart: %d", st)
	}
	if u := e.usage(t, k1.APIKey); u.MaxSessions != 2 {
		t.Fatalf("the raised limit after a restart: %+v", u)
	}
	e.admin(t, "PATCH", "/tenants/"+name, map[string]any{"disabled": true}, 200, nil)
	logs, _ := os.ReadFile(e.gwLog)
	for _, k := range []string{k1.APIKey, k2.APIKey} {
		if bytes.Contains(logs, []byte(k)) {
			t.Fatal("an issued key is in the gateway's log")
		}
	}
}

// TestAdminCLI: the CLI makes a tenant and a key; the key works with the
// tenant CLI at once; a revoked one is refused; a wrong admin key fails.
func TestAdminCLI(t *testing.T) {
	e := needE2E(t)
	run := func(env []string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command(e.bin, args...)
		cmd.Env = append(os.Environ(), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String() + stderr.String(), err
	}
	admin := []string{"SANDGATE_URL=" + e.gwURL, "SANDGATE_ADMIN_KEY=" + e.adminKey}
	name := "cli-" + randHex(4)
	if out, err := run(admin, "admin", "tenants", "create", name, "-max-sessions", "3", "-max-cpus", "2.5", "-egress-allow", "example.com:443"); err != nil || jsonField([]byte(out), "source") != "api" {
		t.Fatalf("create: %v %s", err, out)
	}
	defer e.api(t, e.adminKey, "PATCH", "/admin/v1/tenants/"+name, map[string]any{"disabled": true})
	out, err := run(admin, "admin", "tenants", "get", name)
	var tn struct {
		MaxSessions int      `json:"max_sessions"`
		MaxCPUs     float64  `json:"max_cpus"`
		EgressAllow []string `json:"egress_allow"`
	}
	if err != nil || json.Unmarshal([]byte(out), &tn) != nil || tn.MaxSessions != 3 || tn.MaxCPUs != 2.5 || len(tn.EgressAllow) != 1 {
		t.Fatalf("get: %v %s", err, out)
	}
	out, err = run(admin, "admin", "keys", "issue", name, "-name", "cli")
	key, id := jsonField([]byte(out), "api_key"), jsonField([]byte(out), "id")
	if err != nil || key == "" || id == "" {
		t.Fatalf("issue: %v %s", err, out)
	}
	user := []string{"SANDGATE_URL=" + e.gwURL, "SANDGATE_API_KEY=" + key}
	if out, err := run(user, "session", "list"); err != nil {
		t.Fatalf("the issued key with the tenant CLI: %v %s", err, out)
	}
	if out, err := run(admin, "admin", "keys", "revoke", name, id); err != nil {
		t.Fatalf("revoke: %v %s", err, out)
	}
	if out, err := run(user, "session", "list"); err == nil || !strings.Contains(out, "unauthenticated") {
		t.Fatalf("a revoked key with the tenant CLI: %v %s", err, out)
	}
	bad := []string{"SANDGATE_URL=" + e.gwURL, "SANDGATE_ADMIN_KEY=wrong"}
	if out, err := run(bad, "admin", "tenants", "list"); err == nil || !strings.Contains(out, "unauthenticated") {
		t.Fatalf("a wrong admin key: %v %s", err, out)
	}
	if out, err := run(admin, "admin", "tenants", "update", "tenant-a", "-max-sessions", "1"); err == nil || !strings.Contains(out, "config file") {
		t.Fatalf("update a config tenant's limits: %v %s", err, out)
	}
}
