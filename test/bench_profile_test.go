package test

import (
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// BenchmarkProfile measures, in one run and against sessions without a
// profile: the start of a session with a typical logged-in profile (the
// profile site's login: cookie, local storage, IndexedDB) until CDP
// answers through the gateway, the restore and save inside that, the
// DELETE that saves the profile, and the profile's size.
func BenchmarkProfile(b *testing.B) {
	e := needE2E(b)
	e.profileSite(b)
	p := e.newProfile(b, e.keyA, "bench")
	base := "http://" + profileHost + ":" + profilePort
	allow := map[string]any{"allow": []string{profileHost + ":" + profilePort}}

	// A logged-in profile, once.
	s := e.profileSession(b, e.keyA, p.ID, true, nil)
	ctx := e.cdpContext(b, s.ID)
	pageTitle(b, ctx, base+"/app/login.html")
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#user"), basicUser), chromedp.SendKeys(chromedp.CSS("#pass"), "profile-pass"),
		chromedp.Click(chromedp.CSS("#submit"))); err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if title, _ := chromedp.Run(ctx, chromedp.Title()); title == "welcome, stored" {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the login did not finish")
		}
	}
	if st, body := e.api(b, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != 200 {
		b.Fatalf("delete: %d %s", st, body)
	}

	create := func(req map[string]any) (string, time.Duration) {
		b.Helper()
		t0 := time.Now()
		st, body := e.api(b, e.keyA, "POST", "/v1/sessions", req)
		if st != 201 {
			b.Fatalf("create: %d %s", st, body)
		}
		id := jsonField(body, "id")
		pv := e.preview(b, e.keyA, id, 60)
		if err := waitJSONVersion(pv.URL+"/json/version", 60*time.Second); err != nil {
			b.Fatal(err)
		}
		return id, time.Since(t0)
	}
	del := func(id string) time.Duration {
		t0 := time.Now()
		if st, body := e.api(b, e.keyA, "DELETE", "/v1/sessions/"+id, nil); st != 200 {
			b.Fatalf("delete: %d %s", st, body)
		}
		return time.Since(t0)
	}
	field := func(id, typ, k string) float64 {
		b.Helper()
		for _, ev := range e.events(b, e.keyA, id) {
			if ev.Type == typ {
				v, _ := ev.Fields[k].(float64)
				return v
			}
		}
		b.Fatalf("%s: no %s event", id, typ)
		return 0
	}
	var plainStart, profStart, plainDel, profDel []time.Duration
	var restoreMS, saveMS, size, stored []float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id, d := create(map[string]any{"egress": allow, "labels": map[string]string{"bench": "profile"}})
		plainStart = append(plainStart, d)
		plainDel = append(plainDel, del(id))

		id, d = create(map[string]any{"egress": allow, "labels": map[string]string{"bench": "profile"}, "profile": map[string]any{"id": p.ID, "persist": true}})
		profStart = append(profStart, d)
		restoreMS = append(restoreMS, field(id, "profile_restored", "took_ms"))
		profDel = append(profDel, del(id))
		saveMS = append(saveMS, field(id, "profile_saved", "took_ms"))
		size = append(size, field(id, "profile_saved", "size"))
		stored = append(stored, field(id, "profile_saved", "stored_bytes"))
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(percentile(plainStart, 0.5)), "start-plain-p50-ms")
	b.ReportMetric(ms(percentile(profStart, 0.5)), "start-profile-p50-ms")
	b.ReportMetric(float64(percentile(profStart, 0.5))/float64(percentile(plainStart, 0.5)), "start-ratio")
	b.ReportMetric(median(restoreMS), "restore-p50-ms")
	b.ReportMetric(ms(percentile(plainDel, 0.5)), "delete-plain-p50-ms")
	b.ReportMetric(ms(percentile(profDel, 0.5)), "delete-profile-p50-ms")
	b.ReportMetric(median(saveMS), "save-p50-ms")
	b.ReportMetric(median(size), "profile-tar-bytes")
	b.ReportMetric(median(stored), "profile-sealed-bytes")
}
