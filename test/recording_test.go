package test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sandgate/sandgate/recordings"
)

// palette is what /colors.html shows, one colour a second.
var palette = [][3]int{
	{230, 30, 30}, {30, 200, 30}, {30, 30, 230}, {240, 220, 20}, {220, 30, 220},
	{20, 220, 220}, {250, 140, 0}, {120, 20, 160}, {0, 110, 110}, {130, 70, 0},
}

func paletteJS() string {
	var parts []string
	for _, c := range palette {
		parts = append(parts, fmt.Sprintf(`"rgb(%d,%d,%d)"`, c[0], c[1], c[2]))
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// downloadBody is what /file.bin serves.
var downloadBody = func() []byte {
	b := make([]byte, 300<<10)
	rand.Read(b)
	return b
}()

type artifact = recordings.Artifact

func (e *testEnv) artifacts(t *testing.T, key, id string) []artifact {
	t.Helper()
	st, body := e.api(t, key, "GET", "/v1/sessions/"+id+"/artifacts", nil)
	if st != 200 {
		t.Fatalf("artifacts: %d %s", st, body)
	}
	var l struct{ Artifacts []artifact }
	json.Unmarshal(body, &l)
	return l.Artifacts
}

// fetchArtifact follows GET /v1/artifacts/{id} to MinIO and returns the bytes.
func (e *testEnv) fetchArtifact(t *testing.T, key, id string) []byte {
	t.Helper()
	st, _, loc := e.redirect(t, key, "/v1/artifacts/"+id)
	if st != 302 {
		t.Fatalf("artifact %s: %d", id, st)
	}
	resp, err := http.Get(loc)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("presigned GET: %d %s", resp.StatusCode, b)
	}
	return b
}

func (e *testEnv) redirect(t *testing.T, key, path string) (int, []byte, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", e.gwURL+path, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header.Get("Location")
}

// getAtOnce GETs u n times at once, redirects not followed, and returns
// each answer's status (0 for a request that got none).
func getAtOnce(u string, n int) []int {
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, err := c.Get(u); err == nil {
				codes[i] = r.StatusCode
				r.Body.Close()
			}
		}()
	}
	wg.Wait()
	return codes
}

func findKind(as []artifact, kind, contentType string) *artifact {
	for i := range as {
		if as[i].Kind == kind && (contentType == "" || as[i].ContentType == contentType) {
			return &as[i]
		}
	}
	return nil
}

// probeDuration is ffprobe's duration of a video file.
func probeDuration(t *testing.T, path string) float64 {
	t.Helper()
	out, err := exec.Command("ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0", path).Output()
	if err != nil {
		t.Fatalf("ffprobe %s: %v", path, err)
	}
	d, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	if err != nil {
		t.Fatalf("ffprobe duration %q: %v", out, err)
	}
	return d
}

// colourRun samples the video's centre fps times a second and returns the
// palette index seen in each sample (-1: not a palette colour).
func colourRun(t *testing.T, path string, fps int) []int {
	t.Helper()
	out, err := exec.Command("ffmpeg", "-v", "error", "-i", path, "-vf", fmt.Sprintf("fps=%d,scale=16:10", fps),
		"-f", "rawvideo", "-pix_fmt", "rgb24", "-").Output()
	if err != nil {
		t.Fatalf("ffmpeg frames: %v", err)
	}
	const fw, fh = 16, 10
	var seq []int
	for off := 0; off+fw*fh*3 <= len(out); off += fw * fh * 3 {
		p := out[off+(5*fw+8)*3:]
		best, bestD := -1, 60*60*3
		for i, c := range palette {
			d := 0
			for k := 0; k < 3; k++ {
				x := int(p[k]) - c[k]
				d += x * x
			}
			if d < bestD {
				best, bestD = i, d
			}
		}
		seq = append(seq, best)
	}
	return seq
}

// steps dedups a colour run, dropping samples that match no colour, and
// returns the steps between successive colours (1: the next second).
func steps(seq []int) (colours []int, steps []int) {
	for _, c := range seq {
		if c < 0 || (len(colours) > 0 && colours[len(colours)-1] == c) {
			continue
		}
		if len(colours) > 0 {
			steps = append(steps, (c-colours[len(colours)-1]+len(palette))%len(palette))
		}
		colours = append(colours, c)
	}
	return colours, steps
}

