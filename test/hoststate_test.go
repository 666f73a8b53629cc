package test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/minio/minio-go/v7"
)

const artifactsBucket = "sandgate-artifacts"

// storedTrail reads what MinIO holds of a running session's audit trail
// (its pieces, in order) as the gateway wrote it.
func storedTrail(t testing.TB, mc *minio.Client, tenant, id string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var all []byte
	for obj := range mc.ListObjects(ctx, artifactsBucket, minio.ListObjectsOptions{Prefix: "~trails/" + tenant + "/" + id + "/", Recursive: true}) {
		if obj.Err != nil {
			t.Fatalf("list trail pieces: %v", obj.Err)
		}
		o, err := mc.GetObject(ctx, artifactsBucket, obj.Key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(o)
		o.Close()
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}

// markedPair makes two sessions, each of which has run an echo of its
// own mark, and waits until MinIO holds both marks in their trails.
func markedPair(t *testing.T, e *testEnv, mc *minio.Client) (a, b sessionInfo, markA, markB string) {
	t.Helper()
	a = e.createSession(t, e.keyA, map[string]any{"runtime": "runc", "labels": map[string]string{"test": t.Name()}})
	b = e.createSession(t, e.keyA, map[string]any{"runtime": "runc", "labels": map[string]string{"test": t.Name()}})
	markA, markB = "trail-mark-"+randHex(6), "trail-mark-"+randHex(6)
	for id, mark := range map[string]string{a.ID: markA, b.ID: markB} {
		if out := e.execIn(t, e.keyA, id, map[string]any{"cmd": []string{"echo", mark}}); out.ExitCode != 0 {
			t.Fatalf("exec: %s", out.Stderr)
		}
	}
	waitFor(t, 30*time.Second, "both trails' exec in MinIO", func() bool {
		return bytes.Contains(storedTrail(t, mc, "tenant-a", a.ID), []byte(markA)) &&
			bytes.Contains(storedTrail(t, mc, "tenant-a", b.ID), []byte(markB))
	})
	return a, b, markA, markB
}

// TestAuditTrailOutlivesHost: a session's audit trail is in MinIO while
// the session runs, a second or so behind, so a gateway that comes back
// without the host's trail file (a replica on another node, a lost disk)
// carries the trail on. Session A's trail is read back from the store
// after its host file is removed; session B, the control, loses both its
// host file and its stored pieces, and comes back without its past,
// which shows that the store is all A's past came from. At A's end the
// log artifact has the whole trail and the pieces are gone.
func TestAuditTrailOutlivesHost(t *testing.T) {
	e := needE2E(t)
	mc := e.profileBucket(t)
	a, b, markA, markB := markedPair(t, e, mc)

	e.stopGateway(syscall.SIGKILL)
	for _, id := range []string{a.ID, b.ID} {
		f := filepath.Join(e.dir, "state", "audit", "tenant-a", id+".jsonl")
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("the host trail file is not where the test looks: %v", err)
		}
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	for obj := range mc.ListObjects(ctx, artifactsBucket, minio.ListObjectsOptions{Prefix: "~trails/tenant-a/" + b.ID + "/", Recursive: true}) {
		if obj.Err == nil {
			mc.RemoveObject(ctx, artifactsBucket, obj.Key, minio.RemoveObjectOptions{})
		}
	}
	cancel()
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}

	trail := func(id string) string {
		var typs []string
		for _, ev := range e.events(t, e.keyA, id) {
			j, _ := json.Marshal(ev.Fields)
			typs = append(typs, ev.Type+string(j))
		}
		return strings.Join(typs, "\n")
	}
	ta, tb := trail(a.ID), trail(b.ID)
	for _, want := range []string{`created{`, markA, `adopted{`} {
		if !strings.Contains(ta, want) {
			t.Errorf("A's trail after the restart lacks %q:\n%s", want, ta)
		}
	}
	if !strings.Contains(tb, `adopted{`) {
		t.Errorf("B's trail after the restart lacks its adoption:\n%s", tb)
	}
	if strings.Contains(tb, markB) || strings.Contains(tb, `created{`) {
		t.Errorf("B kept its past with neither its host file nor its pieces: the test does not see where A's came from:\n%s", tb)
	}
	if n := strings.Index(ta, markA); n < 0 || n > strings.Index(ta, `adopted{`) {
		t.Errorf("A's past is not before its adoption:\n%s", ta)
	}
	// What is recorded after the adoption is stored too.
	markA2 := "trail-mark-" + randHex(6)
	if out := e.execIn(t, e.keyA, a.ID, map[string]any{"cmd": []string{"echo", markA2}}); out.ExitCode != 0 {
		t.Fatalf("exec: %s", out.Stderr)
	}
	waitFor(t, 30*time.Second, "A's exec after the adoption in MinIO", func() bool {
		return bytes.Contains(storedTrail(t, mc, "tenant-a", a.ID), []byte(markA2))
	})

	for _, id := range []string{a.ID, b.ID} {
		e.stopSession(t, e.keyA, id)
	}
	log := findKind(e.artifacts(t, e.keyA, a.ID), "log", "")
	if log == nil {
		t.Fatal("no stored audit log for A")
	}
	whole := e.fetchArtifact(t, e.keyA, log.ID)
	for _, want := range []string{markA, markA2, `"adopted"`, `"stopped"`} {
		if !bytes.Contains(whole, []byte(want)) {
			t.Errorf("A's audit log lacks %s", want)
		}
	}
	waitFor(t, 30*time.Second, "the trail pieces removed once the log is stored", func() bool {
		return len(storedTrail(t, mc, "tenant-a", a.ID)) == 0 && len(storedTrail(t, mc, "tenant-a", b.ID)) == 0
	})
}

// TestStoredOrphanFinalised: a session whose sandbox went while no
// gateway ran, on a host that lost its trail file too (a Pod deleted
// while no replica led, the next leader on another node), is finalised
// by the next gateway from the trail's pieces in MinIO: its audit log is
// stored, with what it did and ended_unobserved, and its pieces go. The
// control, a session whose sandbox stayed, is adopted and goes on, its
// pieces kept; and the gone one's log would not be there without the
// pass (nothing else stores it).
func TestStoredOrphanFinalised(t *testing.T) {
	e := needE2E(t)
	mc := e.profileBucket(t)
	kept, gone, markKept, markGone := markedPair(t, e, mc)
	// The gateway marks the pieces it writes with its scope's tag, the
	// one its created events carry: another gateway that shares the
	// bucket passes over them unread.
	scope := ""
	if err := artifactStore(t, e).Trails(e.ctx(), func(_, id, s string, _ time.Time) bool {
		if id == gone.ID {
			scope = s
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if scope == "" || !bytes.Contains(storedTrail(t, mc, "tenant-a", gone.ID), []byte(`"scope":"`+scope+`"`)) {
		t.Errorf("the session's pieces are marked %q, not with its created event's tag:\n%s", scope, storedTrail(t, mc, "tenant-a", gone.ID))
	}

	e.stopGateway(syscall.SIGKILL)
	ctx := e.ctx()
	c, err := e.client.LoadContainer(ctx, gone.ID)
	if err != nil {
		t.Fatal(err)
	}
	if task, err := c.Task(ctx, nil); err == nil {
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{kept.ID, gone.ID} {
		if err := os.Remove(filepath.Join(e.dir, "state", "audit", "tenant-a", id+".jsonl")); err != nil {
			t.Fatalf("the host trail file is not where the test looks: %v", err)
		}
	}
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}

	// Until its log is stored, the gateway knows nothing of it (404).
	var whole []byte
	waitFor(t, 2*time.Minute, "the gone session's audit log stored from its pieces", func() bool {
		st, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+gone.ID+"/artifacts", nil)
		var l struct{ Artifacts []artifact }
		if st != 200 || json.Unmarshal(body, &l) != nil {
			return false
		}
		if a := findKind(l.Artifacts, "log", ""); a != nil {
			whole = e.fetchArtifact(t, e.keyA, a.ID)
		}
		return bytes.Contains(whole, []byte(`"ended_unobserved"`))
	})
	for _, want := range []string{`"created"`, markGone} {
		if !bytes.Contains(whole, []byte(want)) {
			t.Errorf("the gone session's log lacks %s:\n%s", want, whole)
		}
	}
	if bytes.Contains(whole, []byte("recording_failed")) {
		t.Errorf("the gone session, never recorded, is said to have a failed recording:\n%s", whole)
	}
	// It was this gateway's by its created event's tag, which names no
	// host or namespace.
	if !bytes.Contains(whole, []byte(`"scope":"`)) || bytes.Contains(whole, []byte("containerd/")) {
		t.Errorf("the created event's scope is missing, or names where the gateway runs:\n%s", whole)
	}
	waitFor(t, 30*time.Second, "the gone session's pieces removed", func() bool {
		return len(storedTrail(t, mc, "tenant-a", gone.ID)) == 0
	})
	if r := e.residue(t, gone.ID); len(r) != 0 {
		t.Errorf("the gone session left %v", r)
	}
	// The control: adopted, running, its pieces kept and its trail whole.
	if st, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+kept.ID, nil); st != 200 || jsonField(body, "state") != "running" {
		t.Errorf("the kept session after the restart: %d %s", st, body)
	}
	if b := storedTrail(t, mc, "tenant-a", kept.ID); !bytes.Contains(b, []byte(markKept)) || bytes.Contains(b, []byte("ended_unobserved")) {
		t.Errorf("the kept session's pieces lost its exec or say it ended:\n%s", b)
	}
	e.stopSession(t, e.keyA, kept.ID)
}

// previewAnswers tells whether a CDP preview link is taken: its
// /json/version answers 200.
func previewAnswers(t testing.TB, url string) bool {
	t.Helper()
	_, err := browserWSErr(url)
	return err == nil
}

// TestRevocationOutlivesHost: a revoked preview stays revoked on a
// gateway that comes back without the host's revocations file (a
// replica on another node): the revocation is in MinIO too. p1 is
// revoked and stays refused; p2, never revoked, is taken (control);
// p3 is revoked and the test removes its stored revocation as well, so
// it is taken again, which shows the store is what kept p1 refused.
func TestRevocationOutlivesHost(t *testing.T) {
	e := needE2E(t)
	mc := e.profileBucket(t)
	s := e.createSession(t, e.keyA, map[string]any{"runtime": "runc", "labels": map[string]string{"test": t.Name()}})
	p1, p2, p3 := e.preview(t, e.keyA, s.ID, 600), e.preview(t, e.keyA, s.ID, 600), e.preview(t, e.keyA, s.ID, 600)
	for _, p := range []previewInfo{p1, p2, p3} {
		if !previewAnswers(t, p.URL) {
			t.Fatalf("preview %s refused before any revocation", p.ID)
		}
	}
	for _, p := range []previewInfo{p1, p3} {
		if st, body := e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID+"/previews/"+p.ID, nil); st != 204 {
			t.Fatalf("revoke: %d %s", st, body)
		}
		if previewAnswers(t, p.URL) {
			t.Fatalf("preview %s taken right after its revocation", p.ID)
		}
	}
	e.stopGateway(syscall.SIGKILL)
	f := filepath.Join(e.dir, "state", "revocations.jsonl")
	if raw, err := os.ReadFile(f); err != nil || !bytes.Contains(raw, []byte(p1.ID)) {
		t.Fatalf("the host revocations file is not where the test looks: %v", err)
	}
	if err := os.Remove(f); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	removed := 0
	for obj := range mc.ListObjects(ctx, artifactsBucket, minio.ListObjectsOptions{Prefix: "~revocations/" + s.ID + "/" + p3.ID + ".", Recursive: true}) {
		if obj.Err == nil && mc.RemoveObject(ctx, artifactsBucket, obj.Key, minio.RemoveObjectOptions{}) == nil {
			removed++
		}
	}
	cancel()
	if removed != 1 {
		t.Fatalf("removed %d stored revocations of p3, want 1", removed)
	}
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}
	if previewAnswers(t, p1.URL) {
		t.Error("a revoked preview is taken again after a restart without the host's revocations file")
	}
	if !previewAnswers(t, p2.URL) {
		t.Error("a preview never revoked is refused after the restart")
	}
	if !previewAnswers(t, p3.URL) {
		t.Error("p3, whose stored revocation the test removed, is still refused: the test does not see where p1's refusal came from")
	}
	e.stopSession(t, e.keyA, s.ID)
}
