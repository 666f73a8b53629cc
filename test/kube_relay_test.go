package test

import (
	"archive/tar"
	"bufio"
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
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
	"github.com/gorilla/websocket"

	"github.com/sandgate/sandgate/ids"
	sandgate "github.com/sandgate/sandgate/sdk/go"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/session/kube"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubeRelay: a replica that stands by carries the preview
// connections it is sent (CDP, VNC) itself, straight to the session's
// Pod, asking the leader about each, so they outlive the leader's
// death. Through B, standing by: a CDP connection and a VNC viewer work,
// and B's log, not A's, has them; the leader's trail has their
// preview_connected; the view-only viewer's pointer is dropped there
// (an interactive one's is not). A shell, a command (exec), files and
// actions through B are B's too, through the Pod exec API, and so is a
// screenshot (stored by B), all admitted by the leader (another
// tenant's key and none are refused); the leader's trail has their
// shell_opened, exec, file_upload and screenshot (when B answers),
// file_download and action. fill_credential through B is the leader's,
// answered as through A. A preview revoked through the leader ends the
// connection B carries within seconds (the control: another preview's
// connection goes on). A is SIGKILLed: the connection through A breaks
// (the control), the ones through B go on, answering while nobody leads
// and after B leads (the shell too, and its exit code comes back; a
// command through B that runs across the kill ends whole); once
// closed, their preview_closed, shell_closed and exec reach the new
// leader's trail. While nobody leads, B also admits new commands,
// files and CDP connections alone, reads and lists the session as the
// leader showed it, and issues a preview whose connection it admits
// and whose preview_issued reaches the new leader's trail, then revokes
// it: its connection ends, a new one is refused (by B leading too), and
// its preview_revoked reaches the trail. A request B
// cannot sign, and a signed one with a bad token, get nothing from the
// leader's internal routes. A session whose Pod is deleted while nobody
// leads is finalised by B once it leads, from its trail's pieces in
// MinIO (its log stored with its end, its pieces removed; the running
// session's pieces stay, the control). While nobody leads, B extends a
// session and deletes another (an SDK delete with no retries) by their
// Pods' records; once B leads, the one keeps its expiry and the other
// is stopped, its trail saying when the delete was asked. B, leading,
// takes in the same writes of another replica that could not reach it.
// While nobody leads, B also stores, reads, lists and deletes
// credentials with its own vault (the SDK, no retries), another
// tenant's key finding none of them; B leading holds what B did. It
// also fills, alone, a credential bound to the session into the page
// opened through it: the placeholder, never the secret, the event in
// the trail of B once it leads. And it makes, reads and lists browser
// profiles with its own store, the session's own in use, another
// tenant's key finding neither; a profile's delete waits for a leader.
// And it says the tenant's usage, from its Pods' records; the runtimes
// and the pools, from the cluster; and the tenants and their keys to
// the admin API, from its copy of the stored registry, as A said them.
// And it creates sessions alone (one from a snapshot B took alone, that
// records, with a preview and a bound credential), admitted by the
// session Pods, which B adopts once it leads, its recording going on
// and finished as it ends.
func TestKubeRelay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	kb, ra, rb := leaderAndStandby(t, ctx)

	// A credential for the trial cluster's test page, bound to the
	// session: B types it alone while nobody leads (below).
	fillSecret := "fill-secret-" + randHex(12)
	fillCred, err := sandgate.New(ra.gwURL, ra.keyA).CreateCredential(ctx, sandgate.CredentialRequest{Name: "typed through B alone", Kind: "form",
		Username: "qa", Secret: fillSecret, Destinations: []sandgate.Destination{{Scheme: "http", Host: "pages.sandgate.test", Port: 80}}})
	if err != nil {
		t.Fatalf("a credential to fill: %v", err)
	}
	t.Cleanup(func() { rb.api(t, rb.keyA, "DELETE", "/v1/credentials/"+fillCred.ID, nil) })
	// A profile the session reads (holds): B says so while nobody
	// leads (below).
	st, body := ra.api(t, ra.keyA, "POST", "/v1/profiles", map[string]any{"name": "held by the relay test's session"})
	heldProf := jsonField(body, "id")
	if st != 201 || heldProf == "" {
		t.Fatalf("a profile through A: %d %s", st, body)
	}
	t.Cleanup(func() { rb.api(t, rb.keyA, "DELETE", "/v1/profiles/"+heldProf, nil) })
	st, body = rb.api(t, rb.keyA, "POST", "/v1/sessions", map[string]any{"runtime": "runc", "profile": map[string]any{"id": heldProf},
		"egress":      map[string]any{"allow": []string{"pages.sandgate.test:80"}},
		"credentials": []map[string]any{{"credential": fillCred.ID, "scheme": "http", "host": "pages.sandgate.test", "port": 80}}})
	var s sessionInfo
	if err := json.Unmarshal(body, &s); st != 201 || err != nil || s.State != "running" {
		t.Fatalf("create through B: %d %s", st, body)
	}
	viaB := func(u string) string { return strings.Replace(u, ra.gwAddr, rb.gwAddr, 1) }
	// Keys issued through the leader's admin API after B started: one
	// revoked at once, one kept. B checks them itself while nobody
	// leads (below), by its copy of the stored registry.
	var revokedKey, issuedKey adminKey
	ra.admin(t, "POST", "/tenants/tenant-a/keys", map[string]any{"name": "relay-revoked"}, 201, &revokedKey)
	ra.admin(t, "DELETE", "/tenants/tenant-a/keys/"+revokedKey.ID, nil, 204, nil)
	ra.admin(t, "POST", "/tenants/tenant-a/keys", map[string]any{"name": "relay-issued"}, 201, &issuedKey)

	// The internal routes answer nothing unsigned, as a route that is
	// not there.
	for _, p := range []string{"/internal/v1/relay/admit", "/internal/v1/relay/sync"} {
		if st, body := ra.api(t, "", "POST", p, map[string]any{"token": "x"}); st != 404 {
			t.Errorf("unsigned POST %s: %d %s, want 404", p, st, body)
		}
	}

	p1 := rb.preview(t, rb.keyA, s.ID, 600)
	p2 := rb.preview(t, rb.keyA, s.ID, 600)
	throughB1 := cdpDial(t, browserWS(t, viaB(p1.URL)))
	defer throughB1.Close()
	throughB2 := cdpDial(t, browserWS(t, viaB(p2.URL)))
	defer throughB2.Close()
	throughA := cdpDial(t, browserWS(t, p1.URL))
	defer throughA.Close()
	for name, c := range map[string]*websocket.Conn{"B, first": throughB1, "B, second": throughB2, "A": throughA} {
		if err := cdpTry(c, 1); err != nil {
			t.Fatalf("CDP through %s: %v", name, err)
		}
	}
	// The session's page, through B: the bound credential's test page,
	// where B types it while nobody leads (below).
	pageAlloc, pageCancel := remote.NewAllocator(ctx, browserWS(t, viaB(p1.URL)), remote.NoModifyURL)
	defer pageCancel()
	pageB, pageBCancel := chromedp.NewContext(pageAlloc)
	defer pageBCancel()
	if title, err := navigateTitle(pageB, "http://pages.sandgate.test/hello.html"); err != nil || title != "Sandgate test page" {
		t.Fatalf("the bound credential's page, through B: %q, %v", title, err)
	}
	vnc := rb.vncPreview(t, rb.keyA, s.ID, "vnc", true, 300)
	vnc.URL = viaB(vnc.URL)
	rfb, vconn := rfbThroughGateway(t, vnc)
	defer vconn.Close()
	if img, err := rfb.Capture(); err != nil || colours(img) < 2 {
		t.Fatalf("a VNC frame through B: %v", err)
	}
	// B carries them: its log has them, A's has not (A's has the one
	// through A).
	opened := func(r *testEnv, kind, preview string) bool {
		return logLines(r, kind+" connection opened", preview) > 0
	}
	if !opened(rb, "cdp", p2.ID) || !opened(rb, "vnc", vnc.ID) || opened(ra, "cdp", p2.ID) || opened(ra, "vnc", vnc.ID) {
		t.Errorf("B's log should have the CDP connection of %s and the viewer of %s, and A's neither (B: %v %v, A: %v %v)",
			p2.ID, vnc.ID, opened(rb, "cdp", p2.ID), opened(rb, "vnc", vnc.ID), opened(ra, "cdp", p2.ID), opened(ra, "vnc", vnc.ID))
	}
	if !opened(ra, "cdp", p1.ID) {
		t.Errorf("A's log lacks the CDP connection made through it (the control)")
	}

	// The viewer B carries is view-only: its pointer never reaches the
	// session; an interactive one's through B does (the control). A
	// frame asked after the event proves it was passed or dropped.
	ra.mustAction(t, ra.keyA, s.ID, map[string]any{"action": "mouse_move", "coordinate": []int{5, 5}})
	if err := rfb.Pointer(300, 200, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := rfb.Capture(); err != nil {
		t.Fatal(err)
	}
	if x, y := ra.cursor(t, s.ID); x != 5 || y != 5 {
		t.Errorf("a view-only viewer through B moved the cursor to %d,%d", x, y)
	}
	interactive := rb.vncPreview(t, rb.keyA, s.ID, "vnc", false, 300)
	interactive.URL = viaB(interactive.URL)
	irfb, iconn := rfbThroughGateway(t, interactive)
	if err := irfb.Pointer(300, 200, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := irfb.Capture(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "an interactive viewer through B to move the cursor", func() bool {
		x, y := ra.cursor(t, s.ID)
		return x == 300 && y == 200
	})
	iconn.Close()

	// A shell through B, and one through A (the control): B carries its
	// own, through the Pod exec API, the leader admitting it by the
	// API key. Another tenant's key and none are refused through B as
	// the leader refuses them.
	for key, want := range map[string]int{rb.keyB: 404, "": 401, "sk-junk": 401} {
		if _, st, err := shellDial(rb.gwAddr, key, s.ID); err == nil || st != want {
			t.Errorf("a shell through B with key %q: %d %v, want %d", key[:min(len(key), 6)], st, err, want)
		}
	}
	shB, st, err := shellDial(rb.gwAddr, rb.keyA, s.ID)
	if err != nil {
		t.Fatalf("a shell through B: %d %v", st, err)
	}
	defer shB.Close()
	shA, st, err := shellDial(ra.gwAddr, ra.keyA, s.ID)
	if err != nil {
		t.Fatalf("a shell through A: %d %v", st, err)
	}
	defer shA.Close()
	for name, c := range map[string]*websocket.Conn{"B": shB, "A": shA} {
		if err := shellRun(c, "echo shell-$((6*7))", "shell-42"); err != nil {
			t.Fatalf("the shell through %s: %v", name, err)
		}
	}
	shells := func(r *testEnv) int { return logLines(r, "shell opened", s.ID) }
	if shells(rb) != 1 || shells(ra) != 1 {
		t.Errorf("each replica's log should have the one shell made through it: B %d, A %d", shells(rb), shells(ra))
	}
	// The leader's trail has what B reported.
	connected := func(r *testEnv, typ, preview string) bool {
		for _, ev := range r.events(t, r.keyA, s.ID) {
			if ev.Type == typ && ev.Fields["preview"] == preview {
				return true
			}
		}
		return false
	}
	waitFor(t, 30*time.Second, "preview_connected of the connections B carries in the trail", func() bool {
		return connected(ra, "preview_connected", p2.ID) && connected(ra, "preview_connected", vnc.ID)
	})
	waitFor(t, 30*time.Second, "shell_opened of the shells through A and B in the trail", func() bool {
		n := 0
		for _, ev := range ra.events(t, ra.keyA, s.ID) {
			if ev.Type == "shell_opened" {
				n++
			}
		}
		return n == 2
	})

	// A command through B is B's too, through the Pod exec API; one
	// through A is A's (the control). Another tenant's key is refused
	// through B as the leader refuses it. Its exec event reaches the
	// leader's trail. The command goes through a client that keeps its
	// connections, as SDKs do, after it has read the session through B:
	// B forwarded that read to the leader, which closed the connection
	// once it answered (B said it forwarded it), so the command goes on
	// a new connection, which B routes again and carries itself. The
	// control: a connection straight to A is kept.
	fresh := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	kept := &http.Client{Timeout: time.Minute, Transport: &http.Transport{}}
	defer kept.CloseIdleConnections()
	for _, r := range []*testEnv{rb, ra} {
		req, _ := http.NewRequest("GET", r.gwURL+"/v1/sessions/"+s.ID, nil)
		req.Header.Set("Authorization", "Bearer "+r.keyA)
		resp, err := kept.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Close != (r == rb) {
			t.Errorf("a read of the session through %s: %d, connection closed after it %v (want it closed only through B)", r.gwAddr, resp.StatusCode, resp.Close)
		}
	}
	out := execWith(t, kept, rb.gwURL, rb.keyA, s.ID, map[string]any{"cmd": []string{"sh", "-c", "echo relayed-$((6*7)); exit 3"}})
	if out.ExitCode != 3 || string(out.Stdout) != "relayed-42\n" {
		t.Fatalf("a command through B: exit %d, stdout %q", out.ExitCode, out.Stdout)
	}
	if out := ra.execIn(t, ra.keyA, s.ID, map[string]any{"cmd": []string{"true"}}); out.ExitCode != 0 {
		t.Fatalf("a command through A: exit %d", out.ExitCode)
	}
	other, _ := http.NewRequest("POST", rb.gwURL+"/v1/sessions/"+s.ID+"/exec", strings.NewReader(`{"cmd":["true"]}`))
	other.Header.Set("Authorization", "Bearer "+rb.keyB)
	if resp, err := fresh.Do(other); err != nil || resp.StatusCode != 404 {
		t.Errorf("a command through B with another tenant's key: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}
	ran := func(r *testEnv) int { return logLines(r, "command ran", s.ID) }
	waitFor(t, 10*time.Second, "each replica's log to have the one command run through it", func() bool { return ran(rb) == 1 && ran(ra) == 1 })
	execEvent := func(r *testEnv, code int, arg string) bool {
		for _, ev := range r.events(t, r.keyA, s.ID) {
			if ev.Type == "exec" && fmt.Sprint(ev.Fields["exit_code"]) == fmt.Sprint(code) && strings.Contains(fmt.Sprint(ev.Fields["argv"]), arg) {
				return true
			}
		}
		return false
	}
	waitFor(t, 30*time.Second, "the exec event of the command through B in the leader's trail", func() bool { return execEvent(ra, 3, "relayed") })

	// Files through B are B's too, through the Pod exec API: 4 MiB
	// uploaded and read back whole through B; the upload's event is in
	// the leader's trail when B answers (B reports it first, and the
	// leader stores it), the download's soon after. A file through A is
	// A's (the control); another tenant's key is refused through B as
	// the leader refuses it.
	content := make([]byte, 4<<20)
	rand.Read(content)
	digest := sha256.Sum256(content)
	sum := hex.EncodeToString(digest[:])
	const relayed = "/home/sandgate/workspace/relayed.bin"
	if st, body := fileVia(t, fresh, rb.gwURL, rb.keyA, "PUT", s.ID, relayed, content); st != 201 || jsonField(body, "sha256") != sum {
		t.Fatalf("a file put through B: %d %s", st, body)
	}
	fileEvent := func(r *testEnv, typ, p string) map[string]any {
		for _, ev := range r.events(t, r.keyA, s.ID) {
			if ev.Type == typ && ev.Fields["path"] == p {
				return ev.Fields
			}
		}
		return nil
	}
	if f := fileEvent(ra, "file_upload", relayed); f == nil || f["sha256"] != sum || f["bytes"] != float64(len(content)) {
		t.Errorf("the leader's trail when B answered the upload: file_upload %v, want its path, size and digest", f)
	}
	if st, body := fileVia(t, fresh, rb.gwURL, rb.keyA, "GET", s.ID, relayed, nil); st != 200 || !bytes.Equal(body, content) {
		t.Fatalf("the file read back through B: %d, %d bytes, want %d", st, len(body), len(content))
	}
	if st, body := fileVia(t, fresh, ra.gwURL, ra.keyA, "PUT", s.ID, "/home/sandgate/workspace/direct.txt", []byte("through A")); st != 201 {
		t.Fatalf("a file put through A: %d %s", st, body)
	}
	if st, body := fileVia(t, fresh, rb.gwURL, rb.keyB, "GET", s.ID, relayed, nil); st != 404 {
		t.Errorf("a file through B with another tenant's key: %d %s, want 404", st, body)
	}
	filesLogged := func(r *testEnv, what string) int { return logLines(r, what, s.ID) }
	waitFor(t, 10*time.Second, "each replica's log to have the files through it", func() bool {
		return filesLogged(rb, "file written") == 1 && filesLogged(rb, "file read") == 1 && filesLogged(ra, "file written") == 1 && filesLogged(ra, "file read") == 0
	})
	waitFor(t, 30*time.Second, "the file_download of the file read through B in the leader's trail", func() bool {
		f := fileEvent(ra, "file_download", relayed)
		return f != nil && f["kind"] == "file" && f["bytes"] == float64(len(content))
	})

	// What B refuses, it refuses as the leader does, in the same order:
	// a bad key before a bad body or path (B asks the leader about the
	// key first), a bad body before a missing session (the leader's
	// refusal of the session waits for B's own checks).
	missing := ids.NewSession()
	for _, tc := range []struct{ key, method, path, body string }{ // key: "nope", A's tenant's or B's
		{"nope", "POST", "/v1/sessions/" + s.ID + "/exec", `{`},
		{"nope", "PUT", "/v1/sessions/" + s.ID + "/files?path=relative", "x"},
		{"nope", "POST", "/v1/sessions/" + s.ID + "/actions", `{"action":"no_such_action"}`},
		{"nope", "POST", "/v1/sessions/" + s.ID + "/screenshot", ""},
		{rb.keyA, "POST", "/v1/sessions/" + s.ID + "/exec", `{`},
		{rb.keyA, "POST", "/v1/sessions/" + missing + "/exec", `{`},
		{rb.keyA, "POST", "/v1/sessions/" + missing + "/exec", `{"cmd":["true"]}`},
		{rb.keyA, "GET", "/v1/sessions/" + s.ID + "/files", ""},
		{rb.keyA, "PUT", "/v1/sessions/" + missing + "/files?path=relative", "x"},
		{rb.keyB, "POST", "/v1/sessions/" + s.ID + "/actions", `{"action":"cursor_position"}`},
	} {
		var got [2]string
		for i, r := range []*testEnv{ra, rb} {
			st, body := sendVia(t, fresh, r.gwURL, tc.key, tc.method, tc.path, []byte(tc.body), "application/json")
			got[i] = fmt.Sprintf("%d %s", st, errorCode(body))
		}
		if got[0] != got[1] || got[0][0] != '4' {
			t.Errorf("%s %s (a valid key %v, body %q): through A %s, through B %s; want the same refusal", tc.method, tc.path, tc.key != "nope", tc.body, got[0], got[1])
		}
	}

	// Actions and screenshots through B are B's too: the pointer moved
	// through B is where B then reads it; a screenshot through B is
	// stored (read back whole through A, the leader) and its event is in
	// the leader's trail when B answers; the actions' events follow. A
	// fill_credential through B is the leader's (the vault is): answered
	// as through A.
	actionsOfA := logLines(ra, "action carried out", s.ID) // (the pointer checks above)
	actionEvents := func() int {
		n := 0
		for _, ev := range ra.events(t, ra.keyA, s.ID) {
			if ev.Type == "action" && (ev.Fields["action"] == "mouse_move" || ev.Fields["action"] == "cursor_position") {
				n++
			}
		}
		return n
	}
	actionsBefore := actionEvents()
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/sessions/"+s.ID+"/actions", map[string]any{"action": "mouse_move", "coordinate": []int{37, 41}}); st != 200 {
		t.Fatalf("mouse_move through B: %d %s", st, body)
	}
	st, body = callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/sessions/"+s.ID+"/actions", map[string]any{"action": "cursor_position"})
	var pos struct{ Cursor struct{ X, Y int } }
	if err := json.Unmarshal(body, &pos); st != 200 || err != nil || pos.Cursor.X != 37 || pos.Cursor.Y != 41 {
		t.Fatalf("cursor_position through B: %d %s, want 37,41", st, body)
	}
	st, body = callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/sessions/"+s.ID+"/screenshot", nil)
	var shot struct {
		ID     string `json:"id"`
		Size   int64  `json:"size"`
		SHA256 string `json:"sha256"`
	}
	if err := json.Unmarshal(body, &shot); st != 201 || err != nil || shot.ID == "" || shot.Size < 100 {
		t.Fatalf("a screenshot through B: %d %s", st, body)
	}
	shotEvent := false
	for _, ev := range ra.events(t, ra.keyA, s.ID) {
		shotEvent = shotEvent || ev.Type == "screenshot" && ev.Fields["artifact"] == shot.ID && ev.Fields["sha256"] == shot.SHA256
	}
	if !shotEvent {
		t.Errorf("the leader's trail when B answered the screenshot lacks its event (%s)", shot.ID)
	}
	png := ra.fetchArtifact(t, ra.keyA, shot.ID)
	if pngSum := sha256.Sum256(png); hex.EncodeToString(pngSum[:]) != shot.SHA256 || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("the screenshot taken through B, read through A: %d bytes, not the PNG B stored", len(png))
	}
	if st, body := ra.api(t, ra.keyA, "POST", "/v1/sessions/"+s.ID+"/screenshot", nil); st != 201 {
		t.Fatalf("a screenshot through A: %d %s", st, body)
	}
	// A snapshot through B is B's too: its tar taken through the Pod
	// exec API and stored by B (B's log says so, A's does not), its
	// event in the leader's trail when B answers; read through A, the
	// leader, it holds the file written through B.
	if r := execWith(t, fresh, rb.gwURL, rb.keyA, s.ID, map[string]any{"cmd": []string{"sh", "-c", "echo kept-by-B > /home/sandgate/workspace/snap.txt"}}); r.ExitCode != 0 {
		t.Fatalf("write a file through B: exit %d %s", r.ExitCode, r.Stderr)
	}
	snapAt := time.Now()
	snapB := snapshotVia(t, fresh, rb, s.ID, "while A leads")
	tookB := time.Since(snapAt)
	if !snapshotEvent(t, ra, s.ID, snapB) {
		t.Errorf("the leader's trail when B answered the snapshot lacks its event (%s)", snapB.ID)
	}
	if got := snapshotFiles(t, ra, snapB)["workspace/snap.txt"]; got != "kept-by-B\n" {
		t.Errorf("the snapshot taken through B, read through A: workspace/snap.txt %q, want the file written through B", got)
	}
	if nb, na := logLines(rb, "snapshot stored", s.ID), logLines(ra, "snapshot stored", s.ID); nb != 1 || na != 0 {
		t.Errorf("the snapshot through B in the logs of B and A: %d and %d, want 1 and 0", nb, na)
	}
	// (The control: one through A is A's.)
	snapAt = time.Now()
	snapA := snapshotVia(t, fresh, ra, s.ID, "while A leads")
	tookA := time.Since(snapAt)
	if nb, na := logLines(rb, "snapshot stored", s.ID), logLines(ra, "snapshot stored", s.ID); nb != 1 || na != 1 || !snapshotEvent(t, ra, s.ID, snapA) {
		t.Errorf("the snapshot through A in the logs of B and A: %d and %d, want 1 and 1, and in A's trail", nb, na)
	}
	t.Logf("a snapshot (%d bytes) through B took %.2f s, through A %.2f s (B/A %.2f)", snapB.Size, tookB.Seconds(), tookA.Seconds(), tookB.Seconds()/tookA.Seconds())
	// Within the tenant's artifact quota as the leader holds it, for a
	// tenant of its own. Its quota roomy, a snapshot of its session (4
	// MiB of random bytes) through B is taken, by B.
	tight := "relay-quota-" + randHex(4)
	var tightKey adminKey
	ra.admin(t, "POST", "/tenants", map[string]any{"name": tight, "max_artifact_bytes": 1 << 30}, 201, nil)
	ra.admin(t, "POST", "/tenants/"+tight+"/keys", map[string]any{"name": "quota"}, 201, &tightKey)
	st, body = callVia(t, fresh, ra.gwURL, tightKey.APIKey, "POST", "/v1/sessions", map[string]any{"runtime": "runc"})
	var tightS sessionInfo
	if err := json.Unmarshal(body, &tightS); st != 201 || err != nil {
		t.Fatalf("a session of a tenant with a quota: %d %s", st, body)
	}
	if r := execWith(t, fresh, ra.gwURL, tightKey.APIKey, tightS.ID, map[string]any{"cmd": []string{"sh", "-c", "head -c 4194304 /dev/urandom > /home/sandgate/workspace/big.bin"}}); r.ExitCode != 0 {
		t.Fatalf("write 4 MiB in the session of the tenant with a quota: exit %d %s", r.ExitCode, r.Stderr)
	}
	roomy := snapshotWith(t, fresh, rb, tightKey.APIKey, tightS.ID, "with room in the tenant's quota")
	if n := logLines(rb, "snapshot stored", tightS.ID); n != 1 {
		t.Errorf("the snapshot within the tenant's quota through B: %d in B's log, want 1", n)
	}
	// Two at once, through B and through A, with room left for one and
	// a half: never both kept (each is bounded by what was left as it
	// began; one stored past the quota is deleted, 429).
	var used struct {
		ArtifactBytes int64 `json:"artifact_bytes"`
	}
	if st, body := callVia(t, fresh, ra.gwURL, tightKey.APIKey, "GET", "/v1/usage", nil); st != 200 || json.Unmarshal(body, &used) != nil || used.ArtifactBytes < roomy.Size {
		t.Fatalf("the usage of the tenant with a quota: %d %s", st, body)
	}
	ra.admin(t, "PATCH", "/tenants/"+tight, map[string]any{"max_artifact_bytes": used.ArtifactBytes + roomy.Size*3/2}, 200, nil)
	var both [2]int
	var wg sync.WaitGroup
	for i, r := range []*testEnv{rb, ra} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			both[i], _ = callVia(t, fresh, r.gwURL, tightKey.APIKey, "POST", "/v1/sessions/"+tightS.ID+"/snapshots", nil)
		}()
	}
	wg.Wait()
	t.Logf("two snapshots at once through B and A with room for one and a half: %v", both)
	if both == [2]int{201, 201} || !slices.Contains([]int{201, 422, 429}, both[0]) || !slices.Contains([]int{201, 422, 429}, both[1]) {
		t.Errorf("two snapshots at once through B and A with room for one and a half: %v, want at most one 201, the other 422 or 429", both)
	}
	// Its quota 1 byte: refused through B, by B (its log says so), as
	// through A (422, more than is left, or 429, none left); stored by
	// neither.
	ra.admin(t, "PATCH", "/tenants/"+tight, map[string]any{"max_artifact_bytes": 1}, 200, nil)
	storedB, storedA := logLines(rb, "snapshot stored", tightS.ID), logLines(ra, "snapshot stored", tightS.ID)
	for _, r := range []*testEnv{rb, ra} {
		before := logLines(r, "snapshot not taken", tightS.ID)
		st, body := callVia(t, fresh, r.gwURL, tightKey.APIKey, "POST", "/v1/sessions/"+tightS.ID+"/snapshots", nil)
		if st != 422 && st != 429 || !strings.Contains(string(body), "quota") {
			t.Errorf("a snapshot through %s past the tenant's quota: %d %s, want 422 or 429", r.gwAddr, st, body)
		}
		if n := logLines(r, "snapshot not taken", tightS.ID); n != before+1 {
			t.Errorf("a snapshot through %s past the tenant's quota: %d refusals in its log, want %d", r.gwAddr, n, before+1)
		}
	}
	if nb, na := logLines(rb, "snapshot stored", tightS.ID), logLines(ra, "snapshot stored", tightS.ID); nb != storedB || na != storedA {
		t.Errorf("snapshots past the quota in the logs of B and A: %d and %d stored, want %d and %d", nb, na, storedB, storedA)
	}
	if st, body := callVia(t, fresh, ra.gwURL, tightKey.APIKey, "DELETE", "/v1/sessions/"+tightS.ID, nil); st != 200 {
		t.Fatalf("delete the session of the tenant with a quota: %d %s", st, body)
	}
	fill := map[string]any{"action": "fill_credential", "credential": "cred-0123456789abcdef", "selector": "#password"}
	stA, bodyA := callVia(t, fresh, ra.gwURL, ra.keyA, "POST", "/v1/sessions/"+s.ID+"/actions", fill)
	stB, bodyB := callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/sessions/"+s.ID+"/actions", fill)
	if stA < 400 || stA >= 500 || stB != stA || !bytes.Equal(bodyA, bodyB) {
		t.Errorf("fill_credential through B: %d %s; through A: %d %s; want the same client error", stB, bodyB, stA, bodyA)
	}
	var counts [4]int
	defer func() { t.Logf("actions and screenshots in the logs of B, then A: %v", counts) }()
	waitFor(t, 10*time.Second, "each replica's log to have the actions and screenshots through it", func() bool {
		counts = [4]int{logLines(rb, "action carried out", s.ID), logLines(rb, "screenshot stored", s.ID),
			logLines(ra, "action carried out", s.ID) - actionsOfA, logLines(ra, "screenshot stored", s.ID)}
		return counts == [4]int{2, 1, 0, 1}
	})
	waitFor(t, 30*time.Second, "the actions through B in the leader's trail", func() bool {
		return actionEvents() == actionsBefore+2
	})

	// Revoked through the leader: the connection B carries ends.
	revoked := time.Now()
	if st, body := ra.api(t, ra.keyA, "DELETE", "/v1/sessions/"+s.ID+"/previews/"+p2.ID, nil); st != 204 {
		t.Fatalf("revoke: %d %s", st, body)
	}
	waitFor(t, 30*time.Second, "the revoked preview's connection through B to end", func() bool { return cdpTry(throughB2, 2) != nil })
	t.Logf("a revocation ended the connection B carries %.1f s after it was made", time.Since(revoked).Seconds())
	if err := cdpTry(throughB1, 3); err != nil {
		t.Fatalf("the other preview's connection through B after the revocation: %v", err)
	}
	if _, err := browserWSErr(viaB(p2.URL)); err == nil {
		t.Error("the revoked preview answers through B")
	}

	// A view link and a review link, issued by the leader: a person's
	// and a reviewer's. The view page through B is B's to serve (by A's
	// admission), as its VNC connection is.
	viewP := ra.vncPreview(t, ra.keyA, s.ID, "view", true, 300)
	reviewP := ra.vncPreview(t, ra.keyA, s.ID, "review", false, 600)
	// An ended session, its Pod gone and its log stored, and its review
	// link: a reviewer's. It starts from the snapshot B took, unpacked
	// by A (its file there), recorded and with a preview: as the one
	// created through B alone is below, whose baseline its create is.
	leaderCreateAt := time.Now()
	st, body = ra.api(t, ra.keyA, "POST", "/v1/sessions", map[string]any{"runtime": "runc", "record": true, "snapshot": snapB.ID,
		"preview": map[string]any{"scope": "cdp", "ttl_seconds": 600}})
	leaderCreate := time.Since(leaderCreateAt)
	var ended sessionInfo
	if err := json.Unmarshal(body, &ended); st != 201 || err != nil {
		t.Fatalf("create a second session: %d %s", st, body)
	}
	if st, body := fileVia(t, fresh, ra.gwURL, ra.keyA, "GET", ended.ID, "/home/sandgate/workspace/snap.txt", nil); st != 200 || string(body) != "kept-by-B\n" {
		t.Errorf("the snapshot's file in the session created from it through A: %d %q", st, body)
	}
	if st, body := ra.api(t, ra.keyA, "DELETE", "/v1/sessions/"+ended.ID, nil); st != 200 && st != 204 {
		t.Fatalf("delete the second session: %d %s", st, body)
	}
	var endedLog string
	waitFor(t, 2*time.Minute, "the ended session's log stored and its Pod gone", func() bool {
		_, body := ra.api(t, ra.keyA, "GET", "/v1/sessions/"+ended.ID+"/artifacts", nil)
		var as struct {
			Artifacts []struct{ ID, Kind string }
		}
		json.Unmarshal(body, &as)
		for _, a := range as.Artifacts {
			if a.Kind == "log" {
				endedLog = a.ID
			}
		}
		_, pod := kubePods(t, kb)[ended.ID]
		return endedLog != "" && !pod
	})
	endedReview := ra.vncPreview(t, ra.keyA, ended.ID, "review", false, 600)
	// A session whose Pod goes while nobody leads (deleted below, as a
	// drain would): only its trail's pieces in MinIO remember it, until
	// B, leading, finalises it from them.
	st, body = ra.api(t, ra.keyA, "POST", "/v1/sessions", map[string]any{"runtime": "runc", "resources": map[string]any{"cpus": 0.5}})
	var unseen sessionInfo
	if err := json.Unmarshal(body, &unseen); st != 201 || err != nil {
		t.Fatalf("create a third session: %d %s", st, body)
	}
	// A session deleted through B while nobody leads (below), of the
	// other tenant (tenant-a has its two). It and the third take half a
	// core each, to fit on the trial cluster's node (2 cores) beside
	// the first.
	st, body = ra.api(t, ra.keyB, "POST", "/v1/sessions", map[string]any{"runtime": "runc", "resources": map[string]any{"cpus": 0.5}})
	var doomed sessionInfo
	if err := json.Unmarshal(body, &doomed); st != 201 || err != nil {
		t.Fatalf("create a fourth session: %d %s", st, body)
	}
	// A credential stored through A, read and deleted through B while
	// nobody leads (below).
	credential := func(name string) sandgate.CredentialRequest {
		return sandgate.CredentialRequest{Name: name, Kind: "basic", Username: "qa", Secret: "secret-" + randHex(12),
			Destinations: []sandgate.Destination{{Scheme: "https", Host: "login.example.test"}}}
	}
	preReq := credential("stored through A")
	preCred, err := sandgate.New(ra.gwURL, ra.keyA).CreateCredential(ctx, preReq)
	if err != nil {
		t.Fatalf("a credential through A: %v", err)
	}
	mc := rb.profileBucket(t)
	waitFor(t, 30*time.Second, "the third session's trail in MinIO", func() bool {
		return bytes.Contains(storedTrail(t, mc, "tenant-a", unseen.ID), []byte(`"created"`))
	})
	viewPage := func(when string) {
		t.Helper()
		tok := viewP.URL[strings.LastIndex(viewP.URL, "/")+1:]
		resp, err := fresh.Get(viaB(viewP.URL))
		if err != nil {
			t.Fatalf("the view page through B %s: %v", when, err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(page, []byte("/vnc/"+tok)) {
			t.Errorf("the view page through B %s: %d %.200s", when, resp.StatusCode, page)
		}
		// (The control: a CDP preview's token has no view page.)
		if resp, err := fresh.Get(viaB(strings.Replace(p1.URL, "/cdp/", "/view/", 1))); err != nil || resp.StatusCode != 401 {
			t.Errorf("a CDP preview's view page through B %s: %v %v, want 401", when, resp, err)
		} else {
			resp.Body.Close()
		}
	}
	viewPage("while A leads")

	// A dies: what went through A breaks; what B carries goes on, while
	// nobody leads and after.
	// A command through B that runs across A's death.
	raw, _ := json.Marshal(map[string]any{"cmd": []string{"sh", "-c", "echo started; sleep 3; echo survived"}})
	req, _ := http.NewRequest("POST", rb.gwURL+"/v1/sessions/"+s.ID+"/exec", bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+rb.keyA)
	resp, err := fresh.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("a long command through B: %v", err)
	}
	defer resp.Body.Close()
	long := bufio.NewScanner(resp.Body)
	var first execRec
	if !long.Scan() || json.Unmarshal(long.Bytes(), &first) != nil || string(first.Data) != "started\n" {
		t.Fatalf("the long command's first record: %q", long.Text())
	}

	// The session as the leader shows it, and lists it: what B answers
	// alone once A is dead.
	st, leaderView := callVia(t, fresh, ra.gwURL, rb.keyA, "GET", "/v1/sessions/"+s.ID, nil)
	if st != 200 {
		t.Fatalf("the session through A: %d %s", st, leaderView)
	}
	if st, list := callVia(t, fresh, ra.gwURL, rb.keyA, "GET", "/v1/sessions", nil); st != 200 || !sameJSON(listed(t, list, s.ID), leaderView) {
		t.Fatalf("the session list through A: %d %s", st, list)
	}

	// The tenant's usage as the leader says it, for B's alone (below).
	st, body = callVia(t, fresh, ra.gwURL, ra.keyA, "GET", "/v1/usage", nil)
	var usageA sandgate.Usage
	if err := json.Unmarshal(body, &usageA); st != 200 || err != nil || usageA.Sessions < 1 {
		t.Fatalf("the usage through A: %d %s", st, body)
	}

	// The runtimes, the tenants and tenant-a's keys as the leader says
	// them, for B's alone (below).
	st, runtimesA := callVia(t, fresh, ra.gwURL, ra.keyA, "GET", "/v1/runtimes", nil)
	if st != 200 || !strings.Contains(string(runtimesA), `"usable":true`) {
		t.Fatalf("the runtimes through A: %d %s", st, runtimesA)
	}
	st, poolsA := callVia(t, fresh, ra.gwURL, ra.keyA, "GET", "/v1/pools", nil)
	if st != 200 {
		t.Fatalf("the pools through A: %d %s", st, poolsA)
	}
	st, tenantsA := callVia(t, fresh, ra.gwURL, ra.adminKey, "GET", "/admin/v1/tenants", nil)
	if st != 200 {
		t.Fatalf("the tenants through A: %d %s", st, tenantsA)
	}
	st, keysA := callVia(t, fresh, ra.gwURL, ra.adminKey, "GET", "/admin/v1/tenants/tenant-a/keys", nil)
	if st != 200 || !strings.Contains(string(keysA), issuedKey.ID) {
		t.Fatalf("tenant-a's keys through A: %d %s", st, keysA)
	}

	// The OpenAPI document as A serves it, for B's alone (below). Each
	// replica's metrics are its own: A leads and counts the sessions;
	// B stands by and counts none.
	st, openapiA := callVia(t, fresh, ra.gwURL, "", "GET", "/openapi.json", nil)
	if st != 200 || !bytes.Contains(openapiA, []byte(`"openapi"`)) {
		t.Fatalf("the OpenAPI document through A: %d %.200s", st, openapiA)
	}
	if st, body := callVia(t, fresh, ra.gwURL, "", "GET", "/metrics", nil); st != 200 || !strings.Contains(string(body), "\nsandgate_gateway_leading 1\n") || !strings.Contains(string(body), `sandgate_sessions{state="running"} `) {
		t.Fatalf("A's metrics: %d %s", st, body)
	}
	if st, body := callVia(t, fresh, rb.gwURL, "", "GET", "/metrics", nil); st != 200 || !strings.Contains(string(body), "\nsandgate_gateway_leading 0\n") || strings.Contains(string(body), "sandgate_sessions") {
		t.Fatalf("B's metrics while A leads: %d %s, want B's own", st, body)
	}
	// A session_get over MCP through A, leading: how long B's alone
	// takes is set against it (below).
	csA := mcpConnect(t, ra.mcpHTTP(ra.keyA))
	var mcpGotA sandgate.Session
	getAt := time.Now()
	callTool(t, csA, "session_get", map[string]any{"session_id": s.ID}, &mcpGotA)
	mcpGetA := time.Since(getAt)
	if mcpGotA.ID != s.ID || mcpGotA.State != "running" {
		t.Fatalf("session_get over MCP through A: %+v", mcpGotA)
	}

	killed := time.Now()
	ra.stopGateway(syscall.SIGKILL)
	keepGap := keepDeadLease(t, ctx, kb, killed, 7*time.Second)
	zero := int64(0)
	if err := kb.Client().CoreV1().Pods(kb.Namespace()).Delete(ctx, "sandgate-"+unseen.ID, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("delete the third session's Pod while nobody leads: %v", err)
	}
	if err := cdpTry(throughA, 4); err == nil {
		t.Error("the CDP connection through A answers after A was killed")
	}
	if err := cdpTry(throughB1, 5); err != nil {
		t.Fatalf("the CDP connection through B right after A's death: %v", err)
	}
	if _, err := rfb.Capture(); err != nil {
		t.Fatalf("the viewer through B right after A's death: %v", err)
	}
	if err := shellRun(shA, "echo dead-$((6*7))", "dead-42"); err == nil {
		t.Error("the shell through A answers after A was killed")
	}
	if err := shellRun(shB, "echo alive-$((6*7))", "alive-42"); err != nil {
		t.Fatalf("the shell through B right after A's death: %v", err)
	}
	// While nobody leads, B admits the commands, files and preview
	// connections it carries alone, as the leader would have: by its
	// copies of the stored tenants (the key issued after B started
	// works, the revoked one does not; a junk key and another tenant's
	// are refused) and revocations, and its watch of the session Pods.
	// What they do reaches the trail once B leads (below).
	gap := execWith(t, fresh, rb.gwURL, issuedKey.APIKey, s.ID, map[string]any{"cmd": []string{"sh", "-c", "echo gap-$((6*7))"}})
	if gap.ExitCode != 0 || string(gap.Stdout) != "gap-42\n" {
		t.Fatalf("a command through B while nobody leads: exit %d, stdout %q", gap.ExitCode, gap.Stdout)
	}
	t.Logf("a command through B answered %.1f s after A's death, nobody leading", time.Since(killed).Seconds())
	const gapFile = "/home/sandgate/workspace/gap.txt"
	if st, body := fileVia(t, fresh, rb.gwURL, rb.keyA, "PUT", s.ID, gapFile, []byte("written while nobody led")); st != 201 {
		t.Fatalf("a file put through B while nobody leads: %d %s", st, body)
	}
	// A snapshot through B, admitted alone and stored by B, holds the
	// file just written; B lists it with those taken while A led
	// (another tenant's key gets 404). Its event reaches the trail once
	// B leads (below).
	snapAt = time.Now()
	gapSnap := snapshotVia(t, fresh, rb, s.ID, "while nobody leads")
	t.Logf("a snapshot through B (%d bytes) answered in %.2f s, %.1f s after A's death, nobody leading", gapSnap.Size, time.Since(snapAt).Seconds(), time.Since(killed).Seconds())
	if got := snapshotFiles(t, rb, gapSnap)["workspace/gap.txt"]; got != "written while nobody led" {
		t.Errorf("the snapshot taken through B while nobody leads: workspace/gap.txt %q", got)
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "GET", "/v1/sessions/"+s.ID+"/snapshots", nil); st != 200 ||
		!bytes.Contains(body, []byte(`"`+snapB.ID+`"`)) || !bytes.Contains(body, []byte(`"`+snapA.ID+`"`)) || !bytes.Contains(body, []byte(`"`+gapSnap.ID+`"`)) {
		t.Errorf("the snapshots listed through B while nobody leads: %d %.300s, want %s, %s and %s", st, body, snapB.ID, snapA.ID, gapSnap.ID)
	}
	for key, want := range map[string]int{rb.keyB: 404, "sk-junk": 401} {
		if st, body := callVia(t, fresh, rb.gwURL, key, "GET", "/v1/sessions/"+s.ID+"/snapshots", nil); st != want {
			t.Errorf("the snapshots listed through B while nobody leads, key %.12s…: %d %s, want %d", key, st, body, want)
		}
		if st, body := callVia(t, fresh, rb.gwURL, key, "POST", "/v1/sessions/"+s.ID+"/snapshots", nil); st != want {
			t.Errorf("a snapshot through B while nobody leads, key %.12s…: %d %s, want %d", key, st, body, want)
		}
	}
	for key, want := range map[string]int{revokedKey.APIKey: 401, "sk-junk": 401, rb.keyB: 404} {
		if st, body := callVia(t, fresh, rb.gwURL, key, "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"cmd": []string{"true"}}); st != want {
			t.Errorf("a command through B while nobody leads, key %.12s…: %d %s, want %d", key, st, body, want)
		}
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/sessions/"+ids.NewSession()+"/exec", map[string]any{"cmd": []string{"true"}}); st != 404 {
		t.Errorf("a command through B while nobody leads, in no session: %d %s, want 404", st, body)
	}
	// Session reads through B: answered alone, from the session's Pod,
	// as the leader showed the session (B still stands by after them).
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "GET", "/v1/sessions/"+s.ID, nil); st != 200 || !sameJSON(body, leaderView) {
		t.Errorf("the session through B while nobody leads: %d %s, want the leader's view %s", st, body, leaderView)
	}
	if st, list := callVia(t, fresh, rb.gwURL, rb.keyA, "GET", "/v1/sessions", nil); st != 200 || !sameJSON(listed(t, list, s.ID), leaderView) {
		t.Errorf("the session list through B while nobody leads: %d %s", st, list)
	}
	if st, list := callVia(t, fresh, rb.gwURL, rb.keyB, "GET", "/v1/sessions", nil); st != 200 || listed(t, list, s.ID) != nil {
		t.Errorf("another tenant's session list through B while nobody leads: %d %s, want it without the session", st, list)
	}
	for key, want := range map[string]int{revokedKey.APIKey: 401, "sk-junk": 401, rb.keyB: 404} {
		if st, body := callVia(t, fresh, rb.gwURL, key, "GET", "/v1/sessions/"+s.ID, nil); st != want {
			t.Errorf("the session through B while nobody leads, key %.12s…: %d %s, want %d", key, st, body, want)
		}
	}
	// An extension and a delete through B: answered alone, by a write
	// of the session Pod's record conditional on its version. The new
	// expiry is on the Pod's label at once. The deleted session reads
	// stopping, and B admits nothing of it from then on (the control:
	// the other session's commands go on). The SDK's delete, with no
	// retries, gets B's answer. Another tenant's key gets neither.
	st, body = callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/sessions/"+s.ID+"/extend", map[string]any{"ttl_seconds": 1500})
	var extended sessionInfo
	if err := json.Unmarshal(body, &extended); st != 200 || err != nil || extended.State != "running" ||
		extended.ExpiresAt.Before(time.Now().Add(1490*time.Second)) || extended.ExpiresAt.After(time.Now().Add(1510*time.Second)) {
		t.Fatalf("an extension through B while nobody leads: %d %s, want 200 and 25 minutes from now", st, body)
	}
	if o, err := kb.Client().CoreV1().Pods(kb.Namespace()).Get(ctx, "sandgate-"+s.ID, metav1.GetOptions{}); err != nil ||
		o.Labels[kube.LabelExpires] != fmt.Sprint(extended.ExpiresAt.Unix()) {
		t.Errorf("the extended session's Pod: %v, expiry label %q, want %d", err, o.Labels[kube.LabelExpires], extended.ExpiresAt.Unix())
	}
	for _, c := range []struct{ key, method, path string }{{rb.keyB, "POST", "/v1/sessions/" + s.ID + "/extend"}, {rb.keyA, "DELETE", "/v1/sessions/" + doomed.ID}} {
		if st, body := callVia(t, fresh, rb.gwURL, c.key, c.method, c.path, map[string]any{"ttl_seconds": 60}); st != 404 {
			t.Errorf("%s %s through B with another tenant's key while nobody leads: %d %s, want 404", c.method, c.path, st, body)
		}
	}
	deletedAt := time.Now()
	gone, err := sandgate.New(rb.gwURL, rb.keyB, sandgate.WithRetry(0)).DeleteSession(ctx, doomed.ID)
	if err != nil || gone.ID != doomed.ID || gone.State != "stopping" {
		t.Fatalf("an SDK delete through B, without retries, while nobody leads: %+v %v, want it stopping", gone, err)
	}
	t.Logf("an SDK delete through B answered in %.2f s, %.1f s after A's death, nobody leading", time.Since(deletedAt).Seconds(), time.Since(killed).Seconds())
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyB, "POST", "/v1/sessions/"+doomed.ID+"/exec", map[string]any{"cmd": []string{"true"}}); st != 409 {
		t.Errorf("a command through B in the session deleted while nobody leads: %d %s, want 409", st, body)
	}
	if r := execWith(t, fresh, rb.gwURL, rb.keyA, s.ID, map[string]any{"cmd": []string{"true"}}); r.ExitCode != 0 {
		t.Errorf("a command through B in the extended session while nobody leads: exit %d", r.ExitCode)
	}
	// Credentials through B, with its own vault (the SDK, without
	// retries): the one stored through A is read, listed and deleted;
	// a new one is stored, listed and read; another tenant's key finds
	// neither. No answer carries a secret. B leading holds them as B
	// left them (below).
	aloneA, aloneB := sandgate.New(rb.gwURL, rb.keyA, sandgate.WithRetry(0)), sandgate.New(rb.gwURL, rb.keyB, sandgate.WithRetry(0))
	gapReq := credential("stored through B alone")
	credAt := time.Now()
	gapCred, err := aloneA.CreateCredential(ctx, gapReq)
	if err != nil || gapCred.Name != gapReq.Name || len(gapCred.Destinations) != 1 || gapCred.Destinations[0].Port != 443 {
		t.Fatalf("a credential stored through B while nobody leads: %+v %v", gapCred, err)
	}
	t.Logf("a credential stored through B answered in %.2f s, %.1f s after A's death, nobody leading", time.Since(credAt).Seconds(), time.Since(killed).Seconds())
	if got, err := aloneA.GetCredential(ctx, preCred.ID); err != nil || got.Name != preReq.Name || got.Username != "qa" {
		t.Errorf("the credential stored through A, read through B while nobody leads: %+v %v", got, err)
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "GET", "/v1/credentials/"+gapCred.ID, nil); st != 200 ||
		!strings.Contains(string(body), gapCred.ID) || strings.Contains(string(body), gapReq.Secret) {
		t.Errorf("the credential stored through B, read through B while nobody leads: %d %s, want it without its secret", st, body)
	}
	st, body = callVia(t, fresh, rb.gwURL, rb.keyA, "GET", "/v1/credentials", nil)
	if st != 200 || !strings.Contains(string(body), preCred.ID) || !strings.Contains(string(body), gapCred.ID) ||
		strings.Contains(string(body), preReq.Secret) || strings.Contains(string(body), gapReq.Secret) {
		t.Errorf("the credentials listed through B while nobody leads: %d %s, want both, without their secrets", st, body)
	}
	if _, err := aloneB.GetCredential(ctx, gapCred.ID); !sandgate.IsNotFound(err) {
		t.Errorf("another tenant's credential read through B while nobody leads: %v, want not found", err)
	}
	if err := aloneB.DeleteCredential(ctx, preCred.ID); !sandgate.IsNotFound(err) {
		t.Errorf("another tenant's credential deleted through B while nobody leads: %v, want not found", err)
	}
	if list, err := aloneB.Credentials(ctx); err != nil || hasCredential(list, preCred.ID) || hasCredential(list, gapCred.ID) {
		t.Errorf("another tenant's credentials listed through B while nobody leads: %+v %v, want neither of tenant-a's", list, err)
	}
	if err := aloneA.DeleteCredential(ctx, preCred.ID); err != nil {
		t.Errorf("the credential stored through A, deleted through B while nobody leads: %v", err)
	}
	if _, err := aloneA.GetCredential(ctx, preCred.ID); !sandgate.IsNotFound(err) {
		t.Errorf("the credential deleted through B, read again while nobody leads: %v, want not found", err)
	}
	if _, err := aloneA.GetCredential(ctx, "junk"); !sandgate.IsNotFound(err) {
		t.Errorf("a credential id that is none, through B while nobody leads: %v, want not found, as a leader answers", err)
	}
	// fill_credential through B: filled alone, with B's vault, as the
	// leader would. A credential not bound to the session is refused
	// (403), its denial kept for the next leader's trail (below);
	// another tenant's key finds no session (404).
	unboundFill := map[string]any{"action": "fill_credential", "credential": gapCred.ID, "selector": "#password"}
	fillAt := time.Now()
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/sessions/"+s.ID+"/actions", unboundFill); st != 403 || !strings.Contains(string(body), "not bound") {
		t.Errorf("a fill of an unbound credential through B while nobody leads: %d %s, want 403", st, body)
	}
	t.Logf("a fill refused through B answered in %.2f s, %.1f s after A's death, nobody leading", time.Since(fillAt).Seconds(), time.Since(killed).Seconds())
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyB, "POST", "/v1/sessions/"+s.ID+"/actions", unboundFill); st != 404 {
		t.Errorf("a fill through B while nobody leads, another tenant's key: %d %s, want 404", st, body)
	}
	// A bound credential, typed alone: the placeholder every replica
	// derives from the vault's key, never the secret, into the field of
	// the page B opened (empty before, the control).
	pass := func() string {
		v, err := chromedp.Run(pageB, chromedp.Evaluate[string](`(document.querySelector("#sg-pass") || {value: "no field"}).value`))
		if err != nil {
			t.Fatalf("the page's field, through B: %v", err)
		}
		return v
	}
	if _, err := chromedp.Run(pageB, chromedp.Evaluate[bool](`document.body.insertAdjacentHTML("beforeend", '<input id="sg-pass" type="password">'); true`)); err != nil {
		t.Fatalf("a password field on the page, through B: %v", err)
	}
	if got := pass(); got != "" {
		t.Fatalf("the field before the fill holds %q", got)
	}
	fillAt = time.Now()
	st, body = callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/sessions/"+s.ID+"/actions",
		map[string]any{"action": "fill_credential", "credential": fillCred.ID, "selector": "#sg-pass"})
	if st != 200 || strings.Contains(string(body), fillSecret) {
		t.Errorf("a fill of a bound credential through B while nobody leads: %d %s, want 200", st, body)
	}
	t.Logf("a fill typed through B answered in %.2f s, %.1f s after A's death, nobody leading", time.Since(fillAt).Seconds(), time.Since(killed).Seconds())
	if got := pass(); got == fillSecret || !strings.HasPrefix(got, "sgph_") || len(got) != len("sgph_")+32 {
		t.Errorf("the field filled through B while nobody leads holds %q, want the placeholder (sgph_ and 32 hex digits), never the secret", redactSecret(got, fillSecret))
	}
	if logLines(rb, fillSecret) > 0 {
		t.Errorf("B's log holds the secret it filled")
	}
	// Profiles through B, with its own profile store: one made, read
	// and listed alone; the session's, in use by its Pod's record.
	// Another tenant's key finds neither; a profile's delete waits for
	// a leader (what holds a profile is the leader's).
	inUse := func(body []byte) string { // "true", "false", or "" when not said
		var p struct {
			InUse *bool `json:"in_use"`
		}
		if json.Unmarshal(body, &p) != nil || p.InUse == nil {
			return ""
		}
		return fmt.Sprint(*p.InUse)
	}
	profAt := time.Now()
	st, body = callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/profiles", map[string]any{"name": "made through B alone"})
	gapProf := jsonField(body, "id")
	if st != 201 || gapProf == "" || inUse(body) != "false" {
		t.Fatalf("a profile made through B while nobody leads: %d %s", st, body)
	}
	t.Logf("a profile made through B answered in %.2f s, %.1f s after A's death, nobody leading", time.Since(profAt).Seconds(), time.Since(killed).Seconds())
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "GET", "/v1/profiles/"+heldProf, nil); st != 200 || inUse(body) != "true" {
		t.Errorf("the session's profile read through B while nobody leads: %d %s, want it in use", st, body)
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "GET", "/v1/profiles/"+gapProf, nil); st != 200 || jsonField(body, "name") != "made through B alone" || inUse(body) != "false" {
		t.Errorf("the profile made through B, read through B while nobody leads: %d %s, want it, not in use", st, body)
	}
	var profs struct {
		Profiles []struct {
			ID    string `json:"id"`
			InUse *bool  `json:"in_use"`
		} `json:"profiles"`
	}
	st, body = callVia(t, fresh, rb.gwURL, rb.keyA, "GET", "/v1/profiles", nil)
	profListed := map[string]string{} // a profile's in_use as said
	if err := json.Unmarshal(body, &profs); st != 200 || err != nil {
		t.Errorf("the profiles listed through B while nobody leads: %d %s", st, body)
	}
	for _, p := range profs.Profiles {
		if p.InUse != nil {
			profListed[p.ID] = fmt.Sprint(*p.InUse)
		}
	}
	if profListed[heldProf] != "true" {
		t.Errorf("the profiles listed through B while nobody leads: %s, want the session's in use", body)
	}
	if profListed[gapProf] != "false" {
		t.Errorf("the profiles listed through B while nobody leads: %s, want the one made through B, not in use", body)
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyB, "GET", "/v1/profiles/"+heldProf, nil); st != 404 {
		t.Errorf("another tenant's profile read through B while nobody leads: %d %s, want 404", st, body)
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyB, "GET", "/v1/profiles", nil); st != 200 || strings.Contains(string(body), heldProf) || strings.Contains(string(body), gapProf) {
		t.Errorf("another tenant's profiles listed through B while nobody leads: %d %s, want neither of tenant-a's", st, body)
	}
	if st, body := callVia(t, fresh, rb.gwURL, "junk", "GET", "/v1/profiles", nil); st != 401 {
		t.Errorf("the profiles through B while nobody leads, a junk key: %d %s, want 401", st, body)
	}
	// The tenant's usage through B, from its session Pods' records:
	// as many sessions as it has Pods (read before and after), the
	// limits the leader said, its stored bytes counted.
	tenantPods := func() int {
		n := 0
		for _, tn := range kubePods(t, kb) {
			if tn == "tenant-a" {
				n++
			}
		}
		return n
	}
	podsBefore := tenantPods()
	usageAt := time.Now()
	st, body = callVia(t, fresh, rb.gwURL, rb.keyA, "GET", "/v1/usage", nil)
	t.Logf("the usage through B answered in %.2f s, %.1f s after A's death, nobody leading", time.Since(usageAt).Seconds(), time.Since(killed).Seconds())
	var usageB sandgate.Usage
	if err := json.Unmarshal(body, &usageB); st != 200 || err != nil {
		t.Errorf("the usage through B while nobody leads: %d %s", st, body)
	} else {
		if podsAfter := tenantPods(); podsAfter == podsBefore && usageB.Sessions != podsBefore || usageB.Sessions < 1 {
			t.Errorf("the usage through B while nobody leads: %d sessions, the tenant has %d Pods (%d after): %s", usageB.Sessions, podsBefore, podsAfter, body)
		}
		// (tenant-a's limits: max_sessions 2, the others none.)
		limits := func(u sandgate.Usage) [6]float64 {
			return [6]float64{float64(u.MaxSessions), u.MaxCPUs, float64(u.MaxMemoryMB), float64(u.MaxRecordings), float64(u.MaxCreatesPerMinute), float64(u.MaxArtifactBytes)}
		}
		if limits(usageB) != limits(usageA) || usageA.MaxSessions != 2 || usageB.ArtifactBytes <= 0 {
			t.Errorf("the usage through B while nobody leads: %s; through A before: %+v", body, usageA)
		}
	}
	if st, body := callVia(t, fresh, rb.gwURL, "junk", "GET", "/v1/usage", nil); st != 401 {
		t.Errorf("the usage through B while nobody leads, a junk key: %d %s, want 401", st, body)
	}
	// The runtimes through B, as the backend offers them now: as the
	// leader said them.
	runtimesAt := time.Now()
	st, body = callVia(t, fresh, rb.gwURL, rb.keyA, "GET", "/v1/runtimes", nil)
	t.Logf("the runtimes through B answered in %.2f s, %.1f s after A's death, nobody leading", time.Since(runtimesAt).Seconds(), time.Since(killed).Seconds())
	if st != 200 || !sameJSON(body, runtimesA) {
		t.Errorf("the runtimes through B while nobody leads: %d %s; through A before: %s", st, body, runtimesA)
	}
	// And the pools (this pair has none: their counts are
	// TestPoolsOf's).
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "GET", "/v1/pools", nil); st != 200 || !sameJSON(body, poolsA) {
		t.Errorf("the pools through B while nobody leads: %d %s; through A before: %s", st, body, poolsA)
	}
	// The admin API's reads through B, by its copy of the stored
	// tenants: the tenants as the leader said them (but their usage,
	// here tenant-a's as many sessions as it has Pods), tenant-a's keys
	// (the one revoked not among them; their last use is as the leader
	// last stored it).
	podsBefore = tenantPods()
	adminAt := time.Now()
	st, body = callVia(t, fresh, rb.gwURL, rb.adminKey, "GET", "/admin/v1/tenants", nil)
	t.Logf("the tenants through B answered in %.2f s, %.1f s after A's death, nobody leading", time.Since(adminAt).Seconds(), time.Since(killed).Seconds())
	if st != 200 || !sameJSON(without(t, body, "tenants", "usage"), without(t, tenantsA, "tenants", "usage")) {
		t.Errorf("the tenants through B while nobody leads: %d %s; through A before: %s", st, body, tenantsA)
	} else {
		var list struct{ Tenants []adminTenant }
		json.Unmarshal(body, &list)
		i := slices.IndexFunc(list.Tenants, func(a adminTenant) bool { return a.Name == "tenant-a" })
		if podsAfter := tenantPods(); i < 0 || podsAfter == podsBefore && list.Tenants[i].Usage.Sessions != podsBefore || list.Tenants[i].Usage.Sessions < 1 {
			t.Errorf("tenant-a through B while nobody leads: %s, want as many sessions as its %d Pods (%d after)", body, podsBefore, podsAfter)
		}
	}
	st, body = callVia(t, fresh, rb.gwURL, rb.adminKey, "GET", "/admin/v1/tenants/tenant-a/keys", nil)
	if st != 200 || !sameJSON(without(t, body, "keys", "last_used_at"), without(t, keysA, "keys", "last_used_at")) || strings.Contains(string(body), revokedKey.ID) {
		t.Errorf("tenant-a's keys through B while nobody leads: %d %s; through A before: %s", st, body, keysA)
	}
	for _, key := range []string{"junk", rb.keyA} {
		if st, body := callVia(t, fresh, rb.gwURL, key, "GET", "/admin/v1/tenants", nil); st != 401 {
			t.Errorf("the tenants through B while nobody leads, with %.6s… as the admin key: %d %s, want 401", key, st, body)
		}
	}
	// The MCP endpoint through B, its key checked by B's copy of the
	// tenants: its tools' calls go through B's own listener, so a read
	// and a command are answered alone (a create too:
	// TestKubeRelayProfile). A junk key is refused before any tool.
	mcpAt := time.Now()
	cs := mcpConnect(t, rb.mcpHTTP(rb.keyA))
	var mcpGot sandgate.Session
	getAt = time.Now()
	callTool(t, cs, "session_get", map[string]any{"session_id": s.ID}, &mcpGot)
	mcpGetB := time.Since(getAt)
	if mcpGot.ID != s.ID || mcpGot.State != "running" || mcpGot.ExpiresAt.IsZero() {
		t.Errorf("session_get over MCP through B while nobody leads: %+v", mcpGot)
	}
	t.Logf("a session_get over MCP through B, nobody leading, took %.3f s; through A, leading, %.3f s (B/A %.2f)", mcpGetB.Seconds(), mcpGetA.Seconds(), mcpGetB.Seconds()/mcpGetA.Seconds())
	var mcpRan struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	callTool(t, cs, "exec", map[string]any{"session_id": s.ID, "command": "echo mcp-$((6*7))"}, &mcpRan)
	if mcpRan.ExitCode != 0 || mcpRan.Stdout != "mcp-42\n" {
		t.Errorf("exec over MCP through B while nobody leads: %+v", mcpRan)
	}
	t.Logf("MCP through B (connect, session_get, exec) answered in %.2f s, %.1f s after A's death, nobody leading", time.Since(mcpAt).Seconds(), time.Since(killed).Seconds())
	if st, body := rb.rawPost(t, "/mcp", "Bearer junk", `{"jsonrpc":"2.0","id":1,"method":"ping"}`); st != 401 {
		t.Errorf("MCP through B while nobody leads, a junk key: %d %s, want 401", st, body)
	}
	// The OpenAPI document through B, as A served it; B's metrics are
	// its own, as before the kill.
	if st, body := callVia(t, fresh, rb.gwURL, "", "GET", "/openapi.json", nil); st != 200 || !bytes.Equal(body, openapiA) {
		t.Errorf("the OpenAPI document through B while nobody leads: %d, %d bytes; through A before, %d bytes", st, len(body), len(openapiA))
	}
	if st, body := callVia(t, fresh, rb.gwURL, "", "GET", "/metrics", nil); st != 200 || !strings.Contains(string(body), "\nsandgate_gateway_leading 0\n") {
		t.Errorf("B's metrics while nobody leads: %d %s", st, body)
	}
	// A profile's rollback and delete through B, by its store and the
	// Pods: the session's profile, which its Pod names, is in use
	// (409); the one made through B is rolled back (a version not kept
	// refused as the leader refuses it), then deleted, and gone.
	for _, r := range [][3]string{{"DELETE", "/v1/profiles/" + heldProf, ""}, {"POST", "/v1/profiles/" + heldProf + "/rollback", `{"version":0}`}} {
		if st, body := sendVia(t, fresh, rb.gwURL, rb.keyA, r[0], r[1], []byte(r[2]), "application/json"); st != 409 || !strings.Contains(string(body), "in use") {
			t.Errorf("%s %s (the session's profile) through B while nobody leads: %d %s, want 409", r[0], r[1], st, body)
		}
	}
	for _, r := range [][3]string{{"DELETE", "/v1/profiles/" + gapProf, ""}, {"POST", "/v1/profiles/" + gapProf + "/rollback", `{"version":0}`}} {
		if st, body := sendVia(t, fresh, rb.gwURL, rb.keyB, r[0], r[1], []byte(r[2]), "application/json"); st != 404 {
			t.Errorf("%s %s with another tenant's key through B while nobody leads: %d %s, want 404", r[0], r[1], st, body)
		}
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/profiles/"+gapProf+"/rollback", map[string]any{"version": 7}); st != 400 {
		t.Errorf("a rollback to a version not kept through B while nobody leads: %d %s, want 400", st, body)
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/profiles/"+gapProf+"/rollback", map[string]any{"version": 0}); st != 200 || jsonField(body, "id") != gapProf || inUse(body) != "false" {
		t.Errorf("a rollback through B while nobody leads: %d %s", st, body)
	}
	deleteAt := time.Now()
	st, body = callVia(t, fresh, rb.gwURL, rb.keyA, "DELETE", "/v1/profiles/"+gapProf, nil)
	t.Logf("a profile deleted through B answered in %.2f s, %.1f s after A's death, nobody leading", time.Since(deleteAt).Seconds(), time.Since(killed).Seconds())
	if st != 204 {
		t.Errorf("a profile's delete through B while nobody leads: %d %s, want 204", st, body)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, m, "/v1/profiles/"+gapProf, nil); st != 404 {
			t.Errorf("%s of the profile deleted through B while nobody leads: %d %s, want 404", m, st, body)
		}
	}
	// A person's view link and a reviewer's reads through B, answered
	// alone from the store: the view page; the trail as stored (the
	// screenshot A took is in it), the artifacts and an artifact's link;
	// a review link's page and artifact, whose uses go into the stored
	// trail (checked once B leads). Another tenant's key gets none.
	viewPage("while nobody leads")
	hasShot := func(body []byte) bool {
		var trail struct {
			Events []struct {
				Type   string         `json:"type"`
				Fields map[string]any `json:"fields"`
			} `json:"events"`
		}
		json.Unmarshal(body, &trail)
		for _, ev := range trail.Events {
			if ev.Type == "screenshot" && ev.Fields["artifact"] == shot.ID {
				return true
			}
		}
		return false
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "GET", "/v1/sessions/"+s.ID+"/events", nil); st != 200 || !hasShot(body) {
		t.Errorf("the trail through B while nobody leads: %d %.300s, want the stored trail with the screenshot %s", st, body, shot.ID)
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "GET", "/v1/sessions/"+s.ID+"/artifacts", nil); st != 200 || !bytes.Contains(body, []byte(`"`+shot.ID+`"`)) {
		t.Errorf("the artifacts through B while nobody leads: %d %.300s, want the screenshot %s", st, body, shot.ID)
	}
	if png := rb.fetchArtifact(t, rb.keyA, shot.ID); fmt.Sprintf("%x", sha256.Sum256(png)) != shot.SHA256 {
		t.Errorf("the screenshot's link through B while nobody leads: %d bytes, not the screenshot", len(png))
	}
	for _, path := range []string{"/v1/sessions/" + s.ID + "/events", "/v1/sessions/" + s.ID + "/artifacts", "/v1/artifacts/" + shot.ID} {
		if st, body := callVia(t, fresh, rb.gwURL, rb.keyB, "GET", path, nil); st != 404 {
			t.Errorf("GET %s through B while nobody leads, another tenant's key: %d %s, want 404", path, st, body)
		}
	}
	noRedirect := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	reviewGet := func(u string) (int, []byte, string) {
		t.Helper()
		resp, err := noRedirect.Get(u)
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b, resp.Header.Get("Location")
	}
	// The ended session's review link: its page and its log, served
	// alone, their use added to its stored log.
	if st, page, _ := reviewGet(viaB(endedReview.URL)); st != 200 || !bytes.Contains(page, []byte(endedLog)) {
		t.Errorf("the ended session's review page through B while nobody leads: %d %.300s, want it with the log %s", st, page, endedLog)
	}
	if st, _, loc := reviewGet(viaB(endedReview.URL) + "/artifacts/" + endedLog); st != 302 || loc == "" {
		t.Errorf("the ended session's review's log through B while nobody leads: %d, Location %q", st, loc)
	} else if resp, err := http.Get(loc); err != nil || resp.StatusCode != 200 {
		t.Errorf("the review's log's link: %v %v", resp, err)
	} else {
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.Contains(raw, []byte(`"type":"created"`)) {
			t.Errorf("the ended session's log through its review link: %.300s", raw)
		}
	}
	// The running session's review link: its page and the screenshot,
	// served alone; their use is kept for the next leader's trail
	// (checked once B leads).
	if st, page, _ := reviewGet(viaB(reviewP.URL)); st != 200 || !bytes.Contains(page, []byte(shot.ID)) {
		t.Errorf("the running session's review page through B while nobody leads: %d %.300s, want it with the screenshot %s", st, page, shot.ID)
	}
	if st, _, loc := reviewGet(viaB(reviewP.URL) + "/artifacts/" + shot.ID); st != 302 || loc == "" {
		t.Errorf("the running session's screenshot through its review link through B while nobody leads: %d, Location %q", st, loc)
	}
	// The ended session's review link revoked through B (another
	// tenant's key cannot): refused at once; its revocation goes into
	// the session's log (checked once B leads).
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyB, "DELETE", "/v1/sessions/"+ended.ID+"/previews/"+endedReview.ID, nil); st != 404 {
		t.Errorf("another tenant's revocation of the ended session's review link through B while nobody leads: %d %s, want 404", st, body)
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "DELETE", "/v1/sessions/"+ended.ID+"/previews/"+endedReview.ID, nil); st != 204 {
		t.Errorf("the ended session's review link revoked through B while nobody leads: %d %s", st, body)
	}
	if st, _, _ := reviewGet(viaB(endedReview.URL)); st != 401 {
		t.Errorf("the ended session's review link revoked through B while nobody leads, then opened through B: %d, want 401", st)
	}
	// Review links issued through B: the ended session's, its issue in
	// its stored log before the link is handed out, and its page served
	// alone; the running session's, its issue kept for the next leader.
	issueReview := func(id string) previewInfo {
		t.Helper()
		st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/sessions/"+id+"/previews", map[string]any{"scope": "review", "ttl_seconds": 600})
		var p previewInfo
		if err := json.Unmarshal(body, &p); st != 201 || err != nil {
			t.Fatalf("a review link of %s issued through B while nobody leads: %d %s", id, st, body)
		}
		return p
	}
	gapEndedReview, gapReview := issueReview(ended.ID), issueReview(s.ID)
	if st, page, _ := reviewGet(viaB(gapEndedReview.URL)); st != 200 || !bytes.Contains(page, []byte(endedLog)) {
		t.Errorf("the ended session's review link issued through B, opened through B while nobody leads: %d %.300s", st, page)
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyB, "POST", "/v1/sessions/"+ended.ID+"/previews", map[string]any{"scope": "review"}); st != 404 {
		t.Errorf("another tenant's review link of the ended session through B while nobody leads: %d %s, want 404", st, body)
	}
	if st, _, _ := reviewGet(viaB(strings.Replace(p1.URL, "/cdp/", "/review/", 1))); st != 401 {
		t.Errorf("a CDP preview as a review link through B while nobody leads: %d, want 401", st)
	}
	if _, body := callVia(t, fresh, rb.gwURL, "", "GET", "/healthz", nil); jsonField(body, "status") != "standby" {
		t.Fatalf("B leads already (%s, %.1f s after the kill): the reads above prove nothing alone", body, time.Since(killed).Seconds())
	}
	// A new CDP connection through B, by its copy of the stored
	// revocations: the revoked preview's is refused, another's works.
	if _, err := browserWSErr(viaB(p2.URL)); err == nil {
		t.Error("the revoked preview answers through B while nobody leads")
	}
	gapCDP := cdpDial(t, browserWS(t, viaB(p1.URL)))
	defer gapCDP.Close()
	if err := cdpTry(gapCDP, 1); err != nil {
		t.Fatalf("a new CDP connection through B while nobody leads: %v", err)
	}
	// A preview issued through B: signed by B, its connection admitted
	// alone; its issue reaches the trail once B leads (below).
	gapPreview := rb.preview(t, rb.keyA, s.ID, 300)
	gapIssued := cdpDial(t, browserWS(t, viaB(gapPreview.URL)))
	defer gapIssued.Close()
	if err := cdpTry(gapIssued, 1); err != nil {
		t.Fatalf("a CDP connection of a preview issued through B while nobody leads: %v", err)
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyB, "POST", "/v1/sessions/"+s.ID+"/previews", map[string]any{"scope": "cdp"}); st != 404 {
		t.Errorf("another tenant's preview of the session through B while nobody leads: %d %s, want 404", st, body)
	}
	// Revoked through B: stored, its connection B carries ends, a new
	// one is refused; another tenant's key cannot.
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyB, "DELETE", "/v1/sessions/"+s.ID+"/previews/"+gapPreview.ID, nil); st != 404 {
		t.Errorf("another tenant's revocation through B while nobody leads: %d %s, want 404", st, body)
	}
	if err := cdpTry(gapIssued, 2); err != nil {
		t.Fatalf("the CDP connection of the preview issued through B, before its revocation: %v", err)
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "DELETE", "/v1/sessions/"+s.ID+"/previews/"+gapPreview.ID, nil); st != 204 {
		t.Fatalf("a revocation through B while nobody leads: %d %s", st, body)
	}
	waitFor(t, 30*time.Second, "the revoked preview's connection through B to end", func() bool { return cdpTry(gapIssued, 3) != nil })
	if _, err := browserWSErr(viaB(gapPreview.URL)); err == nil {
		t.Error("the preview revoked through B while nobody leads answers through B")
	}
	if _, body := callVia(t, fresh, rb.gwURL, "", "GET", "/healthz", nil); jsonField(body, "status") != "standby" {
		t.Fatalf("B leads already (%s, %.1f s after the kill): the preview above proves nothing alone", body, time.Since(killed).Seconds())
	}
	if logLines(rb, "no leader answers: this replica admits") != 1 {
		t.Errorf("B's log should say once that it admits alone")
	}
	var stdout []byte
	var exits []int
	for long.Scan() {
		var r execRec
		if err := json.Unmarshal(long.Bytes(), &r); err != nil {
			t.Fatalf("record %q: %v", long.Text(), err)
		}
		stdout = append(stdout, r.Data...)
		if r.ExitCode != nil {
			exits = append(exits, *r.ExitCode)
		}
	}
	if string(stdout) != "survived\n" || len(exits) != 1 || exits[0] != 0 {
		t.Fatalf("the command through B across A's death: stdout %q, exits %v", stdout, exits)
	}
	// Creates through B while nobody leads: a cold start B makes
	// itself, admitted by the session Pods (tenant-a holds one of its
	// 2; tenant-b's one, deleted above, holds its Pod while it stops),
	// from the snapshot taken through B just before (unpacked by B),
	// with its preview and its recording (placed with the replicas, as
	// a leader places it), driven through B at once. Three of
	// tenant-a's at once: one is made, the others are over its quota
	// (429 with a Retry-After), as is tenant-b's. One from a profile
	// waits for a leader: 503, to retry.
	type createAnswer struct {
		st   int
		body []byte
		took time.Duration
		err  error
	}
	createVia := func(key string, req map[string]any) createAnswer {
		raw, _ := json.Marshal(req)
		hreq, _ := http.NewRequestWithContext(ctx, "POST", rb.gwURL+"/v1/sessions", bytes.NewReader(raw))
		hreq.Header.Set("Authorization", "Bearer "+key)
		hreq.Header.Set("Content-Type", "application/json")
		at := time.Now()
		resp, err := fresh.Do(hreq)
		if err != nil {
			return createAnswer{err: err}
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 201 && resp.Header.Get("Retry-After") == "" {
			body = append(body, " (no Retry-After)"...)
		}
		return createAnswer{st: resp.StatusCode, body: body, took: time.Since(at)}
	}
	// (A quarter CPU: the trial node's 2 are held by the other two.)
	answers := make(chan createAnswer, 3)
	for range 3 {
		go func() {
			answers <- createVia(rb.keyA, map[string]any{"runtime": "runc", "resources": map[string]any{"cpus": 0.25}, "record": true, "snapshot": gapSnap.ID,
				"labels": map[string]string{"made": "alone"}, "preview": map[string]any{"scope": "cdp", "ttl_seconds": 600},
				"egress":      map[string]any{"allow": []string{"pages.sandgate.test:80"}},
				"credentials": []map[string]any{{"credential": fillCred.ID, "scheme": "http", "host": "pages.sandgate.test", "port": 80}}})
		}()
	}
	var madeAlone struct {
		sessionInfo
		Preview previewInfo `json:"preview"`
	}
	var aloneCreate time.Duration
	var codes []int
	for range 3 {
		a := <-answers
		switch {
		case a.err != nil:
			t.Fatalf("a create through B while nobody leads: %v", a.err)
		case a.st == 201:
			if madeAlone.ID != "" {
				t.Errorf("two of tenant-a's creates through B while nobody leads were made, past its quota: %s and %s", madeAlone.ID, a.body)
			}
			if err := json.Unmarshal(a.body, &madeAlone); err != nil || madeAlone.State != "running" || madeAlone.Labels["made"] != "alone" || madeAlone.Preview.URL == "" {
				t.Fatalf("a create through B while nobody leads: %s", a.body)
			}
			aloneCreate = a.took
		case a.st != 429 || bytes.Contains(a.body, []byte("no Retry-After")):
			t.Errorf("one of three creates at once through B while nobody leads: %d %s, want 201 or 429 with a Retry-After", a.st, a.body)
		}
		codes = append(codes, a.st)
	}
	if madeAlone.ID == "" {
		t.Fatalf("three creates at once through B while nobody leads, tenant-a holding one of its 2 sessions: %v, none made", codes)
	}
	t.Logf("a create through B (a cold start, runc, from a snapshot, recorded, with a preview) answered in %.2f s, %.1f s after A's death, nobody leading; through A, leading, %.2f s (B/A %.2f); three at once: %v",
		aloneCreate.Seconds(), time.Since(killed).Seconds(), leaderCreate.Seconds(), aloneCreate.Seconds()/leaderCreate.Seconds(), codes)
	// It holds the snapshot's file, as handed out (read through B).
	if st, body := fileVia(t, fresh, rb.gwURL, rb.keyA, "GET", madeAlone.ID, gapFile, nil); st != 200 || string(body) != "written while nobody led" {
		t.Errorf("the snapshot's file in the session created through B from it while nobody leads: %d %q", st, body)
	}
	aloneCDP := cdpDial(t, browserWS(t, viaB(madeAlone.Preview.URL)))
	defer aloneCDP.Close()
	if err := cdpTry(aloneCDP, 1); err != nil {
		t.Fatalf("CDP through B to the session created while nobody leads: %v", err)
	}
	// Its binding holds, as a leader's session's: the test page through
	// the egress proxy, and the bound credential typed into it through B
	// (the placeholder, never the secret).
	aloneAlloc, aloneAllocCancel := remote.NewAllocator(ctx, browserWS(t, viaB(madeAlone.Preview.URL)), remote.NoModifyURL)
	defer aloneAllocCancel()
	alonePage, alonePageCancel := chromedp.NewContext(aloneAlloc)
	defer alonePageCancel()
	if title, err := navigateTitle(alonePage, "http://pages.sandgate.test/hello.html"); err != nil || title != "Sandgate test page" {
		t.Fatalf("the bound credential's page in the session created through B while nobody leads: %q, %v", title, err)
	}
	if _, err := chromedp.Run(alonePage, chromedp.Evaluate[bool](`document.body.insertAdjacentHTML("beforeend", '<input id="sg-pass" type="password">'); true`)); err != nil {
		t.Fatalf("a password field on the page of the session created alone: %v", err)
	}
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/sessions/"+madeAlone.ID+"/actions",
		map[string]any{"action": "fill_credential", "credential": fillCred.ID, "selector": "#sg-pass"}); st != 200 || strings.Contains(string(body), fillSecret) {
		t.Errorf("a fill of the bound credential in the session created through B while nobody leads: %d %s, want 200", st, body)
	}
	if got, err := chromedp.Run(alonePage, chromedp.Evaluate[string](`document.querySelector("#sg-pass").value`)); err != nil || got == fillSecret || !strings.HasPrefix(got, "sgph_") {
		t.Errorf("the field filled in the session created alone holds %q (%v), want the placeholder", redactSecret(got, fillSecret), err)
	}
	if o, err := kb.Client().CoreV1().Pods(kb.Namespace()).Get(ctx, "sandgate-"+madeAlone.ID, metav1.GetOptions{}); err != nil || o.Labels[kube.LabelTenant] != "tenant-a" {
		t.Errorf("the Pod of the session created through B while nobody leads: %v %v", err, o.Labels)
	}
	// Its recording, placed by B: held by a replica (B, the one that
	// runs), which says it records.
	if le, err := kb.Client().CoordinationV1().Leases(kb.Namespace()).Get(ctx, "sandgate-recording-"+madeAlone.ID, metav1.GetOptions{}); err != nil ||
		le.Spec.HolderIdentity == nil || le.Annotations["sandgate.io/work-ready"] == "" {
		t.Errorf("the recording lease of the session created through B while nobody leads: %v %+v, want it held and recording", err, le)
	}
	refusedAlone := func(key string, req map[string]any, want int, why string) {
		t.Helper()
		raw, _ := json.Marshal(req)
		hreq, _ := http.NewRequestWithContext(ctx, "POST", rb.gwURL+"/v1/sessions", bytes.NewReader(raw))
		hreq.Header.Set("Authorization", "Bearer "+key)
		hreq.Header.Set("Content-Type", "application/json")
		resp, err := fresh.Do(hreq)
		if err != nil {
			t.Fatalf("a create through B while nobody leads (%s): %v", why, err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want || resp.Header.Get("Retry-After") == "" {
			t.Errorf("a create through B while nobody leads (%s): %d, Retry-After %q, %s; want %d with a Retry-After", why, resp.StatusCode, resp.Header.Get("Retry-After"), got, want)
		}
	}
	podsMade := kubePods(t, kb)
	refusedAlone(rb.keyB, map[string]any{"runtime": "runc"}, 429, "tenant-b's second session")
	// Bindings checked against B's vault before the quota: another
	// tenant's credential is none (404), one sent where its owner did
	// not say it goes is refused (403).
	for _, c := range []struct {
		key, host string
		want      int
	}{{rb.keyB, "pages.sandgate.test", 404}, {rb.keyA, "elsewhere.sandgate.test", 403}} {
		a := createVia(c.key, map[string]any{"runtime": "runc", "credentials": []map[string]any{{"credential": fillCred.ID, "scheme": "http", "host": c.host, "port": 80}}})
		if a.err != nil || a.st != c.want {
			t.Errorf("a create through B binding %s's credential to %s while nobody leads: %d %s %v, want %d", map[bool]string{true: "tenant-a", false: "another tenant"}[c.key == rb.keyA], c.host, a.st, a.body, a.err, c.want)
		}
	}
	// A snapshot checked against B's store before the quota: another
	// tenant's is none (404), as is one that does not exist.
	for key, snap := range map[string]string{rb.keyB: gapSnap.ID, rb.keyA: "art_0000000000000000"} {
		if a := createVia(key, map[string]any{"runtime": "runc", "snapshot": snap}); a.err != nil || a.st != 404 {
			t.Errorf("a create through B from snapshot %s while nobody leads, %s's key: %d %s %v, want 404", snap, map[bool]string{true: "tenant-a", false: "tenant-b"}[key == rb.keyA], a.st, a.body, a.err)
		}
	}
	// A profile checked against B's store too: another tenant's is none.
	if a := createVia(rb.keyB, map[string]any{"runtime": "runc", "profile": map[string]any{"id": heldProf}}); a.err != nil || a.st != 404 {
		t.Errorf("a create through B from tenant-a's profile while nobody leads, tenant-b's key: %d %s %v, want 404", a.st, a.body, a.err)
	}
	for id, tn := range kubePods(t, kb) {
		if _, ok := podsMade[id]; !ok {
			t.Errorf("a session Pod (%s, %s) after the creates through B that were refused", id, tn)
		}
	}
	// An SDK call through B while no replica that answers leads, that
	// waits for a leader: refused at once without retries (the
	// control); with them (the SDK's default), answered once B leads,
	// as B's 503s say to retry. (A create that does not wait for its
	// session is a leader's alone; this one's TTL cannot be, so a leader
	// refuses it, 400, before it does anything.)
	var sdkErr *sandgate.Error
	if _, err := sandgate.New(rb.gwURL, rb.keyA, sandgate.WithRetry(0)).CreateSession(ctx, sandgate.SessionRequest{TTLSeconds: -1, NoWait: true}); !sandgate.IsUnavailable(err) {
		t.Errorf("an SDK call through B without retries right after A's death: %v, want unavailable", err)
	}
	gapEnded := time.Since(killed)
	n := keepGap()
	if n > 0 {
		t.Logf("the steps while nobody leads ended %.1f s after the kill; the test renewed A's lease %d times meanwhile (a slow machine), so B leads later than the lease alone would have it", gapEnded.Seconds(), n)
	} else {
		t.Logf("the steps while nobody leads ended %.1f s after the kill", gapEnded.Seconds())
	}
	if _, err := sandgate.New(rb.gwURL, rb.keyA).CreateSession(ctx, sandgate.SessionRequest{TTLSeconds: -1, NoWait: true}); !errors.As(err, &sdkErr) || sdkErr.Code != "invalid_argument" {
		t.Fatalf("an SDK call through B, retried, after A's death: %v, want the leader's invalid_argument", err)
	}
	t.Logf("an SDK call through B made after A's death was answered %.1f s after the kill", time.Since(killed).Seconds())
	if st := httpStatus(rb.gwURL + "/readyz"); st == 200 {
		t.Logf("(B answers ready already: it leads %.1f s after the kill)", time.Since(killed).Seconds())
	}
	waitFor(t, 3*time.Minute, "B to lead", func() bool {
		led, _, _ := leaderAnswers(t, rb, rb.keyA)
		return led
	})
	if st, body := rb.api(t, rb.keyA, "GET", "/v1/sessions/"+s.ID, nil); st != 200 || jsonField(body, "state") != "running" {
		t.Fatalf("the session through B, leading: %d %s", st, body)
	}
	t.Logf("B leads %.1f s after A's death", time.Since(killed).Seconds())
	// The session B created while nobody led, B leading has adopted:
	// it reads running, its trail has its create (made by a replica
	// while none led), its start, its recording's start (once: the
	// recording goes on, placed before; placed before the snapshot went
	// in), its snapshot's restore, its preview's issue and its
	// adoption, the connection made through
	// its preview goes on, and it is deleted as any, its recording
	// finished.
	if st, body := rb.api(t, rb.keyA, "GET", "/v1/sessions/"+madeAlone.ID, nil); st != 200 || jsonField(body, "state") != "running" {
		t.Errorf("the session created while nobody led, through B leading: %d %s", st, body)
	}
	var startedAlone map[string]any
	waitFor(t, 30*time.Second, "the trail of the session created while nobody led, through B leading", func() bool {
		var types []string
		made, issued, recStarted, restored := false, false, 0, false
		for _, ev := range rb.events(t, rb.keyA, madeAlone.ID) {
			types = append(types, ev.Type)
			made = made || ev.Type == "created" && strings.Contains(fmt.Sprint(ev.Fields["created_by"]), "while none led")
			if ev.Type == "started" {
				startedAlone = ev.Fields
			}
			issued = issued || ev.Type == "preview_issued" && ev.Fields["preview"] == madeAlone.Preview.ID
			if ev.Type == "recording_started" {
				recStarted++
			}
			restored = restored || ev.Type == "snapshot_restored" && ev.Fields["snapshot"] == gapSnap.ID && ev.Fields["sha256"] != nil
		}
		return made && issued && restored && recStarted == 1 && len(types) >= 6 && types[0] == "created" && types[1] == "started" &&
			types[2] == "recording_started" && types[3] == "snapshot_restored" && slices.Contains(types, "adopted")
	})
	t.Logf("the start of the session created through B while nobody led: %v", startedAlone)
	if err := cdpTry(aloneCDP, 2); err != nil {
		t.Errorf("CDP through B to the session created while nobody led, B leading: %v", err)
	}
	if st, body := rb.api(t, rb.keyA, "DELETE", "/v1/sessions/"+madeAlone.ID, nil); st != 200 {
		t.Errorf("delete the session created while nobody led, through B leading: %d %s", st, body)
	}
	deletedAlone := time.Now()
	waitFor(t, 2*time.Minute, "the recording of the session created while nobody led, finished", func() bool {
		as := rb.artifacts(t, rb.keyA, madeAlone.ID)
		return findKind(as, "recording", "video/mp4") != nil && findKind(as, "recording", "application/json") != nil
	})
	if _, m := rb.finalRecording(t, rb.keyA, madeAlone.ID); len(m["segments"].([]any)) == 0 {
		t.Errorf("the recording of the session created while nobody led has no segment: %v", m)
	}
	var recTypes []string
	for _, ev := range rb.events(t, rb.keyA, madeAlone.ID) {
		if strings.HasPrefix(ev.Type, "recording_") {
			recTypes = append(recTypes, ev.Type)
		}
	}
	if !slices.Contains(recTypes, "recording_finalised") || slices.Contains(recTypes, "recording_failed") {
		t.Errorf("the recording events of the session created while nobody led: %v, want it finalised, not failed", recTypes)
	}
	t.Logf("the recording of the session created while nobody led was finished %.1f s after its delete: %v", time.Since(deletedAlone).Seconds(), recTypes)
	// What B did alone, B leading holds to: the extended session keeps
	// its new expiry; the deleted one is stopped (its Pod gone), its
	// trail has the request, when it was made, and then its end.
	if st, body := rb.api(t, rb.keyA, "GET", "/v1/sessions/"+s.ID, nil); st != 200 || jsonField(body, "expires_at") != extended.ExpiresAt.Format(time.RFC3339Nano) {
		t.Errorf("the session extended while nobody led, through B leading: %d %s, want it expiring at %v", st, body, extended.ExpiresAt)
	}
	if list, err := sandgate.New(rb.gwURL, rb.keyA).Credentials(ctx); err != nil || !hasCredential(list, gapCred.ID) || hasCredential(list, preCred.ID) {
		t.Errorf("the credentials through B leading: %+v %v, want the one stored while nobody led, not the one deleted", list, err)
	}
	waitFor(t, 30*time.Second, "fill_credential_denied of the fill B refused while nobody led, in the trail of B, leading", func() bool {
		for _, ev := range rb.events(t, rb.keyA, s.ID) {
			if ev.Type == "fill_credential_denied" && ev.Fields["credential"] == gapCred.ID && ev.Fields["reason"] == "not_bound" && ev.Fields["selector"] == "#password" {
				return true
			}
		}
		return false
	})
	if st, body := rb.api(t, rb.keyA, "GET", "/v1/profiles/"+gapProf, nil); st != 404 {
		t.Errorf("the profile made and deleted while nobody led, through B leading: %d %s, want 404", st, body)
	}
	waitFor(t, 30*time.Second, "fill_credential of the fill B typed while nobody led, in the trail of B, leading", func() bool {
		for _, ev := range rb.events(t, rb.keyA, s.ID) {
			if ev.Type == "fill_credential" && ev.Fields["credential"] == fillCred.ID && ev.Fields["mode"] == "placeholder" &&
				ev.Fields["selector"] == "#sg-pass" && ev.Fields["page"] == "http://pages.sandgate.test/hello.html" {
				return true
			}
		}
		return false
	})
	leadAt := time.Now()
	waitFor(t, 2*time.Minute, "the session deleted while nobody led stopped, its Pod gone", func() bool {
		_, pod := kubePods(t, kb)[doomed.ID]
		return !pod && stopAsked(t, rb, rb.keyB, doomed.ID, deletedAt, "deleted through a gateway replica while none led")
	})
	t.Logf("the session deleted while nobody led was stopped, its Pod gone, %.1f s after B was seen leading", time.Since(leadAt).Seconds())
	// The session whose Pod went while nobody led: B, leading, stores
	// its log from its trail's pieces, with its end, and drops them.
	led := time.Now()
	waitFor(t, 2*time.Minute, "the log of the session whose Pod went while nobody led, with its end", func() bool {
		st, body := rb.api(t, rb.keyA, "GET", "/v1/sessions/"+unseen.ID+"/events", nil)
		return st == 200 && bytes.Contains(body, []byte(`"created"`)) && bytes.Contains(body, []byte(`"ended_unobserved"`))
	})
	t.Logf("the session whose Pod went while nobody led was finalised %.1f s after B led", time.Since(led).Seconds())
	waitFor(t, 30*time.Second, "the pieces of the session whose Pod went while nobody led removed", func() bool {
		return len(storedTrail(t, mc, "tenant-a", unseen.ID)) == 0
	})
	if b := storedTrail(t, mc, "tenant-a", s.ID); !bytes.Contains(b, []byte(`"created"`)) {
		t.Errorf("the running session's pieces, the control, are not in MinIO: %.300s", b)
	}
	for i := 6; i < 9; i++ {
		if err := cdpTry(throughB1, i); err != nil {
			t.Fatalf("the CDP connection through B after it took the lead: %v", err)
		}
	}
	if _, err := rfb.Capture(); err != nil {
		t.Fatalf("the viewer through B after it took the lead: %v", err)
	}
	if err := cdpTry(gapCDP, 2); err != nil {
		t.Fatalf("the CDP connection B admitted alone, after it took the lead: %v", err)
	}
	if err := shellRun(shB, "echo led-$((6*7))", "led-42"); err != nil {
		t.Fatalf("the shell through B after it took the lead: %v", err)
	}
	if code, err := shellExit(shB, "exit 5"); err != nil || code != 5 {
		t.Fatalf("the shell through B's exit: %d %v, want 5", code, err)
	}
	waitFor(t, 30*time.Second, "shell_closed of the shell B carried, in the trail of B, leading", func() bool {
		for _, ev := range rb.events(t, rb.keyA, s.ID) {
			if ev.Type == "shell_closed" && fmt.Sprint(ev.Fields["exit_code"]) == "5" {
				return true
			}
		}
		return false
	})
	waitFor(t, 30*time.Second, "the exec event of the command that ran across A's death, in the trail of B, leading", func() bool {
		return execEvent(rb, 0, "survived")
	})
	waitFor(t, 30*time.Second, "the exec event, file_upload and snapshot_saved of what B admitted while nobody led, in the trail of B, leading", func() bool {
		return execEvent(rb, 0, "gap-") && fileEvent(rb, "file_upload", gapFile) != nil && snapshotEvent(t, rb, s.ID, gapSnap)
	})
	if _, err := browserWSErr(viaB(gapPreview.URL)); err == nil {
		t.Error("the preview revoked through B while nobody led answers through B, leading")
	}
	waitFor(t, 30*time.Second, "preview_revoked of the preview B revoked while nobody led, in the trail of B, leading", func() bool {
		return connected(rb, "preview_revoked", gapPreview.ID)
	})
	waitFor(t, 30*time.Second, "preview_issued of the preview B issued while nobody led, in the trail of B, leading", func() bool {
		for _, ev := range rb.events(t, rb.keyA, s.ID) {
			if ev.Type == "preview_issued" && ev.Fields["preview"] == gapPreview.ID {
				exp, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(ev.Fields["expires_at"]))
				if !exp.Equal(gapPreview.ExpiresAt) || ev.Fields["scope"] != "cdp" {
					t.Fatalf("preview_issued of the preview B issued: %v, want its scope and expiry %v", ev.Fields, gapPreview.ExpiresAt)
				}
				return true
			}
		}
		return false
	})
	// The ended session's review link's uses and revocation through B
	// while nobody led are in its stored log (B added them), the link
	// stays revoked, and the running session's review link is served by
	// B, leading.
	var reviewed []string
	for _, ev := range rb.events(t, rb.keyA, ended.ID) {
		if ev.Fields["preview"] == endedReview.ID {
			reviewed = append(reviewed, ev.Type)
		}
	}
	if !slices.Contains(reviewed, "review_opened") || !slices.Contains(reviewed, "review_fetched") || !slices.Contains(reviewed, "preview_revoked") {
		t.Errorf("the ended session's log through B, leading: the review link's events %v, want review_opened, review_fetched and preview_revoked", reviewed)
	}
	if st, _, _ := reviewGet(viaB(endedReview.URL)); st != 401 {
		t.Errorf("the ended session's review link revoked while nobody led, opened through B, leading: %d, want 401", st)
	}
	issued := func(id, preview string) bool {
		for _, ev := range rb.events(t, rb.keyA, id) {
			if ev.Type == "preview_issued" && ev.Fields["preview"] == preview && ev.Fields["scope"] == "review" {
				return true
			}
		}
		return false
	}
	if !issued(ended.ID, gapEndedReview.ID) {
		t.Errorf("the ended session's log through B, leading, lacks the issue of the review link B issued while nobody led")
	}
	waitFor(t, 30*time.Second, "preview_issued of the running session's review link B issued while nobody led, in the trail of B, leading", func() bool {
		return issued(s.ID, gapReview.ID)
	})
	if st, page, _ := reviewGet(viaB(gapReview.URL)); st != 200 || !bytes.Contains(page, []byte(shot.ID)) {
		t.Errorf("the running session's review link B issued while nobody led, through B, leading: %d %.300s", st, page)
	}
	// The running session's review link's use while nobody led, kept
	// by B, is in the trail of B, leading, with the leader's fields
	// (checked before B, leading, serves the link itself).
	waitFor(t, 30*time.Second, "review_opened and review_fetched of the running session's review link used while nobody led, in the trail of B, leading", func() bool {
		var opened, fetched bool
		for _, ev := range rb.events(t, rb.keyA, s.ID) {
			if ev.Fields["preview"] != reviewP.ID || len(fmt.Sprint(ev.Fields["viewer"])) != 16 {
				continue
			}
			opened = opened || ev.Type == "review_opened"
			fetched = fetched || ev.Type == "review_fetched" && ev.Fields["artifact"] == shot.ID && ev.Fields["kind"] == "screenshot"
		}
		return opened && fetched
	})
	if st, page, _ := reviewGet(viaB(reviewP.URL)); st != 200 || !bytes.Contains(page, []byte(shot.ID)) {
		t.Errorf("the running session's review page through B, leading: %d %.300s", st, page)
	}
	// Closed, they reach the trail of the leader B is now.
	throughB1.Close()
	vconn.Close()
	waitFor(t, 30*time.Second, "preview_closed of the connections B carried", func() bool {
		return connected(rb, "preview_closed", p1.ID) && connected(rb, "preview_closed", vnc.ID)
	})
	// A record another replica changed while it could not reach the
	// leader, B (alive, and leading): written here as a replica writes
	// it (a write of the Pod's record conditional on its version). B
	// takes an extension in, and stops a session whose record a delete
	// marked stopping, as a delete through B would.
	later := extended.ExpiresAt.Add(time.Minute).UTC()
	writeRecord(t, kb, s.ID, map[string]string{session.RecordExpires: later.Format(time.RFC3339Nano)})
	waitFor(t, 30*time.Second, "B, leading, to take in an expiry another replica wrote", func() bool {
		st, body := rb.api(t, rb.keyA, "GET", "/v1/sessions/"+s.ID, nil)
		return st == 200 && jsonField(body, "expires_at") == later.Format(time.RFC3339Nano)
	})
	askedAt := time.Now()
	writeRecord(t, kb, s.ID, map[string]string{session.RecordState: "stopping", session.RecordStopAsked: askedAt.UTC().Format(time.RFC3339Nano)})
	waitFor(t, 2*time.Minute, "B, leading, to stop a session another replica's delete marked stopping, its Pod gone", func() bool {
		_, pod := kubePods(t, kb)[s.ID]
		return !pod && stopAsked(t, rb, rb.keyA, s.ID, askedAt, "deleted through another gateway replica")
	})
	t.Logf("B, leading, stopped a session another replica's delete marked stopping, its Pod gone, %.1f s after the write", time.Since(askedAt).Seconds())
	// Its profile is no longer held once its end is settled.
	waitFor(t, time.Minute, "the ended session's profile deleted through B leading", func() bool {
		st, body := rb.api(t, rb.keyA, "DELETE", "/v1/profiles/"+heldProf, nil)
		if st != 204 && st != 409 {
			t.Fatalf("the ended session's profile, deleted through B leading: %d %s", st, body)
		}
		return st == 204
	})
}