func saveTemp(t *testing.T, b []byte, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// finalRecording fetches the session's finished recording and checks it
// against its listing and manifest.
func (e *testEnv) finalRecording(t *testing.T, key, id string) (path string, manifest map[string]any) {
	t.Helper()
	as := e.artifacts(t, key, id)
	rec := findKind(as, "recording", "video/mp4")
	man := findKind(as, "recording", "application/json")
	if rec == nil || man == nil {
		t.Fatalf("no finished recording and manifest among %+v", as)
	}
	if seg := findKind(as, "recording_segment", ""); seg != nil {
		t.Errorf("segments are left after the recording was finalised: %+v", seg)
	}
	video := e.fetchArtifact(t, key, rec.ID)
	if sha(video) != rec.SHA256 || int64(len(video)) != rec.Size {
		t.Fatalf("recording bytes do not match the listing")
	}
	json.Unmarshal(e.fetchArtifact(t, key, man.ID), &manifest)
	if manifest["sha256"] != rec.SHA256 || manifest["recording"] != rec.ID {
		t.Fatalf("manifest does not describe the recording: %v", manifest)
	}
	return saveTemp(t, video, "recording.mp4"), manifest
}

// recordColours creates a recorded session showing /colors.html and
// returns it with the time it was created.
func (e *testEnv) recordColours(t *testing.T) (sessionInfo, time.Time) {
	t.Helper()
	s := e.createSession(t, e.keyA, map[string]any{"record": true})
	created := time.Now()
	ctx, done := e.cdpPage(t, s.ID)
	defer done()
	if err := chromedp.Do(ctx, chromedp.Navigate(testPages(t)+"/colors.html")); err != nil {
		t.Fatal(err)
	}
	return s, created
}

// TestRecording: a session that shows one colour a second for ten seconds
// is recorded from outside; the recording lasts as long as the session
// was watched and shows the colours in order; the review page plays it.
func TestRecording(t *testing.T) {
	e := needE2E(t)
	s, created := e.recordColours(t)
	time.Sleep(10 * time.Second)
	e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil)
	wall := time.Since(created).Seconds()

	path, manifest := e.finalRecording(t, e.keyA, s.ID)
	d := probeDuration(t, path)
	t.Logf("recording: %.2f s (session watched for %.2f s), %v segments", d, wall, len(manifest["segments"].([]any)))
	if d < wall-2 || d > wall+2 {
		t.Errorf("recording lasts %.2f s; the session was recorded for %.2f s", d, wall)
	}
	colours, st := steps(colourRun(t, path, 4))
	t.Logf("colours in order of appearance: %v", colours)
	if len(colours) < 9 {
		t.Fatalf("the recording shows %d of the page's 10 colours: %v", len(colours), colours)
	}
	for i, s := range st {
		if s != 1 {
			t.Fatalf("colour %d follows %d: not the page's order (%v)", colours[i+1], colours[i], colours)
		}
	}

	t.Run("review-page", func(t *testing.T) {
		st, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/previews", map[string]any{"scope": "review", "ttl_seconds": 300})
		if st != 201 {
			t.Fatalf("review preview of an ended session: %d %s", st, body)
		}
		url := jsonField(body, "url")
		e.mu.Lock()
		e.tokens = append(e.tokens, url[strings.LastIndex(url, "/")+1:])
		e.mu.Unlock()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("review page: %d %s", resp.StatusCode, page)
		}
		as := e.artifacts(t, e.keyA, s.ID)
		rec := findKind(as, "recording", "video/mp4")
		base := strings.TrimPrefix(url, e.gwURL)
		if !bytes.Contains(page, []byte(`<video id="recording" controls preload="metadata" src="`+base+`/artifacts/`+rec.ID+`"`)) {
			t.Fatalf("the review page does not play the recording:\n%s", page)
		}
		for _, a := range as {
			if !bytes.Contains(page, []byte(base+"/artifacts/"+a.ID)) {
				t.Errorf("the review page does not link %s %s", a.Kind, a.Name)
			}
		}
		st2, _, loc := e.redirect(t, "", base+"/artifacts/"+rec.ID)
		if st2 != 302 {
			t.Fatalf("review artifact link: %d", st2)
		}
		r2, err := http.Get(loc)
		if err != nil {
			t.Fatal(err)
		}
		video, _ := io.ReadAll(r2.Body)
		r2.Body.Close()
		if sha(video) != rec.SHA256 {
			t.Fatal("the review page's recording is not the recording")
		}
		// The session's audit trail has the page's view and the
		// recording's fetch, once each however often they are made.
		if st, _, _ := e.redirect(t, "", base+"/artifacts/"+rec.ID); st != 302 {
			t.Fatalf("review artifact link again: %d", st)
		}
		// Another artifact fetched by many at once: each is served, and
		// it is recorded once (they wait for the one that records it).
		var other artifact
		for _, a := range as {
			if a.ID != rec.ID {
				other = a
				break
			}
		}
		for i, st := range getAtOnce(e.gwURL+base+"/artifacts/"+other.ID, 16) {
			if st != 302 {
				t.Errorf("fetch %d of 16 at once: %d", i, st)
			}
		}
		if r3, err := http.Get(url); err == nil {
			r3.Body.Close()
		}
		pid := jsonField(body, "id")
		views := map[string]int{}
		for _, ev := range e.events(t, e.keyA, s.ID) {
			if ev.Fields["preview"] == pid && (ev.Type == "review_opened" || ev.Type == "review_fetched") {
				views[ev.Type+" "+fmt.Sprint(ev.Fields["artifact"])]++
			}
		}
		want := map[string]int{"review_opened <nil>": 1, "review_fetched " + rec.ID: 1, "review_fetched " + other.ID: 1}
		if fmt.Sprint(views) != fmt.Sprint(want) {
			t.Errorf("the review link's views in the trail: %v, want %v", views, want)
		}
		// Other scopes do not open the review page.
		p := e.preview(t, e.keyA, e.createSession(t, e.keyA, nil).ID, 60)
		tok := p.URL[strings.LastIndex(p.URL, "/")+1:]
		if st, _, _ := e.redirect(t, "", "/review/"+tok); st != 401 {
			t.Errorf("a cdp token opened a review page: %d", st)
		}
	})
}

