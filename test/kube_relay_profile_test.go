package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestKubeRelayProfile: a browser profile, kept once by a session that
// wrote it back through the leader (A), is taken while nobody leads by
// a session that writes it back, created through the replica standing
// by (B) alone: the profile as kept is in it, its browser answers over
// CDP on it, and its trail says the restore, stored with its first
// events. While it holds the profile, another create from it through B
// alone is refused (409; a reader too; 503 to retry for one that would
// wait for it; over MCP as well), and another tenant's key finds no
// such profile (404); none of these makes a Pod. Deleted through B
// while nobody leads, it reads stopping; once B leads it adopts the
// session and finishes its stop, which writes the profile back: a
// session made from it after that holds what the session made alone
// wrote.
func TestKubeRelayProfile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	kb, ra, rb := leaderAndStandby(t, ctx)
	fresh := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	const marker = ".sandgate-profile/sandgate-marker"
	write := func(id, text string) {
		t.Helper()
		if out := execWith(t, fresh, rb.gwURL, rb.keyA, id, map[string]any{"cmd": []string{"sh", "-c", "printf %s \"$1\" > ~/" + marker, "sh", text}}); out.ExitCode != 0 {
			t.Fatalf("write the marker in %s: %d %s", id, out.ExitCode, out.Stderr)
		}
	}
	read := func(id string) string {
		t.Helper()
		out := execWith(t, fresh, rb.gwURL, rb.keyA, id, map[string]any{"cmd": []string{"sh", "-c", "cat ~/" + marker}})
		return string(out.Stdout)
	}

	// Kept once through the leader (B passes it to A).
	p := rb.newProfile(t, rb.keyA, "kept through the leader, taken while nobody leads")
	s1 := rb.createSession(t, rb.keyA, map[string]any{"runtime": "runc", "profile": map[string]any{"id": p.ID, "persist": true}})
	write(s1.ID, "kept through the leader")
	if _, ok := eventOf(rb.stopSession(t, rb.keyA, s1.ID), "profile_saved"); !ok {
		t.Fatalf("the profile was not saved as the leader's session ended")
	}
	if got := rb.getProfile(t, rb.keyA, p.ID); got.Current != 1 {
		t.Fatalf("the profile after the leader's session: %+v, want version 1", got)
	}

	killed := time.Now()
	ra.stopGateway(syscall.SIGKILL)
	keepGap := keepDeadLease(t, ctx, kb, killed, 7*time.Second)

	// A create through B alone from the profile, writing it back.
	at := time.Now()
	st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "POST", "/v1/sessions", map[string]any{"runtime": "runc",
		"profile": map[string]any{"id": p.ID, "persist": true}, "preview": map[string]any{"scope": "cdp", "ttl_seconds": 600}})
	var made struct {
		sessionInfo
		Preview previewInfo `json:"preview"`
	}
	if err := json.Unmarshal(body, &made); st != 201 || err != nil || made.State != "running" {
		t.Fatalf("a create from the profile through B while nobody leads: %d %s", st, body)
	}
	t.Cleanup(func() { rb.api(t, rb.keyA, "DELETE", "/v1/sessions/"+made.ID, nil) })
	aloneCreate := time.Since(at)
	t.Logf("a create from a kept profile through B (a cold start, runc) answered in %.2f s, %.1f s after A's death, nobody leading", aloneCreate.Seconds(), time.Since(killed).Seconds())
	if got := read(made.ID); got != "kept through the leader" {
		t.Errorf("the profile in the session created from it through B while nobody leads: %q, want what the leader's session kept", got)
	}
	ws := browserWS(t, strings.Replace(made.Preview.URL, ra.gwAddr, rb.gwAddr, 1))
	cdp := cdpDial(t, ws)
	if err := cdpTry(cdp, 1); err != nil {
		t.Errorf("CDP through B to the browser started on the profile while nobody leads: %v", err)
	}
	cdp.Close()
	write(made.ID, "written while nobody led")

	// It holds the profile: another create from it through B alone is
	// refused, making no Pod.
	podsBefore := kubePods(t, kb)
	for _, c := range []struct {
		why   string
		key   string
		req   map[string]any
		want  int
		retry bool
	}{
		{"a second writer", rb.keyA, map[string]any{"runtime": "runc", "profile": map[string]any{"id": p.ID, "persist": true}}, 409, false},
		{"a reader", rb.keyA, map[string]any{"runtime": "runc", "profile": map[string]any{"id": p.ID}}, 409, false},
		{"a reader that would wait for it", rb.keyA, map[string]any{"runtime": "runc", "profile": map[string]any{"id": p.ID}, "wait_seconds": 30}, 503, true},
		{"another tenant's key", rb.keyB, map[string]any{"runtime": "runc", "profile": map[string]any{"id": p.ID}}, 404, false},
	} {
		st, body, retry := sendRetryAfter(t, fresh, rb.gwURL, c.key, c.req)
		if st != c.want || (retry != "") != c.retry {
			t.Errorf("a create from the profile through B while nobody leads and a session holds it, %s: %d %s (Retry-After %q), want %d", c.why, st, body, retry, c.want)
		}
	}
	cs := mcpConnect(t, rb.mcpHTTP(rb.keyA))
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "session_create", Arguments: map[string]any{"runtime": "runc", "profile": p.ID, "keep_profile": true}})
	if err != nil || !res.IsError || !strings.HasPrefix(contentText(res), "conflict: ") {
		t.Errorf("session_create over MCP through B from the held profile while nobody leads: %v %+v, want a conflict", err, res)
	}
	for id, tn := range kubePods(t, kb) {
		if _, ok := podsBefore[id]; !ok {
			t.Errorf("a session Pod (%s, %s) after the creates from the held profile that were refused", id, tn)
		}
	}
	// Deleted through B while nobody leads: stopping, its profile saved
	// by the leader that adopts it (its stop resumed).
	if st, body := callVia(t, fresh, rb.gwURL, rb.keyA, "DELETE", "/v1/sessions/"+made.ID, nil); st != 200 || jsonField(body, "state") != "stopping" {
		t.Errorf("the delete of the session made alone, through B while nobody leads: %d %s, want it stopping", st, body)
	}
	if n := keepGap(); n > 0 {
		t.Logf("the steps while nobody leads ended %.1f s after the kill; the test renewed A's lease %d times meanwhile", time.Since(killed).Seconds(), n)
	}

	waitFor(t, 3*time.Minute, "B to lead", func() bool {
		led, _, _ := leaderAnswers(t, rb, rb.keyA)
		return led
	})
	// Adopted and stopped: its trail holds its create, made alone, the
	// restore, the delete asked while nobody led and the save.
	var restored map[string]any
	waitFor(t, 2*time.Minute, "the session made alone adopted by B, stopped and its profile saved", func() bool {
		var types []string
		alone, adopted, asked, saved := false, false, false, false
		for _, ev := range rb.events(t, rb.keyA, made.ID) {
			types = append(types, ev.Type)
			alone = alone || ev.Type == "created" && strings.Contains(fmt.Sprint(ev.Fields["created_by"]), "while none led")
			adopted = adopted || ev.Type == "adopted"
			asked = asked || ev.Type == "stop_requested" && strings.Contains(fmt.Sprint(ev.Fields["reason"]), "while none led")
			saved = saved || ev.Type == "profile_saved"
			if ev.Type == "profile_restored" {
				restored = ev.Fields
			}
		}
		if !alone || !adopted || !asked || !saved {
			t.Logf("the trail so far: %v", types)
		}
		return alone && adopted && asked && saved
	})
	if restored == nil || restored["profile"] != p.ID || fmt.Sprint(restored["version"]) != "1" || restored["persist"] != true {
		t.Errorf("the profile_restored event of the session made alone: %v, want version 1 of %s, written back", restored, p.ID)
	}
	// (Saved before the session's Pod is removed, held until then.)
	waitFor(t, time.Minute, "the session made alone to end, its profile no longer in use", func() bool { return !rb.getProfile(t, rb.keyA, p.ID).InUse })
	if got := rb.getProfile(t, rb.keyA, p.ID); got.Current != 2 {
		t.Errorf("the profile after the session made alone ended: %+v, want version 2", got)
	}
	at = time.Now()
	s3 := rb.createSession(t, rb.keyA, map[string]any{"runtime": "runc", "profile": map[string]any{"id": p.ID}})
	leaderCreate := time.Since(at)
	t.Logf("a create from the kept profile through B leading (a cold start, runc) answered in %.2f s: alone/leading %.2f", leaderCreate.Seconds(), aloneCreate.Seconds()/leaderCreate.Seconds())
	if got := read(s3.ID); got != "written while nobody led" {
		t.Errorf("the profile in a session made after the one made alone ended: %q, want what that one wrote", got)
	}
}

// sendRetryAfter posts a create through the gateway at gwURL and says
// its status, body and Retry-After.
func sendRetryAfter(t testing.TB, client *http.Client, gwURL, key string, req map[string]any) (int, []byte, string) {
	t.Helper()
	raw, _ := json.Marshal(req)
	hreq, _ := http.NewRequest("POST", gwURL+"/v1/sessions", bytes.NewReader(raw))
	hreq.Header.Set("Authorization", "Bearer "+key)
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(hreq)
	if err != nil {
		t.Fatalf("a create: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body, resp.Header.Get("Retry-After")
}