// stopAsked says whether session id's trail through r (with key) has
// a stop_requested for reason, made at asked (within a second), and
// after it the session's end (stopped); more than one is an error.
func stopAsked(t testing.TB, r *testEnv, key, id string, asked time.Time, reason string) bool {
	t.Helper()
	requested, stopped := 0, false
	for _, ev := range r.events(t, key, id) {
		switch ev.Type {
		case "stop_requested":
			at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(ev.Fields["happened_at"]))
			if ev.Fields["reason"] != reason || err != nil || at.Sub(asked).Abs() > time.Second {
				t.Fatalf("session %s's stop_requested: %v, want reason %q, made at %v", id, ev.Fields, reason, asked)
			}
			requested++
		case "stopped":
			stopped = requested > 0
		}
	}
	if requested > 1 {
		t.Fatalf("session %s's trail has %d stop_requested, want one", id, requested)
	}
	return stopped
}

// writeRecord changes session id's record in its Pod as a gateway
// replica does (kube.Sessions.UpdateRecord): a write conditional on the
// Pod's version.
func writeRecord(t testing.TB, kb *kube.Backend, id string, change map[string]string) {
	t.Helper()
	pods := kb.Client().CoreV1().Pods(kb.Namespace())
	for range 10 {
		o, err := pods.Get(context.Background(), "sandgate-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("read session %s's Pod: %v", id, err)
		}
		rec := map[string]string{}
		if err := json.Unmarshal([]byte(o.Annotations[kube.AnnInfo]), &rec); err != nil {
			t.Fatalf("session %s's record: %v", id, err)
		}
		for k, v := range change {
			rec[k] = v
		}
		raw, _ := json.Marshal(rec)
		o.Annotations[kube.AnnInfo] = string(raw)
		if _, err = pods.Update(context.Background(), o, metav1.UpdateOptions{}); err == nil {
			return
		} else if !apierrors.IsConflict(err) {
			t.Fatalf("write session %s's record: %v", id, err)
		}
	}
	t.Fatalf("write session %s's record: a conflict each time", id)
}