// TestRecordingSurvivesGatewayKill: SIGKILL the gateway 6 s into a
// recording and start it again: the first seconds are there at once, and
// the recording goes on and is finalised.
func TestRecordingSurvivesGatewayKill(t *testing.T) {
	e := needE2E(t)
	s, _ := e.recordColours(t)
	time.Sleep(6 * time.Second)
	e.stopGateway(syscall.SIGKILL)
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}
	var first *artifact
	deadline := time.Now().Add(20 * time.Second)
	for first == nil && time.Now().Before(deadline) {
		if as := e.artifacts(t, e.keyA, s.ID); findKind(as, "recording_segment", "") != nil {
			first = findKind(as, "recording_segment", "")
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if first == nil {
		t.Fatal("after the restart no segment of the first seconds is downloadable")
	}
	seg := saveTemp(t, e.fetchArtifact(t, e.keyA, first.ID), "first.ts")
	if d := probeDuration(t, seg); d < 1 {
		t.Fatalf("first segment lasts %.2f s", d)
	}
	time.Sleep(5 * time.Second)
	e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil)
	path, manifest := e.finalRecording(t, e.keyA, s.ID)
	parts := map[string]bool{}
	for _, sg := range manifest["segments"].([]any) {
		name := sg.(map[string]any)["name"].(string)
		parts[name[:strings.IndexByte(name, '-')]] = true
	}
	d := probeDuration(t, path)
	t.Logf("recording across the restart: %.2f s in %d parts", d, len(parts))
	if len(parts) < 2 || d < 9 {
		t.Fatalf("the recording did not go on after the restart: %.2f s, parts %v", d, parts)
	}
	colours, _ := steps(colourRun(t, path, 4))
	if len(colours) < 8 {
		t.Fatalf("the recording shows too few of the page's colours: %v", colours)
	}
}

// TestRecordingSurvivesMinIOOutage: MinIO away for 10 s in the middle of a
// recording costs no part of it.
func TestRecordingSurvivesMinIOOutage(t *testing.T) {
	e := needE2E(t)
	s, created := e.recordColours(t)
	time.Sleep(4 * time.Second)
	back := e.minioAway(t)
	time.Sleep(10 * time.Second)
	back()
	time.Sleep(6 * time.Second)
	e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil)
	wall := time.Since(created).Seconds()
	path, _ := e.finalRecording(t, e.keyA, s.ID)
	d := probeDuration(t, path)
	colours, st := steps(colourRun(t, path, 4))
	t.Logf("recording: %.2f s over %.2f s with MinIO away for 10 s; colours %v", d, wall, colours)
	if d < wall-2 {
		t.Errorf("the recording lasts %.2f s of %.2f s", d, wall)
	}
	for i, s := range st {
		// A step of 2 skips one colour: a gap of at most 2 s.
		if s > 2 {
			t.Errorf("a gap of about %d s after colour %d", s, colours[i])
		}
	}
}

