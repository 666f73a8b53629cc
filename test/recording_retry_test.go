package test

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// segmentParts lists the parts among the session's uploaded segments: a
// segment's name starts with its part's start.
func (e *testEnv) segmentParts(t *testing.T, id string) map[string]bool {
	t.Helper()
	parts := map[string]bool{}
	for _, a := range e.artifacts(t, e.keyA, id) {
		if a.Kind == "recording_segment" {
			parts[strings.SplitN(a.Name, "-", 2)[0]] = true
		}
	}
	return parts
}

// TestRecordingResumes: the session's VNC server goes away mid-recording
// and comes back (a restart): the recorder reconnects, the trail says
// recording_interrupted then recording_resumed, and the finished recording
// joins both parts.
func TestRecordingResumes(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, map[string]any{"kind": "desktop", "runtime": "runc", "record": true})
	e.waitEvent(t, s.ID, "recording_started", 10*time.Second)
	waitUntil := func(within time.Duration, what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("not within %v: %s", within, what)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	waitUntil(30*time.Second, "a first segment is uploaded", func() bool { return len(e.segmentParts(t, s.ID)) == 1 })

	// As the session's user: restart the VNC server, a few seconds away.
	e.runInBackground(t, s.ID, takeOverDisplay+"sleep 2 && "+restartDisplay)
	intr := e.waitEvent(t, s.ID, "recording_interrupted", 30*time.Second)
	res := e.waitEvent(t, s.ID, "recording_resumed", 60*time.Second)
	t.Logf("interrupted: %v; resumed: %v", intr, res)
	waitUntil(30*time.Second, "the second part is uploaded", func() bool { return len(e.segmentParts(t, s.ID)) == 2 })
	for _, ev := range e.events(t, e.keyA, s.ID) {
		if ev.Type == "recording_failed" {
			t.Fatalf("recording_failed: %v", ev.Fields)
		}
	}

	if st, body := e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != http.StatusOK {
		t.Fatalf("delete: %d %s", st, body)
	}
	path, manifest := e.finalRecording(t, e.keyA, s.ID)
	parts := map[string]bool{}
	for _, seg := range manifest["segments"].([]any) {
		parts[strings.SplitN(seg.(map[string]any)["name"].(string), "-", 2)[0]] = true
	}
	if len(parts) != 2 {
		t.Fatalf("the recording joins %d parts, want 2: %v", len(parts), manifest["segments"])
	}
	t.Logf("recording: %.2f s from %d parts", probeDuration(t, path), len(parts))
}

// TestRecordingFinishedLater: MinIO is away as a recorded session ends,
// so its recording cannot be finished then; the trail says it failed and
// is retried (the control). Once MinIO is back the janitor finishes it,
// and the trail, live and stored, says so with recording_finalised and
// the recording's artifact: a reviewer never reads "failed" of a
// recording that exists.
func TestRecordingFinishedLater(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, map[string]any{"runtime": "runc", "record": true})
	e.waitEvent(t, s.ID, "recording_started", 30*time.Second)
	waitFor(t, time.Minute, "a first segment to be stored", func() bool { return len(e.segmentParts(t, s.ID)) > 0 })
	back := e.minioAway(t)
	if st, body := e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil); st != http.StatusOK {
		t.Fatalf("delete: %d %s", st, body)
	}
	failed := e.waitEvent(t, s.ID, "recording_failed", 3*time.Minute)
	if r, _ := failed["reason"].(string); !strings.Contains(r, "retried") {
		t.Fatalf("recording_failed says %v, want a retry", failed)
	}
	for _, ev := range e.events(t, e.keyA, s.ID) {
		if ev.Type == "recording_finalised" {
			t.Fatalf("recording_finalised while MinIO is away: %v", ev.Fields)
		}
	}
	back()
	var rec *artifact
	waitFor(t, 3*time.Minute, "the janitor to finish the recording", func() bool {
		rec = findKind(e.artifacts(t, e.keyA, s.ID), "recording", "video/mp4")
		return rec != nil
	})
	fin := e.waitEvent(t, s.ID, "recording_finalised", time.Minute)
	if fin["artifact"] != rec.ID || fin["sha256"] != rec.SHA256 {
		t.Errorf("recording_finalised says %v; the recording is %s (sha256 %s)", fin, rec.ID, rec.SHA256)
	}
	var types []string
	waitFor(t, time.Minute, "the stored audit log to say recording_finalised", func() bool {
		types = storedTrailTypes(t, e, s.ID)
		f, d := slices.Index(types, "recording_failed"), slices.Index(types, "recording_finalised")
		return f >= 0 && d > f
	})
	t.Logf("stored trail: %v", types)
}