// keepDeadLease renews the namespace's hold in the name of the replica
// holding it now (one just killed), from after past killed on, every
// second, until the returned stop is called (at the test's end at the
// latest), which says how many renewals were made. The steps a test
// makes while nobody leads take about 3 s here, and the lease lets B
// lead 10 to 15 s after the kill: on a machine several times slower
// those steps would outlast it, and this keeps the gap open for them;
// on one like this they end before after and nothing is renewed.
func keepDeadLease(t testing.TB, ctx context.Context, kb *kube.Backend, killed time.Time, after time.Duration) (stop func() int) {
	t.Helper()
	leases := kb.Client().CoordinationV1().Leases(kb.Namespace())
	le, err := leases.Get(ctx, kube.HoldLease, metav1.GetOptions{})
	if err != nil || le.Spec.HolderIdentity == nil {
		t.Fatalf("the hold lease: %+v %v", le, err)
	}
	dead := *le.Spec.HolderIdentity
	done, finished := make(chan struct{}), make(chan struct{})
	var renewed int
	go func() {
		defer close(finished)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if time.Since(killed) < after {
				continue
			}
			le, err := leases.Get(ctx, kube.HoldLease, metav1.GetOptions{})
			if err != nil || le.Spec.HolderIdentity == nil || *le.Spec.HolderIdentity != dead {
				continue // B took it already: the guards say so
			}
			now := metav1.NewMicroTime(time.Now())
			le.Spec.RenewTime = &now
			if _, err := leases.Update(ctx, le, metav1.UpdateOptions{}); err == nil {
				renewed++
			}
		}
	}()
	var once sync.Once
	stop = func() int {
		once.Do(func() { close(done); <-finished })
		return renewed
	}
	t.Cleanup(func() { stop() })
	return stop
}