// TestDownloadsAndAuditTrail: a file Chromium downloads is stored with its
// name, source and digest; the audit trail lists preview, screenshot,
// download and stop in order, live and as a stored JSONL artifact.
func TestDownloadsAndAuditTrail(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	ctx, done := e.cdpPage(t, s.ID)
	pages := testPages(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(pages+"/download.html")); err != nil {
		t.Fatal(err)
	}
	if st, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/screenshot", nil); st != 201 && st != 200 {
		t.Fatalf("screenshot: %d %s", st, body)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#dl"))); err != nil {
		t.Fatal(err)
	}
	done()
	var dl *artifact
	deadline := time.Now().Add(30 * time.Second)
	for dl == nil && time.Now().Before(deadline) {
		dl = findKind(e.artifacts(t, e.keyA, s.ID), "download", "")
		time.Sleep(300 * time.Millisecond)
	}
	if dl == nil {
		t.Fatal("the download did not become an artifact")
	}
	if dl.Name != "report data.bin" || dl.SHA256 != sha(downloadBody) || dl.Size != int64(len(downloadBody)) || dl.SourceURL != pages+"/file.bin" {
		t.Fatalf("download artifact %+v; want name %q, %d bytes, sha256 %s, source %s", dl, "report data.bin", len(downloadBody), sha(downloadBody), pages+"/file.bin")
	}
	if got := e.fetchArtifact(t, e.keyA, dl.ID); !bytes.Equal(got, downloadBody) {
		t.Fatal("the stored download is not the served file")
	}
	e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil)

	order := []string{"created", "started", "preview_issued", "preview_connected", "screenshot", "download", "stopped"}
	check := func(where string, types []string) {
		t.Helper()
		i := 0
		for _, ty := range types {
			if i < len(order) && ty == order[i] {
				i++
			}
		}
		if i < len(order) {
			t.Errorf("%s: %q is missing or out of order in %v", where, order[i], types)
		}
	}
	var live []string
	for _, ev := range e.events(t, e.keyA, s.ID) {
		live = append(live, ev.Type)
	}
	check("live trail", live)
	log := findKind(e.artifacts(t, e.keyA, s.ID), "log", "")
	if log == nil || log.Name != "audit.jsonl" {
		t.Fatal("no stored audit trail")
	}
	storedTrail := func(id string) []string {
		var out []string
		dec := json.NewDecoder(bytes.NewReader(e.fetchArtifact(t, e.keyA, id)))
		for dec.More() {
			var ev struct{ Type string }
			if err := dec.Decode(&ev); err != nil {
				t.Fatalf("audit.jsonl: %v", err)
			}
			out = append(out, ev.Type)
		}
		return out
	}
	stored := storedTrail(log.ID)
	check("stored trail", stored)

	// A review link issued and revoked after the end is in the stored
	// log too, which is replaced, not doubled.
	var pr struct{ ID string }
	st, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/previews", map[string]any{"scope": "review", "ttl_seconds": 300})
	if st != 201 || json.Unmarshal(body, &pr) != nil {
		t.Fatalf("review link after the end: %d %s", st, body)
	}
	if st, body := e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID+"/previews/"+pr.ID, nil); st != 204 {
		t.Fatalf("revoke the review link: %d %s", st, body)
	}
	late := func(types []string) bool {
		return len(types) >= 2 && types[len(types)-2] == "preview_issued" && types[len(types)-1] == "preview_revoked"
	}
	if late(stored) {
		t.Fatal("the stored log ended with the late events before they were recorded")
	}
	var logs []artifact
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		logs = nil
		for _, a := range e.artifacts(t, e.keyA, s.ID) {
			if a.Kind == "log" {
				logs = append(logs, a)
			}
		}
		if len(logs) == 1 && late(storedTrail(logs[0].ID)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stored log did not take the events after the end within a minute: %d logs", len(logs))
		}
	}
	// Stored again, whole: what the end stored comes first. (Events
	// recorded as the session was finalised may come between.)
	got := storedTrail(logs[0].ID)
	if len(got) < len(stored)+2 || strings.Join(got[:len(stored)], " ") != strings.Join(stored, " ") {
		t.Fatalf("stored again: %v, want %v first and 2 events after", got, stored)
	}
	// The host's file of the trail gone, a late event is added to the
	// stored log, which keeps what it had: it never gets shorter.
	ended := filepath.Join(e.dir, "state", "audit", "tenant-a", s.ID+".jsonl.ended")
	if err := os.Remove(ended); err != nil {
		t.Fatalf("the ended trail's host file: %v", err)
	}
	if st, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/previews", map[string]any{"scope": "review", "ttl_seconds": 300}); st != 201 {
		t.Fatalf("review link after the file went: %d %s", st, body)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		again := storedTrail(logs[0].ID)
		if len(again) == len(got)+1 && again[len(got)] == "preview_issued" {
			if strings.Join(again[:len(got)], " ") != strings.Join(got, " ") {
				t.Fatalf("the stored log lost events: %v, had %v", again, got)
			}
			break
		}
		if len(again) < len(got) {
			t.Fatalf("the stored log got shorter: %v, had %v", again, got)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the late event was not added within a minute: %v", again)
		}
	}
}

