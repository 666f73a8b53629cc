package test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sandgate/sandgate/profile"
)

// profilePort is the port of the profile tests' site on the test hosts:
// a login form that sets a persistent cookie and writes local storage
// and IndexedDB, and a page that says who is logged in.
const (
	profilePort = "8282"
	profileHost = "login.sandgate.test"
)

type profileSite struct {
	mu     sync.Mutex
	sids   map[string]bool
	logins int
}

var (
	profileSiteOnce sync.Once
	profileSiteErr  error
	theProfileSite  = &profileSite{sids: map[string]bool{}}
)

func (e *testEnv) profileSite(t testing.TB) *profileSite {
	t.Helper()
	profileSiteOnce.Do(func() {
		page := func(title, script string) string {
			return `<!doctype html><html><head><title>` + title + `</title></head><body>` + title + `<script>` + script + `</script></body></html>`
		}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /app/login.html", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, `<!doctype html><html><head><title>log in</title></head><body>
<form method="post" action="/app/login"><input id="user" name="user"><input id="pass" name="pass" type="password">
<button id="submit" type="submit">Log in</button></form></body></html>`)
		})
		mux.HandleFunc("POST /app/login", func(w http.ResponseWriter, r *http.Request) {
			if r.FormValue("user") != basicUser || r.FormValue("pass") != "profile-pass" {
				fmt.Fprint(w, page("denied", ""))
				return
			}
			sid := randHex(16)
			theProfileSite.mu.Lock()
			theProfileSite.sids[sid] = true
			theProfileSite.logins++
			theProfileSite.mu.Unlock()
			http.SetCookie(w, &http.Cookie{Name: "sid", Value: sid, Path: "/", MaxAge: 3600, HttpOnly: true})
			// The page keeps who logged in where a web app would: local
			// storage and IndexedDB.
			fmt.Fprint(w, page("welcome", `localStorage.setItem("who", "`+basicUser+`");
const rq = indexedDB.open("app", 1);
rq.onupgradeneeded = () => rq.result.createObjectStore("kv");
rq.onsuccess = () => { const tx = rq.result.transaction("kv", "readwrite"); tx.objectStore("kv").put("`+basicUser+`", "who");
  tx.oncomplete = () => { document.title = "welcome, stored"; }; };`))
		})
		mux.HandleFunc("GET /app/me", func(w http.ResponseWriter, r *http.Request) {
			c, err := r.Cookie("sid")
			theProfileSite.mu.Lock()
			ok := err == nil && theProfileSite.sids[c.Value]
			theProfileSite.mu.Unlock()
			if ok {
				fmt.Fprint(w, page("logged in as "+basicUser, ""))
				return
			}
			fmt.Fprint(w, page("anonymous", ""))
		})
		profileSiteErr = e.hosts.serve(sitesIP+":"+profilePort, nil, mux)
	})
	if profileSiteErr != nil {
		t.Fatal(profileSiteErr)
	}
	return theProfileSite
}

func (p *profileSite) loginCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logins
}

type profileInfo struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Current  int    `json:"current_version"`
	InUse    bool   `json:"in_use"`
	Versions []struct {
		Version     int    `json:"version"`
		Size        int64  `json:"size"`
		SHA256      string `json:"sha256"`
		StoredBytes int64  `json:"stored_bytes"`
		Session     string `json:"session"`
	} `json:"versions"`
}

func (e *testEnv) newProfile(t testing.TB, key, name string) profileInfo {
	t.Helper()
	st, body := e.api(t, key, "POST", "/v1/profiles", map[string]any{"name": name})
	if st != 201 {
		t.Fatalf("create profile: %d %s", st, body)
	}
	var p profileInfo
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.api(t, key, "DELETE", "/v1/profiles/"+p.ID, nil) })
	return p
}

func (e *testEnv) getProfile(t testing.TB, key, id string) profileInfo {
	t.Helper()
	st, body := e.api(t, key, "GET", "/v1/profiles/"+id, nil)
	if st != 200 {
		t.Fatalf("get profile: %d %s", st, body)
	}
	var p profileInfo
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// profileSession creates a browser session that may reach the profile
// site, with the profile (pid empty: none).
func (e *testEnv) profileSession(t testing.TB, key, pid string, persist bool, extra map[string]any) sessionInfo {
	t.Helper()
	req := map[string]any{"egress": map[string]any{"allow": []string{profileHost + ":" + profilePort}}}
	if pid != "" {
		req["profile"] = map[string]any{"id": pid, "persist": persist}
	}
	for k, v := range extra {
		req[k] = v
	}
	return e.createSession(t, key, req)
}

// stopSession deletes a session and returns its audit trail.
func (e *testEnv) stopSession(t *testing.T, key, id string) []struct {
	Type   string         `json:"type"`
	Fields map[string]any `json:"fields"`
} {
	t.Helper()
	if st, body := e.api(t, key, "DELETE", "/v1/sessions/"+id, nil); st != 200 {
		t.Fatalf("delete %s: %d %s", id, st, body)
	}
	return e.events(t, key, id)
}

func eventOf(evs []struct {
	Type   string         `json:"type"`
	Fields map[string]any `json:"fields"`
}, typ string) (map[string]any, bool) {
	for _, ev := range evs {
		if ev.Type == typ {
			return ev.Fields, true
		}
	}
	return nil, false
}

func pageTitle(t testing.TB, ctx context.Context, u string) string {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.Navigate(u)); err != nil {
		t.Fatalf("open %s: %v", u, err)
	}
	title, err := chromedp.Run(ctx, chromedp.Title())
	if err != nil {
		t.Fatalf("title of %s: %v", u, err)
	}
	return title
}

func evalAwait(t testing.TB, ctx context.Context, js string) string {
	t.Helper()
	out, err := chromedp.Run(ctx, chromedp.Evaluate[string](js, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return out
}

const readIDB = `new Promise(res => { const rq = indexedDB.open("app", 1);
  rq.onupgradeneeded = () => rq.result.createObjectStore("kv");
  rq.onsuccess = () => { const g = rq.result.transaction("kv").objectStore("kv").get("who");
    g.onsuccess = () => res(String(g.result || "")); g.onerror = () => res(""); };
  rq.onerror = () => res(""); })`

// TestProfileLogin: a session logs into the test site (served in the
// test's own namespace) and ends; a second session with the same profile
// is logged in (cookie, local storage, IndexedDB) without typing
// anything; a third without the profile is not.
func TestProfileLogin(t *testing.T) {
	e := needE2E(t)
	site := e.profileSite(t)
	p := e.newProfile(t, e.keyA, "qa user")
	base := "http://" + profileHost + ":" + profilePort

	// 1. Log in, by typing, in a session that writes the profile back.
	s1 := e.profileSession(t, e.keyA, p.ID, true, nil)
	if got := e.getProfile(t, e.keyA, p.ID); !got.InUse {
		t.Errorf("profile not shown in use while %s holds it", s1.ID)
	}
	ctx := e.cdpContext(t, s1.ID)
	if title := pageTitle(t, ctx, base+"/app/me"); title != "anonymous" {
		t.Fatalf("a fresh profile is %q on the site, want anonymous", title)
	}
	if title := pageTitle(t, ctx, base+"/app/login.html"); title != "log in" {
		t.Fatalf("login page: %q", title)
	}
	logins := site.loginCount()
	err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS("#user"), basicUser),
		chromedp.SendKeys(chromedp.CSS("#pass"), "profile-pass"),
		chromedp.Click(chromedp.CSS("#submit")))
	if err != nil {
		t.Fatalf("log in: %v", err)
	}
	// The page stores who logged in, then says so in its title (the
	// submit navigates meanwhile: errors until then are retried).
	var title string
	for deadline := time.Now().Add(30 * time.Second); title != "welcome, stored"; {
		if time.Now().After(deadline) {
			t.Fatalf("log in: the page's title is %q after 30 s", title)
		}
		time.Sleep(100 * time.Millisecond)
		title, _ = chromedp.Run(ctx, chromedp.Title())
	}
	if title := pageTitle(t, ctx, base+"/app/me"); title != "logged in as "+basicUser {
		t.Fatalf("after logging in: %q", title)
	}
	evs := e.stopSession(t, e.keyA, s1.ID)
	saved, ok := eventOf(evs, "profile_saved")
	if !ok {
		t.Fatalf("no profile_saved in the trail: %+v", evs)
	}
	got := e.getProfile(t, e.keyA, p.ID)
	if got.Current != 1 || len(got.Versions) != 1 || got.Versions[0].Session != s1.ID || got.Versions[0].Size == 0 || got.InUse {
		t.Fatalf("after the save: %+v", got)
	}
	t.Logf("profile saved: version 1, %d bytes of tar, %d sealed, in %v ms", got.Versions[0].Size, got.Versions[0].StoredBytes, saved["took_ms"])
	// Sealed at rest: the stored object shows nothing of the profile (a
	// SQLite file's header, the cookie's name), which the gateway's own
	// reading of it does (the control).
	sealed := readObject(t, e.profileBucket(t), "tenant-a/"+p.ID+"/v1.sealed")
	if bytes.Contains(sealed, []byte("SQLite format 3")) || bytes.Contains(sealed, []byte("sandgate.test")) {
		t.Errorf("the stored profile holds plaintext")
	}
	if plain := e.openProfile(t, "tenant-a", p.ID); !bytes.Contains(plain, []byte("SQLite format 3")) || !bytes.Contains(plain, []byte("login.sandgate.test")) {
		t.Errorf("the opened profile lacks the cookie store (%d bytes)", len(plain))
	}

	// 2. The same profile, read only: logged in, nothing typed.
	s2 := e.profileSession(t, e.keyA, p.ID, false, nil)
	ctx2 := e.cdpContext(t, s2.ID)
	if title := pageTitle(t, ctx2, base+"/app/me"); title != "logged in as "+basicUser {
		out := e.execIn(t, e.keyA, s2.ID, map[string]any{"cmd": []string{"sh", "-c", "ls -la ~/.sandgate-profile ~/.sandgate-profile/Default ~/.sandgate-profile/Default/Network; tail -20 /tmp/chromium.log; ps ax"}})
		t.Fatalf("a session with the profile is %q on the site, want logged in; in the session:\n%s%s", title, out.Stdout, out.Stderr)
	}
	if who := evalAwait(t, ctx2, `localStorage.getItem("who") || ""`); who != basicUser {
		t.Errorf("local storage with the profile: %q", who)
	}
	if who := evalAwait(t, ctx2, readIDB); who != basicUser {
		t.Errorf("IndexedDB with the profile: %q", who)
	}
	if site.loginCount() != logins+1 {
		t.Errorf("the site saw %d logins, want 1", site.loginCount()-logins)
	}
	evs = e.stopSession(t, e.keyA, s2.ID)
	if f, ok := eventOf(evs, "profile_restored"); !ok || f["version"] != float64(1) {
		t.Errorf("profile_restored: %v %v", f, ok)
	}
	if _, ok := eventOf(evs, "profile_saved"); ok {
		t.Errorf("a session without persist saved the profile")
	}
	if got := e.getProfile(t, e.keyA, p.ID); got.Current != 1 || len(got.Versions) != 1 {
		t.Errorf("a read-only use changed the profile: %+v", got)
	}

	// 3. Without the profile: not logged in.
	s3 := e.profileSession(t, e.keyA, "", false, nil)
	ctx3 := e.cdpContext(t, s3.ID)
	if title := pageTitle(t, ctx3, base+"/app/me"); title != "anonymous" {
		t.Fatalf("a session without the profile is %q on the site, want anonymous", title)
	}
	if who := evalAwait(t, ctx3, `localStorage.getItem("who") || ""`); who != "" {
		t.Errorf("local storage without the profile: %q", who)
	}
}

// profileObject opens the test's MinIO for the profiles bucket.
func (e *testEnv) profileBucket(t testing.TB) *minio.Client {
	t.Helper()
	c, err := minio.New(e.minioAddr, &minio.Options{Creds: credentials.NewStaticV4("sandgate", "sandgate-test-secret", "")})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const profilesBucket = "sandgate-profiles"

// savedProfile makes a profile with one saved version (a session that
// writes it back, then ends).
func (e *testEnv) savedProfile(t *testing.T, key, name string, extra map[string]any) (profileInfo, sessionInfo) {
	t.Helper()
	p := e.newProfile(t, key, name)
	s := e.profileSession(t, key, p.ID, true, extra)
	evs := e.stopSession(t, key, s.ID)
	if _, ok := eventOf(evs, "profile_saved"); !ok {
		t.Fatalf("no profile_saved: %+v", evs)
	}
	return e.getProfile(t, key, p.ID), s
}

// TestProfileIsolationAndTamper: another tenant cannot read, use, list,
// roll back or delete a profile; a profile version altered in MinIO, or
// another profile's version put in its place, is refused with a clear
// 409 and no session is created; rolling back to a good version (the
// control) starts again.
func TestProfileIsolationAndTamper(t *testing.T) {
	e := needE2E(t)
	e.profileSite(t)
	p, _ := e.savedProfile(t, e.keyA, "tamper", map[string]any{"runtime": "runc"})

	// Another tenant.
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/profiles/" + p.ID}, {"DELETE", "/v1/profiles/" + p.ID},
		{"POST", "/v1/profiles/" + p.ID + "/rollback"},
	} {
		var body any
		if c.method == "POST" {
			body = map[string]any{"version": 0}
		}
		if st, raw := e.api(t, e.keyB, c.method, c.path, body); st != 404 {
			t.Errorf("tenant-b %s %s: %d %s", c.method, c.path, st, raw)
		}
	}
	if _, raw := e.api(t, e.keyB, "GET", "/v1/profiles", nil); strings.Contains(string(raw), p.ID) {
		t.Errorf("tenant-b's list shows tenant-a's profile: %s", raw)
	}
	before := len(e.listSessions(t, e.keyB))
	st, raw := e.api(t, e.keyB, "POST", "/v1/sessions", map[string]any{"runtime": "runc", "profile": map[string]any{"id": p.ID}})
	if st != 404 || jsonErrCode(raw) != "not_found" {
		t.Errorf("tenant-b creates with tenant-a's profile: %d %s", st, raw)
	}
	if n := len(e.listSessions(t, e.keyB)); n != before {
		t.Errorf("tenant-b has %d sessions after a refused create, had %d", n, before)
	}
	if got := e.getProfile(t, e.keyA, p.ID); got.Current != 1 {
		t.Fatalf("the other tenant's tries changed the profile: %+v", got)
	}

	// Tampering in the store.
	mc := e.profileBucket(t)
	ctx := context.Background()
	obj := "tenant-a/" + p.ID + "/v1.sealed"
	orig := readObject(t, mc, obj)
	put := func(data []byte) {
		t.Helper()
		if _, err := mc.PutObject(ctx, profilesBucket, obj, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create := func() (int, []byte) {
		return e.api(t, e.keyA, "POST", "/v1/sessions", map[string]any{"runtime": "runc", "labels": map[string]string{"test": t.Name()},
			"profile": map[string]any{"id": p.ID, "persist": true}})
	}
	// Another profile's version 1 (same tenant, sealed by this gateway).
	q, _ := e.savedProfile(t, e.keyA, "other", map[string]any{"runtime": "runc"})
	other := readObject(t, mc, "tenant-a/"+q.ID+"/v1.sealed")
	flipped := append([]byte(nil), orig...)
	flipped[len(flipped)/2] ^= 0x01
	beforeA := len(e.listSessions(t, e.keyA))
	for _, c := range []struct {
		name string
		data []byte
	}{
		{"a bit flipped", flipped},
		{"cut short", orig[:len(orig)-20]},
		{"another profile's version", other},
	} {
		put(c.data)
		st, raw := create()
		if st != 409 || !strings.Contains(string(raw), "integrity check") || !strings.Contains(string(raw), "not loaded") {
			t.Errorf("%s: %d %s, want 409 naming the integrity check", c.name, st, raw)
		}
		if st == 201 {
			e.api(t, e.keyA, "DELETE", "/v1/sessions/"+jsonField(raw, "id"), nil)
		}
	}
	if n := len(e.listSessions(t, e.keyA)); n != beforeA {
		t.Errorf("refused creates left sessions: %d, had %d", n, beforeA)
	}
	// The control: the original object back, the create works.
	put(orig)
	st, raw = create()
	if st != 201 {
		t.Fatalf("the untouched profile: %d %s", st, raw)
	}
	e.api(t, e.keyA, "DELETE", "/v1/sessions/"+jsonField(raw, "id"), nil)
	// The metadata: pointing the profile at another version in the
	// store is refused too (it is MACed with its tenant).
	metaObj := "tenant-a/" + p.ID + "/profile.json"
	meta := readObject(t, mc, metaObj)
	cur := e.getProfile(t, e.keyA, p.ID).Current
	altered := bytes.Replace(meta, []byte(fmt.Sprintf(`"current_version":%d`, cur)), []byte(fmt.Sprintf(`"current_version":%d`, cur-1)), 1)
	if bytes.Equal(altered, meta) {
		t.Fatalf("the metadata has no current_version %d: %s", cur, meta)
	}
	putMeta := func(data []byte) {
		t.Helper()
		if _, err := mc.PutObject(ctx, profilesBucket, metaObj, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	putMeta(altered)
	if st, raw := create(); st != 409 || !strings.Contains(string(raw), "metadata") {
		t.Errorf("altered metadata: %d %s, want 409", st, raw)
	}
	if st, raw := e.api(t, e.keyA, "GET", "/v1/profiles/"+p.ID, nil); st != 409 {
		t.Errorf("get with altered metadata: %d %s, want 409", st, raw)
	}
	putMeta(meta)
	// Rolling back to a fresh profile gets past a bad version.
	put(flipped)
	if st, raw := e.api(t, e.keyA, "POST", "/v1/profiles/"+p.ID+"/rollback", map[string]any{"version": 0}); st != 200 {
		t.Fatalf("rollback: %d %s", st, raw)
	}
	st, raw = create()
	if st != 201 {
		t.Fatalf("after rolling back to a fresh profile: %d %s", st, raw)
	}
	e.api(t, e.keyA, "DELETE", "/v1/sessions/"+jsonField(raw, "id"), nil)
	if st, raw := e.api(t, e.keyA, "POST", "/v1/profiles/"+p.ID+"/rollback", map[string]any{"version": 9}); st != 400 {
		t.Errorf("rollback to a version never saved: %d %s", st, raw)
	}
}

func readObject(t testing.TB, mc *minio.Client, key string) []byte {
	t.Helper()
	o, err := mc.GetObject(context.Background(), profilesBucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	b, err := io.ReadAll(o)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return b
}

// TestProfileOneWriter: a session that writes a profile back holds it
// alone: a second create is refused (409) at once, or with wait_seconds
// waits until the first has ended and saved, then starts with what it
// saved; a profile in use cannot be deleted or rolled back. Sessions
// that only read it share it.
func TestProfileOneWriter(t *testing.T) {
	e := needE2E(t)
	p := e.newProfile(t, e.keyA, "one writer")
	rt := map[string]any{"runtime": "runc"}
	s1 := e.profileSession(t, e.keyA, p.ID, true, rt)
	req := map[string]any{"runtime": "runc", "labels": map[string]string{"test": t.Name()}, "profile": map[string]any{"id": p.ID, "persist": true}}
	if st, raw := e.api(t, e.keyA, "POST", "/v1/sessions", req); st != 409 || !strings.Contains(string(raw), "in use") {
		t.Fatalf("a second writer: %d %s, want 409", st, raw)
	}
	reader := map[string]any{"runtime": "runc", "labels": map[string]string{"test": t.Name()}, "profile": map[string]any{"id": p.ID}}
	if st, raw := e.api(t, e.keyA, "POST", "/v1/sessions", reader); st != 409 {
		t.Fatalf("a reader while a writer holds it: %d %s, want 409", st, raw)
	}
	if st, raw := e.api(t, e.keyA, "DELETE", "/v1/profiles/"+p.ID, nil); st != 409 {
		t.Errorf("delete while in use: %d %s", st, raw)
	}
	if st, raw := e.api(t, e.keyA, "POST", "/v1/profiles/"+p.ID+"/rollback", map[string]any{"version": 0}); st != 409 {
		t.Errorf("rollback while in use: %d %s", st, raw)
	}
	// Something the second session must find: written into the profile
	// by the first.
	mark := "mark-" + randHex(8)
	if out := e.execIn(t, e.keyA, s1.ID, map[string]any{"cmd": []string{"sh", "-c", "printf %s " + mark + " > ~/.sandgate-profile/sandgate-mark"}}); out.ExitCode != 0 {
		t.Fatalf("write the mark: %s", out.Stderr)
	}

	// A waiting second writer.
	req["wait_seconds"] = 120
	type result struct {
		st   int
		raw  []byte
		took time.Duration
	}
	got := make(chan result, 1)
	t0 := time.Now()
	go func() {
		st, raw := e.api(t, e.keyA, "POST", "/v1/sessions", req)
		got <- result{st, raw, time.Since(t0)}
	}()
	select {
	case r := <-got:
		t.Fatalf("the waiting create answered while the profile was held: %d %s", r.st, r.raw)
	case <-time.After(3 * time.Second):
	}
	stopped := time.Now()
	e.stopSession(t, e.keyA, s1.ID)
	var r result
	select {
	case r = <-got:
	case <-time.After(3 * time.Minute):
		t.Fatal("the waiting create never answered")
	}
	if r.st != 201 {
		t.Fatalf("the waiting create: %d %s", r.st, r.raw)
	}
	s2 := jsonField(r.raw, "id")
	t.Cleanup(func() { e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s2, nil) })
	t.Logf("the second writer waited %v (the first was deleted %v in)", r.took.Round(time.Millisecond), stopped.Sub(t0).Round(time.Millisecond))
	out := e.execIn(t, e.keyA, s2, map[string]any{"cmd": []string{"cat", "/home/sandgate/.sandgate-profile/sandgate-mark"}})
	if string(out.Stdout) != mark {
		t.Fatalf("the second session's profile lacks what the first saved: %q %s", out.Stdout, out.Stderr)
	}
	e.stopSession(t, e.keyA, s2)

	// Readers share it.
	delete(req, "wait_seconds")
	a := e.profileSession(t, e.keyA, p.ID, false, rt)
	b := e.profileSession(t, e.keyA, p.ID, false, rt)
	if st, raw := e.api(t, e.keyA, "POST", "/v1/sessions", req); st != 201 && st != 409 {
		t.Errorf("a writer beside readers: %d %s", st, raw)
	} else if st == 201 {
		t.Errorf("a writer was let in beside readers: %s", raw)
		e.api(t, e.keyA, "DELETE", "/v1/sessions/"+jsonField(raw, "id"), nil)
	}
	_, _ = a, b
}

// TestProfileNeverKeepsSecrets: a save whose profile holds the value of
// a vault credential bound to the session is refused (the trail says
// why) and the profile keeps its version; the same save without it is
// stored (the control). Desktop sessions take no profile.
func TestProfileNeverKeepsSecrets(t *testing.T) {
	e := needE2E(t)
	secret := "fill-secret-" + randHex(12)
	st, body := e.api(t, e.keyA, "POST", "/v1/credentials", map[string]any{"name": "profile leak", "kind": "form", "username": basicUser, "secret": secret,
		"destinations": []map[string]any{{"scheme": "http", "host": profileHost, "port": 8282}}, "allow_value_fill": true})
	if st != 201 {
		t.Fatalf("credential: %d %s", st, body)
	}
	cred := jsonField(body, "id")
	t.Cleanup(func() { e.api(t, e.keyA, "DELETE", "/v1/credentials/"+cred, nil) })
	p := e.newProfile(t, e.keyA, "secrets")
	extra := map[string]any{"runtime": "runc", "credentials": []map[string]any{{"credential": cred, "scheme": "http", "host": profileHost, "port": 8282}}}
	// The control: saved.
	s1 := e.profileSession(t, e.keyA, p.ID, true, extra)
	if _, ok := eventOf(e.stopSession(t, e.keyA, s1.ID), "profile_saved"); !ok {
		t.Fatal("the control profile was not saved")
	}
	// The secret in the profile (as if the page had stored it): refused.
	s2 := e.profileSession(t, e.keyA, p.ID, true, extra)
	if out := e.execIn(t, e.keyA, s2.ID, map[string]any{"cmd": []string{"sh", "-c", "mkdir -p ~/.sandgate-profile/Default && printf 'x=%s;' \"$S\" > ~/.sandgate-profile/Default/leak"},
		"env": map[string]string{"S": secret}}); out.ExitCode != 0 {
		t.Fatalf("plant: %s", out.Stderr)
	}
	evs := e.stopSession(t, e.keyA, s2.ID)
	f, ok := eventOf(evs, "profile_not_saved")
	if !ok || !strings.Contains(fmt.Sprint(f["reason"]), "vault credential") {
		t.Fatalf("profile_not_saved: %v %v (%+v)", f, ok, evs)
	}
	if got := e.getProfile(t, e.keyA, p.ID); got.Current != 1 || len(got.Versions) != 1 {
		t.Fatalf("the refused save changed the profile: %+v", got)
	}
	if st, raw := e.api(t, e.keyA, "POST", "/v1/sessions", map[string]any{"kind": "desktop", "profile": map[string]any{"id": p.ID}}); st != 400 {
		t.Errorf("a desktop session with a profile: %d %s", st, raw)
	}
	// A binding that types the real value cannot go with persist (its
	// value would be kept where no scan sees it); without persist it can.
	valueBinding := map[string]any{"runtime": "runc", "credentials": []map[string]any{{"credential": cred, "scheme": "http", "host": profileHost, "port": 8282, "fill": "value"}}}
	req := map[string]any{"profile": map[string]any{"id": p.ID, "persist": true}, "egress": map[string]any{"allow": []string{profileHost + ":" + profilePort}}}
	for k, v := range valueBinding {
		req[k] = v
	}
	if st, raw := e.api(t, e.keyA, "POST", "/v1/sessions", req); st != 400 || !strings.Contains(string(raw), "fill") {
		t.Errorf("persist with a fill:value binding: %d %s", st, raw)
	}
	e.profileSession(t, e.keyA, p.ID, false, valueBinding)
}

type snapshotInfo struct {
	ID            string `json:"id"`
	Session       string `json:"session"`
	Size          int64  `json:"size"`
	SHA256        string `json:"sha256"`
	ProcessesKept bool   `json:"processes_kept"`
	Note          string `json:"note"`
}

// TestSnapshotRoundTrip: files in the workspace and home (random bytes,
// an empty file, a nested one, an executable, a symlink) are saved by a
// snapshot whose size and sha256 match its download, and a new session
// started from it has them byte for byte; the kept browser profile is
// not in it; another tenant cannot start from it.
func TestSnapshotRoundTrip(t *testing.T) {
	e := needE2E(t)
	p := e.newProfile(t, e.keyA, "not in snapshots")
	s1 := e.createSession(t, e.keyA, map[string]any{"profile": map[string]any{"id": p.ID, "persist": true}})
	big := make([]byte, 3<<20+17)
	rand.Read(big)
	files := map[string][]byte{
		"/home/sandgate/workspace/big.bin":          big,
		"/home/sandgate/workspace/empty":            {},
		"/home/sandgate/workspace/a/b/c/nested.txt": []byte("nested\n"),
		"/home/sandgate/notes.md":                   []byte("# notes in home\n"),
	}
	if out := e.execIn(t, e.keyA, s1.ID, map[string]any{"cmd": []string{"mkdir", "-p", "/home/sandgate/workspace/a/b/c"}}); out.ExitCode != 0 {
		t.Fatalf("mkdir: %s", out.Stderr)
	}
	for path, data := range files {
		put := func() {
			req, _ := http.NewRequest("PUT", e.gwURL+"/v1/sessions/"+s1.ID+"/files?path="+url.QueryEscape(path), bytes.NewReader(data))
			req.Header.Set("Authorization", "Bearer "+e.keyA)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 201 {
				t.Fatalf("upload %s: %d %s", path, resp.StatusCode, b)
			}
		}
		put()
	}
	if out := e.execIn(t, e.keyA, s1.ID, map[string]any{"cmd": []string{"sh", "-c",
		"printf '#!/bin/sh\\necho run\\n' > ~/workspace/tool.sh && chmod 755 ~/workspace/tool.sh && ln -s big.bin ~/workspace/link && ln ~/workspace/tool.sh ~/workspace/tool-hard && touch ~/.sandgate-profile/Default-marker"}}); out.ExitCode != 0 {
		t.Fatalf("prepare: %s", out.Stderr)
	}
	st, raw := e.api(t, e.keyA, "POST", "/v1/sessions/"+s1.ID+"/snapshots", nil)
	if st != 201 {
		t.Fatalf("snapshot: %d %s", st, raw)
	}
	var snap snapshotInfo
	json.Unmarshal(raw, &snap)
	if snap.ProcessesKept || !strings.Contains(snap.Note, "processes") || snap.Session != s1.ID || snap.Size == 0 {
		t.Errorf("snapshot %+v", snap)
	}
	// Its download is what it says, and holds no profile.
	st, raw = e.api(t, e.keyA, "GET", "/v1/artifacts/"+snap.ID, nil)
	if st != 302 {
		t.Fatalf("artifact: %d %s", st, raw)
	}
	resp, err := http.Get(jsonLocation(t, e, snap.ID))
	if err != nil {
		t.Fatal(err)
	}
	tarBytes, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	sum := sha256.Sum256(tarBytes)
	if int64(len(tarBytes)) != snap.Size || hex.EncodeToString(sum[:]) != snap.SHA256 {
		t.Errorf("the download is %d bytes %x; the snapshot says %d %s", len(tarBytes), sum, snap.Size, snap.SHA256)
	}
	tr := tar.NewReader(bytes.NewReader(tarBytes))
	sawBig := false
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if strings.Contains(h.Name, ".sandgate-profile") {
			t.Errorf("the snapshot holds the kept profile: %s", h.Name)
		}
		sawBig = sawBig || h.Name == "workspace/big.bin"
	}
	if !sawBig {
		t.Errorf("the snapshot lacks workspace/big.bin")
	}
	if st, raw := e.api(t, e.keyA, "GET", "/v1/sessions/"+s1.ID+"/snapshots", nil); st != 200 || !strings.Contains(string(raw), snap.ID) {
		t.Errorf("list: %d %s", st, raw)
	}

	// A new session from it.
	s2 := e.createSession(t, e.keyA, map[string]any{"snapshot": snap.ID})
	for path, data := range files {
		st, got := e.api(t, e.keyA, "GET", "/v1/sessions/"+s2.ID+"/files?path="+url.QueryEscape(path), nil)
		if st != 200 || !bytes.Equal(got, data) {
			t.Errorf("%s in the new session: %d, %d bytes (want %d), equal %v", path, st, len(got), len(data), bytes.Equal(got, data))
		}
	}
	out := e.execIn(t, e.keyA, s2.ID, map[string]any{"cmd": []string{"sh", "-c", "readlink ~/workspace/link; stat -c %a ~/workspace/tool.sh; ~/workspace/tool.sh; stat -c %h ~/workspace/tool-hard; ls -a ~ | grep -c sandgate-profile || true"}})
	if string(out.Stdout) != "big.bin\n755\nrun\n2\n0\n" {
		t.Errorf("symlink, mode, run, hard link, profile in the new session: %q %s", out.Stdout, out.Stderr)
	}
	if f, ok := eventOf(e.events(t, e.keyA, s2.ID), "snapshot_restored"); !ok || f["snapshot"] != snap.ID {
		t.Errorf("snapshot_restored: %v %v", f, ok)
	}
	// A session without it (the control) has none of the files.
	s3 := e.createSession(t, e.keyA, map[string]any{"runtime": "runc"})
	if st, _ := e.api(t, e.keyA, "GET", "/v1/sessions/"+s3.ID+"/files?path="+url.QueryEscape("/home/sandgate/workspace/big.bin"), nil); st != 404 {
		t.Errorf("a fresh session has big.bin: %d", st)
	}
	// Another tenant.
	if st, raw := e.api(t, e.keyB, "POST", "/v1/sessions", map[string]any{"snapshot": snap.ID}); st != 404 {
		t.Errorf("tenant-b from tenant-a's snapshot: %d %s", st, raw)
	}
	if st, raw := e.api(t, e.keyB, "GET", "/v1/sessions/"+s1.ID+"/snapshots", nil); st != 404 {
		t.Errorf("tenant-b lists tenant-a's snapshots: %d %s", st, raw)
	}
}

// jsonLocation follows the API's 302 for an artifact.
func jsonLocation(t testing.TB, e *testEnv, id string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", e.gwURL+"/v1/artifacts/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+e.keyA)
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.Header.Get("Location")
}

// TestProfileQuotaAndRetention: profile versions count against the
// tenant's artifact quota (a snapshot is refused with 429 and a save
// says why it did not happen once the tenant is over it; the same before
// it is over, the control, went through); retention removes old versions
// but never the current one, which still starts sessions.
func TestProfileQuotaAndRetention(t *testing.T) {
	e := needE2E(t)
	runc := map[string]any{"runtime": "runc"}

	// Quota, on a tenant made for it.
	name := "profquota-" + randHex(4)
	e.admin(t, "POST", "/tenants", map[string]any{"name": name, "max_artifact_bytes": 600000}, 201, nil)
	defer e.api(t, e.adminKey, "PATCH", "/admin/v1/tenants/"+name, map[string]any{"disabled": true})
	var k adminKey
	e.admin(t, "POST", "/tenants/"+name+"/keys", map[string]any{}, 201, &k)
	pa, pb := e.newProfile(t, k.APIKey, "a"), e.newProfile(t, k.APIKey, "b")
	s1 := e.profileSession(t, k.APIKey, pa.ID, true, runc)
	s2 := e.profileSession(t, k.APIKey, pb.ID, true, runc)
	if st, raw := e.api(t, k.APIKey, "POST", "/v1/sessions/"+s2.ID+"/snapshots", nil); st != 201 {
		t.Fatalf("a snapshot under the quota (the control): %d %s", st, raw)
	}
	if _, ok := eventOf(e.stopSession(t, k.APIKey, s1.ID), "profile_saved"); !ok {
		t.Fatal("the first save, under the quota, did not happen")
	}
	if st, raw := e.api(t, k.APIKey, "POST", "/v1/sessions/"+s2.ID+"/snapshots", nil); st != 429 || jsonErrCode(raw) != "quota_exceeded" {
		t.Fatalf("a snapshot over the quota: %d %s", st, raw)
	}
	f, ok := eventOf(e.stopSession(t, k.APIKey, s2.ID), "profile_not_saved")
	if !ok || !strings.Contains(fmt.Sprint(f["reason"]), "quota") {
		t.Fatalf("a save over the quota: %v %v", f, ok)
	}
	if u := e.usage(t, k.APIKey); u.ArtifactBytes < e.getProfile(t, k.APIKey, pa.ID).Versions[0].StoredBytes {
		t.Errorf("usage counts %d artifact bytes, less than the profile's version", u.ArtifactBytes)
	}

	// Retention (tenant-c keeps artifacts 3 s).
	p := e.newProfile(t, e.keyC, "retention")
	for range 2 {
		s := e.profileSession(t, e.keyC, p.ID, true, runc)
		if _, ok := eventOf(e.stopSession(t, e.keyC, s.ID), "profile_saved"); !ok {
			t.Fatal("not saved")
		}
	}
	var got profileInfo
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		got = e.getProfile(t, e.keyC, p.ID)
		if len(got.Versions) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("retention left %d versions after 60 s", len(got.Versions))
		}
	}
	if got.Current != 2 || got.Versions[0].Version != 2 {
		t.Fatalf("retention took the current version: %+v", got)
	}
	time.Sleep(4 * time.Second) // older than the retention now, and kept
	s := e.profileSession(t, e.keyC, p.ID, false, runc)
	if f, ok := eventOf(e.events(t, e.keyC, s.ID), "profile_restored"); !ok || f["version"] != float64(2) {
		t.Fatalf("after retention: %v %v", f, ok)
	}
}

// openProfile reads a profile's current version as the gateway does,
// with the test's vault key.
func (e *testEnv) openProfile(t testing.TB, tenant, id string) []byte {
	t.Helper()
	key, _ := hex.DecodeString(e.vaultKey)
	st, err := profile.Open(context.Background(), profile.Config{Endpoint: e.minioAddr, AccessKey: "sandgate", SecretKey: "sandgate-test-secret",
		Bucket: profilesBucket, VaultKey: key})
	if err != nil {
		t.Fatal(err)
	}
	_, r, err := st.Open(context.Background(), tenant, id)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestProfileAcrossRestart: a gateway killed while a session holds a
// profile comes back with the hold (a second writer is still refused)
// and saves the profile when the session ends.
func TestProfileAcrossRestart(t *testing.T) {
	e := needE2E(t)
	p := e.newProfile(t, e.keyA, "restart")
	s := e.profileSession(t, e.keyA, p.ID, true, map[string]any{"runtime": "runc"})
	mark := "restart-mark-" + randHex(6)
	if out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"sh", "-c", "printf %s " + mark + " > ~/.sandgate-profile/sandgate-mark"}}); out.ExitCode != 0 {
		t.Fatalf("mark: %s", out.Stderr)
	}
	e.stopGateway(syscall.SIGKILL)
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}
	if got := e.getProfile(t, e.keyA, p.ID); !got.InUse {
		t.Errorf("after the restart the profile is not shown in use")
	}
	req := map[string]any{"runtime": "runc", "labels": map[string]string{"test": t.Name()}, "profile": map[string]any{"id": p.ID, "persist": true}}
	if st, raw := e.api(t, e.keyA, "POST", "/v1/sessions", req); st != 409 {
		t.Errorf("a second writer after the restart: %d %s", st, raw)
		if st == 201 {
			e.api(t, e.keyA, "DELETE", "/v1/sessions/"+jsonField(raw, "id"), nil)
		}
	}
	if _, ok := eventOf(e.stopSession(t, e.keyA, s.ID), "profile_saved"); !ok {
		t.Fatal("the adopted session's profile was not saved")
	}
	if plain := e.openProfile(t, "tenant-a", p.ID); !bytes.Contains(plain, []byte(mark)) {
		t.Errorf("the saved profile lacks what the session wrote before the restart")
	}
}

// TestProfileExpiredAcrossRestart: a session that writes its profile
// back and expires while no gateway runs is not removed unsaved when the
// next gateway starts: it is adopted, stopped for its TTL, and its
// profile saved with what it wrote, before the gateway observed the
// manager or after (the save waits for it).
func TestProfileExpiredAcrossRestart(t *testing.T) {
	e := needE2E(t)
	p := e.newProfile(t, e.keyA, "expired across a restart")
	s := e.profileSession(t, e.keyA, p.ID, true, map[string]any{"runtime": "runc", "ttl_seconds": 40})
	mark := "expired-mark-" + randHex(6)
	if out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"sh", "-c", "printf %s " + mark + " > ~/.sandgate-profile/sandgate-mark"}}); out.ExitCode != 0 {
		t.Fatalf("mark: %s", out.Stderr)
	}
	e.stopGateway(syscall.SIGKILL)
	if time.Now().After(s.ExpiresAt) {
		t.Fatalf("the session expired (%s) before the gateway was killed: this machine took over 40 s to create it and write a file", s.ExpiresAt)
	}
	// No gateway runs as it expires.
	time.Sleep(time.Until(s.ExpiresAt) + time.Second)
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the expired session's profile saved", func() bool { return e.getProfile(t, e.keyA, p.ID).Current == 1 })
	if plain := e.openProfile(t, "tenant-a", p.ID); !bytes.Contains(plain, []byte(mark)) {
		t.Errorf("the profile saved as the expired session was stopped lacks what it wrote")
	}
	if _, ok := eventOf(e.events(t, e.keyA, s.ID), "profile_saved"); !ok {
		t.Errorf("the expired session's trail has no profile_saved")
	}
}

// TestProfileHostileSession: what a session puts in its profile is the
// session's word. A symlink out of it and a fifo are dropped at the save
// (the next session has the plain file beside them, the control); a name
// with a line break leaves the profile unsaved with a reason, at once
// (the session's tar is stopped, not left blocked); a browser frozen so
// that it never closes leaves it unsaved too. Each time the session's
// end, the container's removal and the gateway go on.
func TestProfileHostileSession(t *testing.T) {
	e := needE2E(t)
	p := e.newProfile(t, e.keyA, "hostile")
	runc := map[string]any{"runtime": "runc"}
	s1 := e.profileSession(t, e.keyA, p.ID, true, runc)
	plant := `cd ~/.sandgate-profile && ln -s /etc/shadow evil-link && mkfifo evil-fifo && printf kept > plain`
	if out := e.execIn(t, e.keyA, s1.ID, map[string]any{"cmd": []string{"sh", "-c", plant}}); out.ExitCode != 0 {
		t.Fatalf("plant: %s", out.Stderr)
	}
	if _, ok := eventOf(e.stopSession(t, e.keyA, s1.ID), "profile_saved"); !ok {
		t.Fatal("not saved")
	}
	s2 := e.profileSession(t, e.keyA, p.ID, true, runc)
	out := e.execIn(t, e.keyA, s2.ID, map[string]any{"cmd": []string{"sh", "-c", "cd ~/.sandgate-profile && cat plain && ls -a | grep -c evil || true"}})
	if string(out.Stdout) != "kept0\n" {
		t.Fatalf("the next session's profile: %q %s", out.Stdout, out.Stderr)
	}
	// A name no clean archive holds: refused, at once.
	if out := e.execIn(t, e.keyA, s2.ID, map[string]any{"cmd": []string{"sh", "-c", `printf x > ~/.sandgate-profile/"$(printf 'evil\nname')"`}}); out.ExitCode != 0 {
		t.Fatalf("plant: %s", out.Stderr)
	}
	t0 := time.Now()
	f, ok := eventOf(e.stopSession(t, e.keyA, s2.ID), "profile_not_saved")
	if !ok || !strings.Contains(fmt.Sprint(f["reason"]), "well-formed") {
		t.Fatalf("a profile with a line break in a name: %v %v", f, ok)
	}
	if d := time.Since(t0); d > 90*time.Second {
		t.Errorf("the refused save took %v: the session's tar was left blocked", d)
	}
	if r := e.residue(t, s2.ID); len(r) != 0 {
		t.Fatalf("the session left %v", r)
	}
	s3 := e.profileSession(t, e.keyA, p.ID, true, runc)
	// A browser that never closes: frozen (SIGSTOP), it takes neither
	// Browser.close nor the TERM; the KILL ends it, and a profile whose
	// browser was killed is not saved.
	if out := e.execIn(t, e.keyA, s3.ID, map[string]any{"cmd": []string{"sh", "-c", "kill -STOP $(cat /tmp/.browser-pid)"}}); out.ExitCode != 0 {
		t.Fatalf("freeze: %s", out.Stderr)
	}
	t0 = time.Now()
	f, ok = eventOf(e.stopSession(t, e.keyA, s3.ID), "profile_not_saved")
	if !ok || !strings.Contains(fmt.Sprint(f["reason"]), "did not close") {
		t.Fatalf("a frozen browser's profile: %v %v", f, ok)
	}
	if r := e.residue(t, s3.ID); len(r) != 0 {
		t.Fatalf("the session left %v", r)
	}
	t.Logf("the frozen browser's session ended in %v", time.Since(t0).Round(time.Second))
	if got := e.getProfile(t, e.keyA, p.ID); got.Current != 1 || got.InUse {
		t.Fatalf("after the unsaved ends: %+v", got)
	}
	if st, _ := e.api(t, e.keyA, "GET", "/v1/usage", nil); st != 200 {
		t.Fatalf("the gateway after the hostile sessions: %d", st)
	}
}

// TestProfileStoreAcrossReplicas: two profile stores on one MinIO, as
// two gateway replicas each open one (a replica standing by deletes and
// rolls back profiles while no leader answers). A version saved back
// through one after the other deleted the profile is not kept, nothing
// of it left in the store (its bytes not counted against the tenant);
// one saved after the other rolled the profile back reads the metadata
// again and is kept, current. The controls: the rollback and the save
// with no other writer.
func TestProfileStoreAcrossReplicas(t *testing.T) {
	e := needE2E(t)
	ctx := context.Background()
	key, _ := hex.DecodeString(e.vaultKey)
	open := func() *profile.Store {
		st, err := profile.Open(ctx, profile.Config{Endpoint: e.minioAddr, AccessKey: "sandgate", SecretKey: "sandgate-test-secret",
			Bucket: profilesBucket, VaultKey: key})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	a, b := open(), open()
	tenant := "replicas-" + randHex(4)
	save := func(st *profile.Store, id string) (profile.Version, error) {
		sv, err := st.NewSaver(ctx, tenant, id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sv.Write([]byte("a profile's tar, as far as the store cares")); err != nil {
			t.Fatal(err)
		}
		return sv.Commit(ctx, "s-0123456789abcdef", 1)
	}

	// Saved after a rollback through the other: kept.
	p, err := a.Create(ctx, tenant, "rolled back meanwhile")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := save(a, p.ID); err != nil || v.Version != 1 {
		t.Fatalf("the control, a save with no other writer: %+v %v", v, err)
	}
	sv, err := a.NewSaver(ctx, tenant, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	sv.Write([]byte("the second version"))
	if got, err := b.Rollback(ctx, tenant, p.ID, 0); err != nil || got.Current != 0 {
		t.Fatalf("a rollback through the other store: %+v %v", got, err)
	}
	if v, err := sv.Commit(ctx, "s-0123456789abcdef", 1); err != nil || v.Version != 2 {
		t.Fatalf("a save after the other's rollback: %+v %v", v, err)
	}
	if got, err := b.Get(ctx, tenant, p.ID); err != nil || got.Current != 2 || len(got.Versions) != 2 {
		t.Errorf("after a rollback through one and a save through the other: %+v %v, want version 2 current of 2", got, err)
	}

	// Saved after a delete through the other: nothing kept.
	q, err := a.Create(ctx, tenant, "deleted meanwhile")
	if err != nil {
		t.Fatal(err)
	}
	sv, err = a.NewSaver(ctx, tenant, q.ID)
	if err != nil {
		t.Fatal(err)
	}
	sv.Write([]byte("a version of a profile that is deleted"))
	if err := b.Delete(ctx, tenant, q.ID); err != nil {
		t.Fatal(err)
	}
	if v, err := sv.Commit(ctx, "s-0123456789abcdef", 1); !errors.Is(err, profile.ErrNotFound) {
		t.Errorf("a save after the other's delete: %+v %v, want not found", v, err)
	}
	if _, err := a.Get(ctx, tenant, q.ID); !errors.Is(err, profile.ErrNotFound) {
		t.Errorf("the deleted profile read after the save: %v, want not found", err)
	}
	// The tenant's bytes: p's two versions and metadata, nothing of q.
	withP, err := a.TenantBytes(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, tenant, p.ID); err != nil {
		t.Fatal(err)
	}
	if left, err := a.TenantBytes(ctx, tenant); err != nil || left != 0 || withP == 0 {
		t.Errorf("the tenant's stored bytes: %d with a profile, %d once both are deleted (%v), want some, then none", withP, left, err)
	}
}