// without is raw (a JSON object) with field dropped from each object
// in its list named list.
func without(t testing.TB, raw []byte, list, field string) []byte {
	t.Helper()
	var v map[string][]map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	for _, o := range v[list] {
		delete(o, field)
	}
	out, _ := json.Marshal(v)
	return out
}

// leaderAnswers asks r something only a leader answers: a create that
// does not wait for its session (wait=false), with a TTL that cannot
// be, which a leader refuses (400) before it does anything else, where
// a replica taking over answers 503 until it has adopted the sessions,
// and one that stands by answers 503 while no leader answers (it
// answers every read itself then, and creates, but not one that does
// not wait). led says a leader answered.
func leaderAnswers(t testing.TB, r *testEnv, key string) (led bool, st int, body []byte) {
	t.Helper()
	st, body = r.api(t, key, "POST", "/v1/sessions?wait=false", map[string]any{"ttl_seconds": -1})
	return st == 400 && jsonErrorCode(string(body)) == "invalid_argument", st, body
}

// callVia sends a request with a JSON body (none when body is nil)
// through the gateway at gwURL.
func callVia(t testing.TB, client *http.Client, gwURL, key, method, path string, body any) (int, []byte) {
	t.Helper()
	if body == nil {
		return sendVia(t, client, gwURL, key, method, path, nil, "")
	}
	raw, _ := json.Marshal(body)
	return sendVia(t, client, gwURL, key, method, path, raw, "application/json")
}