// TestArtifactBadInput: unknown ids, another tenant's artifacts and
// tampered presigned URLs get 404 or 403, never the bytes.
func TestArtifactBadInput(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	st, body := e.api(t, e.keyA, "POST", "/v1/sessions/"+s.ID+"/screenshot", nil)
	if st/100 != 2 {
		t.Fatalf("screenshot: %d %s", st, body)
	}
	a := e.artifacts(t, e.keyA, s.ID)[0]
	for _, tc := range []struct {
		name, key, path string
		want            int
	}{
		{"unknown id", e.keyA, "/v1/artifacts/" + s.ID + ".0123456789abcdef", 404},
		{"malformed id", e.keyA, "/v1/artifacts/..%2f..%2fetc", 404},
		{"another tenant's artifact", e.keyB, "/v1/artifacts/" + a.ID, 404},
		{"another tenant's listing", e.keyB, "/v1/sessions/" + s.ID + "/artifacts", 404},
		{"no key", "", "/v1/artifacts/" + a.ID, 401},
	} {
		st, body, loc := e.redirect(t, tc.key, tc.path)
		if st != tc.want || loc != "" {
			t.Errorf("%s: %d %s %s, want %d", tc.name, st, body, loc, tc.want)
		}
	}
	st, _, loc := e.redirect(t, e.keyA, "/v1/artifacts/"+a.ID)
	if st != 302 {
		t.Fatalf("artifact: %d", st)
	}
	otherSession := strings.Replace(loc, s.ID, "s-0000000000000000", 1)
	flipped := loc[:strings.Index(loc, "X-Amz-Signature=")+len("X-Amz-Signature=")] + strings.Repeat("0", 64)
	longer := strings.Replace(loc, "X-Amz-Expires=", "X-Amz-Expires=9", 1)
	for name, u := range map[string]string{"other key": otherSession, "signature": flipped, "expiry": longer} {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 && resp.StatusCode != 404 || bytes.Contains(b, []byte("PNG")) {
			t.Errorf("tampered presigned URL (%s): %d", name, resp.StatusCode)
		}
	}
}

// TestArtifactRetention: tenant C keeps artifacts for 3 seconds.
func TestArtifactRetention(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyC, nil)
	if st, body := e.api(t, e.keyC, "POST", "/v1/sessions/"+s.ID+"/screenshot", nil); st/100 != 2 {
		t.Fatalf("screenshot: %d %s", st, body)
	}
	id := e.artifacts(t, e.keyC, s.ID)[0].ID
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, _, _ := e.redirect(t, e.keyC, "/v1/artifacts/"+id)
		if st == 404 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the artifact outlived its tenant's retention: %d", st)
		}
		time.Sleep(time.Second)
	}
}