// sameJSON: a and b are the same JSON value.
func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// listed is session id in a session list's body (nil: not there).
func listed(t testing.TB, body []byte, id string) []byte {
	t.Helper()
	var list struct{ Sessions []json.RawMessage }
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatalf("a session list: %v: %s", err, body)
	}
	for _, s := range list.Sessions {
		if jsonField(s, "id") == id {
			return s
		}
	}
	return nil
}

// fileVia puts body at path p in session id, or gets it (body nil),
// through the gateway at gwURL.
func fileVia(t testing.TB, client *http.Client, gwURL, key, method, id, p string, body []byte) (int, []byte) {
	t.Helper()
	return sendVia(t, client, gwURL, key, method, "/v1/sessions/"+id+"/files?path="+url.QueryEscape(p), body, "")
}

// sendVia sends a request (no body when body is nil) through the
// gateway at gwURL, and reads the whole answer.
func sendVia(t testing.TB, client *http.Client, gwURL, key, method, path string, body []byte, contentType string) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, _ := http.NewRequest(method, gwURL+path, r)
	req.Header.Set("Authorization", "Bearer "+key)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: the answer: %v", method, path, err)
	}
	return resp.StatusCode, got
}

// leaderAndStandby starts two replicas on the trial cluster: A, which
// leads, and B, which stands by.
func leaderAndStandby(t testing.TB, ctx context.Context) (kb *kube.Backend, ra, rb *testEnv) {
	t.Helper()
	kb, ra, rb, pods, roles, start := kubeReplicaPair(t, ctx)
	startLeading(t, ra, "A", start, roles, pods[ra])
	start(rb, "B")
	roles.waitLeader(t, "B stands by", pods[ra])
	return kb, ra, rb
}

// logLines counts the lines of r's gateway log that hold every one of
// parts.
func logLines(r *testEnv, parts ...string) int {
	raw, _ := os.ReadFile(r.gwLog)
	n := 0
	for _, line := range strings.Split(string(raw), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// cdpDial opens a CDP WebSocket.
func cdpDial(t testing.TB, ws string) *websocket.Conn {
	t.Helper()
	c, resp, err := websocket.DefaultDialer.Dial(ws, nil)
	if err != nil {
		status, body := 0, ""
		if resp != nil {
			status = resp.StatusCode
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			body = string(b)
		}
		t.Fatalf("dial the CDP WebSocket: %v (%d %s)", err, status, body)
	}
	return c
}

// cdpTry sends Browser.getVersion with id and waits (10 s) for its
// answer.
func cdpTry(c *websocket.Conn, id int) error {
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := c.WriteMessage(websocket.TextMessage, []byte(fmt.Sprintf(`{"id":%d,"method":"Browser.getVersion"}`, id))); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, msg, err := c.ReadMessage()
		if err != nil {
			return err
		}
		var m struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
		}
		if json.Unmarshal(msg, &m) == nil && m.ID == id {
			if len(m.Result) == 0 {
				return fmt.Errorf("no result: %s", msg)
			}
			return nil
		}
	}
}