// TestDownloadsRetriedAndFound: a download that finishes while the
// store is down is stored, under its own name, once the store is back;
// a download whose end the gateway missed (it finished while no gateway
// watched the browser, or before a gateway that was killed stored it:
// here a file the session puts in its download directory under a GUID)
// is found there by the restarted gateway and stored, said to be found.
// Nothing is stored twice: the download stored at once (the control)
// and the one retried stay one artifact each after the restart.
func TestDownloadsRetriedAndFound(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	ctx, done := e.cdpPage(t, s.ID)
	defer done()
	download := func(name, body string) {
		t.Helper()
		page := `data:text/html,<a id="a" download="` + name + `">x</a><script>` +
			`document.getElementById("a").href=URL.createObjectURL(new Blob(["` + body + `"]))</script>`
		if err := chromedp.Do(ctx, chromedp.Navigate(page), chromedp.Click(chromedp.CSS("#a"))); err != nil {
			t.Fatalf("download %s: %v", name, err)
		}
	}
	downloads := func() map[string][]artifact {
		out := map[string][]artifact{}
		for _, a := range e.artifacts(t, e.keyA, s.ID) {
			if a.Kind == "download" {
				out[a.Name] = append(out[a.Name], a)
			}
		}
		return out
	}
	stored := func(name, body string) {
		t.Helper()
		waitFor(t, 2*time.Minute, name+" stored", func() bool {
			as := downloads()[name]
			return len(as) > 0 && as[0].SHA256 == sha([]byte(body))
		})
	}

	download("first.txt", "stored at once")
	stored("first.txt", "stored at once")

	back := e.minioAway(t)
	download("second.txt", "stored once the store is back")
	waitFor(t, time.Minute, "the failed store in the trail", func() bool {
		for _, ev := range e.events(t, e.keyA, s.ID) {
			if ev.Type == "download_failed" && ev.Fields["retrying"] == true {
				return true
			}
		}
		return false
	})
	back()
	t0 := time.Now()
	stored("second.txt", "stored once the store is back")
	t.Logf("stored %.1f s after MinIO was back (tries again every 30 s)", time.Since(t0).Seconds())

	// Missed by this gateway: its connection to the browser is up, so it
	// does not look in the directory. Beside it, named as a download too,
	// a symlink to a file the host has (the session's path; followed on
	// the host's side it would be the host's): it is not stored, and the
	// real one still is.
	const guid = "0b7e3c52-5f2e-4c55-9a8c-2f0d1e6a7b91"
	if out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"sh", "-c",
		`mkdir -p "$1" && printf 'missed by the gateway' > "$1/$2" && ln -s /etc/passwd "$1/1c0ffee0-0000-4000-8000-000000000001"`,
		"sh", "/home/sandgate/workspace/.downloads", guid}}); out.ExitCode != 0 {
		t.Fatalf("the missed download's file and the symlink: exit %d %s", out.ExitCode, out.Stderr)
	}
	hostPasswd, err := os.ReadFile("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	done()
	e.stopGateway(syscall.SIGKILL)
	t0 = time.Now()
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}
	stored("download", "missed by the gateway")
	t.Logf("the missed download stored %.1f s after the gateway was started again", time.Since(t0).Seconds())
	got := downloads()
	if len(got) != 3 || len(got["first.txt"]) != 1 || len(got["second.txt"]) != 1 || len(got["download"]) != 1 {
		t.Fatalf("downloads stored after the restart: %v; want first.txt, second.txt and download once each", got)
	}
	for _, a := range e.artifacts(t, e.keyA, s.ID) {
		if a.SHA256 == sha(hostPasswd) {
			t.Fatalf("the host's /etc/passwd stored as %+v", a)
		}
	}
	if got["download"][0].ID != recordings.DownloadID(s.ID, guid) {
		t.Errorf("the found download is %s, want the id of its GUID", got["download"][0].ID)
	}
	found := 0
	for _, ev := range e.events(t, e.keyA, s.ID) {
		if ev.Type == "download" && ev.Fields["found"] == true {
			found++
			if ev.Fields["artifact"] != got["download"][0].ID {
				t.Errorf("found download event %v, want artifact %s", ev.Fields, got["download"][0].ID)
			}
		}
	}
	if found != 1 {
		t.Errorf("%d download events said found, want 1", found)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		var failed []map[string]any
		evs := e.events(t, e.keyA, s.ID)
		for _, ev := range evs {
			if ev.Type == "download_failed" && ev.Fields["retrying"] == nil {
				failed = append(failed, ev.Fields)
			}
		}
		if len(failed) == 1 {
			break
		}
		if time.Now().After(deadline) {
			raw, _ := os.ReadFile(e.gwLog)
			for _, l := range strings.Split(string(raw), "\n") {
				if strings.Contains(l, "download") {
					t.Log(l)
				}
			}
			t.Fatalf("the symlink: %d refusals in the trail, want 1: %v", len(failed), evs)
		}
	}
	if st, body := e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != 200 {
		t.Fatalf("delete: %d %s", st, body)
	}
	if got := downloads(); len(got) != 3 {
		t.Fatalf("downloads after the end: %v", got)
	}
}