// shellDial opens session id's shell through the gateway at addr; on a
// refusal, it returns the handshake's status.
func shellDial(addr, key, id string) (*websocket.Conn, int, error) {
	h := http.Header{}
	if key != "" {
		h.Set("Authorization", "Bearer "+key)
	}
	d := websocket.Dialer{HandshakeTimeout: 30 * time.Second}
	c, resp, err := d.Dial("ws://"+addr+"/v1/sessions/"+id+"/shell?cols=80&rows=24", h)
	if err != nil {
		if resp != nil {
			return nil, resp.StatusCode, err
		}
		return nil, 0, err
	}
	return c, 101, nil
}

// shellRun types line into a shell and waits (20 s) for want in its
// output.
func shellRun(c *websocket.Conn, line, want string) error {
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := c.WriteMessage(websocket.BinaryMessage, []byte(line+"\n")); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	var out strings.Builder
	for !strings.Contains(out.String(), want) {
		mt, data, err := c.ReadMessage()
		if err != nil {
			return fmt.Errorf("%w (output: %q)", err, out.String())
		}
		if mt == websocket.BinaryMessage {
			out.Write(data)
		}
	}
	return nil
}

// shellExit types line (which ends the shell) and returns the exit code
// the gateway sends.
func shellExit(c *websocket.Conn, line string) (int, error) {
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := c.WriteMessage(websocket.BinaryMessage, []byte(line+"\n")); err != nil {
		return -1, err
	}
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		mt, data, err := c.ReadMessage()
		if err != nil {
			return -1, err
		}
		var ctl struct {
			Type     string `json:"type"`
			ExitCode int    `json:"exit_code"`
		}
		if mt == websocket.TextMessage && json.Unmarshal(data, &ctl) == nil && ctl.Type == "exit" {
			return ctl.ExitCode, nil
		}
	}
}

// BenchmarkKubeRelay: the round trip of a CDP command, of a shell's
// echo, of a command (exec true), of a 1 MiB upload, of an action
// (mouse_move) and of a screenshot (stored) on one session, through the
// leader and through a replica that stands by and carries them itself
// (the relay), alternately in the same run.
func BenchmarkKubeRelay(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ra, rb, id := benchRelaySession(b, ctx)
	defer ra.api(b, ra.keyA, "DELETE", "/v1/sessions/"+id, nil)
	p := ra.preview(b, ra.keyA, id, 600)
	cdpA := cdpDial(b, browserWS(b, p.URL))
	defer cdpA.Close()
	cdpB := cdpDial(b, browserWS(b, strings.Replace(p.URL, ra.gwAddr, rb.gwAddr, 1)))
	defer cdpB.Close()
	shA, _, errA := shellDial(ra.gwAddr, ra.keyA, id)
	shB, _, errB := shellDial(rb.gwAddr, rb.keyA, id)
	if errA != nil || errB != nil {
		b.Fatal(errA, errB)
	}
	defer shA.Close()
	defer shB.Close()
	// A first round, and B carries its own (else this measures
	// forwarding).
	for i, c := range []*websocket.Conn{cdpA, cdpB} {
		if err := cdpTry(c, i+1); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []*websocket.Conn{shA, shB} {
		if err := shellRun(c, "echo warm-$((6*7))", "warm-42"); err != nil {
			b.Fatal(err)
		}
	}
	raw, _ := os.ReadFile(rb.gwLog)
	if !strings.Contains(string(raw), "shell opened") || !strings.Contains(string(raw), "cdp connection opened") {
		b.Fatal("B's log lacks the shell or the CDP connection: B did not carry them")
	}
	// Commands each on a new connection, through both (a standby sends
	// a whole connection where its first request goes).
	fresh := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	run := func(r *testEnv) func() error {
		return func() error {
			if out := execWith(b, fresh, r.gwURL, r.keyA, id, map[string]any{"cmd": []string{"true"}}); out.ExitCode != 0 {
				return fmt.Errorf("exit %d", out.ExitCode)
			}
			return nil
		}
	}
	upload := make([]byte, 1<<20)
	call := func(r *testEnv, method, path string, body []byte, ctype string, want int) func() error {
		return func() error {
			if st, got := sendVia(b, fresh, r.gwURL, r.keyA, method, "/v1/sessions/"+id+path, body, ctype); st != want {
				return fmt.Errorf("%s %s: %d %s", method, path, st, got)
			}
			return nil
		}
	}
	// A session read, by a client that keeps its connections: through
	// A on one connection; through B forwarded, the leader closing each
	// (so that the client's next request is routed again): what that
	// costs.
	kept := &http.Client{Timeout: time.Minute, Transport: &http.Transport{}}
	defer kept.CloseIdleConnections()
	read := func(r *testEnv) func() error {
		return func() error {
			if st, got := sendVia(b, kept, r.gwURL, r.keyA, "GET", "/v1/sessions/"+id, nil, ""); st != 200 {
				return fmt.Errorf("read: %d %s", st, got)
			}
			return nil
		}
	}
	move := []byte(`{"action":"mouse_move","coordinate":[5,5]}`)
	for _, r := range []*testEnv{ra, rb} { // warm
		if err := call(r, "POST", "/screenshot", nil, "", 201)(); err != nil {
			b.Fatal(err)
		}
	}
	if logLines(rb, "screenshot stored", id) != 1 {
		b.Fatal("B's log lacks the screenshot: B did not take it")
	}
	var rdLead, rdStandby, cdpLead, cdpStandby, shLead, shStandby, exLead, exStandby, upLead, upStandby, actLead, actStandby, shotLead, shotStandby []time.Duration
	timed := func(to *[]time.Duration, f func() error) {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		*to = append(*to, time.Since(t0))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		timed(&cdpLead, func() error { return cdpTry(cdpA, 10+i) })
		timed(&cdpStandby, func() error { return cdpTry(cdpB, 10+i) })
		line, want := fmt.Sprintf("echo m-$((%d*2))", i), fmt.Sprintf("m-%d", 2*i)
		timed(&shLead, func() error { return shellRun(shA, line, want) })
		timed(&shStandby, func() error { return shellRun(shB, line, want) })
		timed(&exLead, run(ra))
		timed(&exStandby, run(rb))
		timed(&upLead, call(ra, "PUT", "/files?path=/tmp/bench.bin", upload, "", 201))
		timed(&upStandby, call(rb, "PUT", "/files?path=/tmp/bench.bin", upload, "", 201))
		timed(&actLead, call(ra, "POST", "/actions", move, "application/json", 200))
		timed(&actStandby, call(rb, "POST", "/actions", move, "application/json", 200))
		timed(&shotLead, call(ra, "POST", "/screenshot", nil, "", 201))
		timed(&shotStandby, call(rb, "POST", "/screenshot", nil, "", 201))
		timed(&rdLead, read(ra))
		timed(&rdStandby, read(rb))
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for _, m := range []struct {
		name          string
		lead, standby []time.Duration
	}{{"cdp", cdpLead, cdpStandby}, {"shell", shLead, shStandby}, {"exec", exLead, exStandby},
		{"upload", upLead, upStandby}, {"action", actLead, actStandby}, {"screenshot", shotLead, shotStandby},
		{"read-kept", rdLead, rdStandby}} {
		b.ReportMetric(ms(percentile(m.lead, 0.5)), m.name+"-leader-p50-ms")
		b.ReportMetric(ms(percentile(m.standby, 0.5)), m.name+"-standby-p50-ms")
		b.ReportMetric(float64(percentile(m.standby, 0.5))/float64(percentile(m.lead, 0.5)), m.name+"-standby/leader-p50")
	}
}

// benchRelaySession starts a replica that leads (A) and one that stands
// by (B), and creates a runc session through A.
func benchRelaySession(b *testing.B, ctx context.Context) (ra, rb *testEnv, id string) {
	b.Helper()
	_, ra, rb = leaderAndStandby(b, ctx)
	st, body := ra.api(b, ra.keyA, "POST", "/v1/sessions", map[string]any{"runtime": "runc"})
	if st != 201 {
		b.Fatalf("create: %d %s", st, body)
	}
	return ra, rb, jsonField(body, "id")
}

// BenchmarkKubeRelayAlone: a command (exec true, each on a new
// connection) through the standby B, admitted by the leader A, then,
// once A is SIGKILLed and until B leads, admitted by B alone (its copies
// and the session's Pod): what a command costs while no leader answers,
// against what it costs with one. Only the commands answered before B
// took over count as alone. Each command is followed by a read of the
// session through B, forwarded to A, then answered by B alone from the
// session's Pod, a read of its trail, forwarded, then answered by B
// alone from the trail A's journal stored, and its review page, passed
// on to A, then served by B alone from MinIO.
func BenchmarkKubeRelayAlone(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ra, rb, id := benchRelaySession(b, ctx)
	fresh := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	run := func() time.Duration {
		t0 := time.Now()
		if out := execWith(b, fresh, rb.gwURL, rb.keyA, id, map[string]any{"cmd": []string{"true"}}); out.ExitCode != 0 {
			b.Fatalf("exit %d", out.ExitCode)
		}
		return time.Since(t0)
	}
	// A session read through B: forwarded to the leader, or answered
	// by B alone from the session's Pod.
	read := func() time.Duration {
		t0 := time.Now()
		if st, body := callVia(b, fresh, rb.gwURL, rb.keyA, "GET", "/v1/sessions/"+id, nil); st != 200 {
			b.Fatalf("read: %d %s", st, body)
		}
		return time.Since(t0)
	}
	// The session's trail through B: forwarded to the leader (its
	// memory), or read by B alone from the pieces the leader's journal
	// stored in MinIO.
	trail := func() time.Duration {
		t0 := time.Now()
		if st, body := callVia(b, fresh, rb.gwURL, rb.keyA, "GET", "/v1/sessions/"+id+"/events", nil); st != 200 || !strings.Contains(string(body), `"type":"created"`) {
			b.Fatalf("trail: %d %.300s", st, body)
		}
		return time.Since(t0)
	}
	// A running session's review page through B: passed on to the
	// leader, or served by B alone from MinIO (its use, the first time
	// a link is opened, kept for the next leader; recorded once).
	rev := rb.vncPreview(b, rb.keyA, id, "review", false, 600)
	reviewURL := strings.Replace(rev.URL, ra.gwAddr, rb.gwAddr, 1)
	review := func() time.Duration {
		t0 := time.Now()
		resp, err := fresh.Get(reviewURL)
		if err != nil {
			b.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(page, []byte(id)) {
			b.Fatalf("review page: %d %.300s", resp.StatusCode, page)
		}
		return time.Since(t0)
	}
	run() // warm
	read()
	trail()
	review()
	var asked, alone, readAsked, readAlone, trailAsked, trailAlone, reviewAsked, reviewAlone []time.Duration
	b.ResetTimer()
	for range b.N {
		asked = append(asked, run())
		readAsked = append(readAsked, read())
		trailAsked = append(trailAsked, trail())
		reviewAsked = append(reviewAsked, review())
	}
	b.StopTimer()
	ra.stopGateway(syscall.SIGKILL)
	killed := time.Now()
	b.StartTimer()
	// (B's lease read says A leads for up to 15 s after its last
	// renewal; B cannot lead before.)
	for range b.N {
		if time.Since(killed) > 10*time.Second || logLines(rb, "a leader answers again") > 0 {
			break
		}
		alone = append(alone, run())
		readAlone = append(readAlone, read())
		trailAlone = append(trailAlone, trail())
		reviewAlone = append(reviewAlone, review())
	}
	b.StopTimer()
	if logLines(rb, "no leader answers: this replica admits") != 1 || len(alone) == 0 {
		b.Fatalf("B did not admit alone (%d commands)", len(alone))
	}
	if st, body := callVia(b, fresh, rb.gwURL, "", "GET", "/healthz", nil); jsonField(body, "status") != "standby" {
		b.Fatalf("B leads already (%d %s): the reads were not all alone", st, body)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(percentile(asked, 0.5)), "exec-asked-p50-ms")
	b.ReportMetric(ms(percentile(alone, 0.5)), "exec-alone-p50-ms")
	b.ReportMetric(float64(percentile(alone, 0.5))/float64(percentile(asked, 0.5)), "exec-alone/asked-p50")
	b.ReportMetric(ms(percentile(readAsked, 0.5)), "read-forwarded-p50-ms")
	b.ReportMetric(ms(percentile(readAlone, 0.5)), "read-alone-p50-ms")
	b.ReportMetric(float64(percentile(readAlone, 0.5))/float64(percentile(readAsked, 0.5)), "read-alone/forwarded-p50")
	b.ReportMetric(ms(percentile(trailAsked, 0.5)), "trail-forwarded-p50-ms")
	b.ReportMetric(ms(percentile(trailAlone, 0.5)), "trail-alone-p50-ms")
	b.ReportMetric(float64(percentile(trailAlone, 0.5))/float64(percentile(trailAsked, 0.5)), "trail-alone/forwarded-p50")
	b.ReportMetric(ms(percentile(reviewAsked, 0.5)), "review-forwarded-p50-ms")
	b.ReportMetric(ms(percentile(reviewAlone, 0.5)), "review-alone-p50-ms")
	b.ReportMetric(float64(percentile(reviewAlone, 0.5))/float64(percentile(reviewAsked, 0.5)), "review-alone/forwarded-p50")
	b.ReportMetric(float64(len(alone)), "alone-n")
	waitFor(b, 3*time.Minute, "B to lead", func() bool {
		led, _, _ := leaderAnswers(b, rb, rb.keyA)
		return led
	})
	rb.api(b, rb.keyA, "DELETE", "/v1/sessions/"+id, nil)
}

// snapshotVia takes a snapshot of tenant-a's session id through r
// (when says when, for the failures).
func snapshotVia(t testing.TB, client *http.Client, r *testEnv, id, when string) snapshotInfo {
	t.Helper()
	return snapshotWith(t, client, r, r.keyA, id, when)
}

// snapshotWith is snapshotVia with the API key key.
func snapshotWith(t testing.TB, client *http.Client, r *testEnv, key, id, when string) snapshotInfo {
	t.Helper()
	st, body := callVia(t, client, r.gwURL, key, "POST", "/v1/sessions/"+id+"/snapshots", nil)
	var snap snapshotInfo
	if err := json.Unmarshal(body, &snap); st != 201 || err != nil || snap.Session != id || snap.Size == 0 || len(snap.SHA256) != 64 {
		t.Fatalf("a snapshot through %s %s: %d %s", r.gwAddr, when, st, body)
	}
	return snap
}

// snapshotEvent: the trail of session id through r has snap's
// snapshot_saved, with its size and digest.
func snapshotEvent(t testing.TB, r *testEnv, id string, snap snapshotInfo) bool {
	t.Helper()
	for _, ev := range r.events(t, r.keyA, id) {
		if ev.Type == "snapshot_saved" && ev.Fields["snapshot"] == snap.ID && ev.Fields["sha256"] == snap.SHA256 &&
			ev.Fields["size"] == float64(snap.Size) {
			return true
		}
	}
	return false
}

// snapshotFiles is what snap's tar, read through r, holds: each
// regular file's content by its path under the home; the tar must be
// what the snapshot says (its size and digest).
func snapshotFiles(t *testing.T, r *testEnv, snap snapshotInfo) map[string]string {
	t.Helper()
	raw := r.fetchArtifact(t, r.keyA, snap.ID)
	if sum := sha256.Sum256(raw); int64(len(raw)) != snap.Size || hex.EncodeToString(sum[:]) != snap.SHA256 {
		t.Fatalf("snapshot %s through %s: %d bytes, not the %d its answer said", snap.ID, r.gwAddr, len(raw), snap.Size)
	}
	out := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("snapshot %s: %v", snap.ID, err)
		}
		if h.Typeflag == tar.TypeReg && h.Size < 1<<20 {
			b, _ := io.ReadAll(tr)
			out[strings.TrimPrefix(h.Name, "./")] = string(b)
		}
	}
}

// hasCredential: id is among list.
func hasCredential(list []sandgate.Credential, id string) bool {
	return slices.ContainsFunc(list, func(c sandgate.Credential) bool { return c.ID == id })
}
