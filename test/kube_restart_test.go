package test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/session/kube"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubeLeaderRestart: a leader SIGKILLed whose container starts
// again at once, as the kubelet restarts it, gives its dead run's hold
// back as it starts, so a replica leads before that hold would have run
// out, and takes the recordings its dead run held over before their
// leases would have run out. The control, in the same run: a leader
// SIGKILLed that does not start again is taken over only once its hold
// has run out (a replica waits the hold's whole duration from when it
// saw the last renewal), and its recording once that lease has. A
// replica of another Pod that starts while the leader lives, or while
// the hold is another Pod's, frees and takes nothing. The session made
// before both kills is served after each, and its recording says it
// was taken over.
func TestKubeLeaderRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b, ra, rb, pods, roles, start := kubeReplicaPair(t, ctx)
	startLeading(t, ra, "A", start, roles, pods[ra])
	hold := func() (holder string, renewed time.Time) {
		t.Helper()
		le, err := b.Client().CoordinationV1().Leases(b.Namespace()).Get(ctx, kube.HoldLease, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the namespace's gateway lease: %v", err)
		}
		if le.Spec.HolderIdentity != nil {
			holder = *le.Spec.HolderIdentity
		}
		if le.Spec.RenewTime != nil {
			renewed = le.Spec.RenewTime.Time
		}
		return holder, renewed
	}
	logSize := func(r *testEnv) int64 {
		fi, err := os.Stat(r.gwLog)
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	logSince := func(r *testEnv, from int64) string {
		raw, _ := os.ReadFile(r.gwLog)
		if int64(len(raw)) < from {
			return ""
		}
		return string(raw[from:])
	}
	// listening waits until the run of r started at from has looked for
	// a dead run's hold (its front answers /healthz before).
	listening := func(r *testEnv, from int64) {
		t.Helper()
		waitFor(t, time.Minute, r.gwAddr+" to have looked for a dead run's hold", func() bool {
			// (Each outcome of the look names the lease.)
			return strings.Contains(logSince(r, from), "namespace's gateway lease")
		})
	}
	leaderA, _ := hold()
	if !strings.HasPrefix(leaderA, pods[ra]+"-") {
		t.Fatalf("A leads as %q, not named by its Pod %s", leaderA, pods[ra])
	}
	fromB := logSize(rb)
	start(rb, "B")
	listening(rb, fromB)
	roles.waitLeader(t, "B stands by", pods[ra])
	if h, _ := hold(); h != leaderA {
		t.Fatalf("B, of another Pod, started and the hold went from %q to %q", leaderA, h)
	}

	// Two recorded sessions, through B to A: each replica records one.
	var recorded []string
	for range 2 {
		st, body := rb.api(t, rb.keyA, "POST", "/v1/sessions", map[string]any{"runtime": "runc", "record": true})
		var s sessionInfo
		if err := json.Unmarshal(body, &s); st != 201 || err != nil || s.State != "running" {
			t.Fatalf("create through B: %d %s", st, body)
		}
		recorded = append(recorded, s.ID)
	}
	s := sessionInfo{ID: recorded[0]}
	onA, onB := recorded[0], recorded[1]
	if recordingHolder(t, ctx, b, onA, ra, rb) == rb {
		onA, onB = onB, onA
	}
	if recordingHolder(t, ctx, b, onA, ra, rb) != ra || recordingHolder(t, ctx, b, onB, ra, rb) != rb {
		t.Fatalf("the two recordings are not one on each replica")
	}
	// recording reads a session's recording lease.
	recording := func(id string) (holder string, renewed, taken time.Time) {
		t.Helper()
		le, err := b.Client().CoordinationV1().Leases(b.Namespace()).Get(ctx, "sandgate-recording-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the recording lease of %s: %v", id, err)
		}
		if le.Spec.HolderIdentity != nil {
			holder = *le.Spec.HolderIdentity
		}
		if le.Spec.RenewTime != nil {
			renewed = le.Spec.RenewTime.Time
		}
		if le.Spec.AcquireTime != nil {
			taken = le.Spec.AcquireTime.Time
		}
		return holder, renewed, taken
	}
	// takenOver waits until a holder other than dead holds the
	// session's recording, and returns when it took it.
	takenOver := func(id, dead string) time.Time {
		t.Helper()
		var at time.Time
		waitFor(t, 2*time.Minute, "the recording of "+id+" to be taken over", func() bool {
			h, _, taken := recording(id)
			at = taken
			return h != "" && h != dead
		})
		return at
	}
	// served waits until the session answers through r as a leader
	// answers it (503 while nobody leads: leaderAnswers) and its Pod runs a
	// command.
	served := func(r *testEnv, when string) {
		t.Helper()
		waitFor(t, 3*time.Minute, "the session through "+r.gwAddr+" "+when, func() bool {
			led, st, body := leaderAnswers(t, r, r.keyA)
			if !led && st != 503 {
				t.Fatalf("a create a leader refuses through %s %s: %d %s", r.gwAddr, when, st, body)
			}
			if !led {
				return false
			}
			st, body = r.api(t, r.keyA, "GET", "/v1/sessions/"+s.ID, nil)
			return st == 200 && jsonField(body, "state") == "running"
		})
		if out := r.execIn(t, r.keyA, s.ID, map[string]any{"cmd": []string{"echo", "carried " + when}}); out.ExitCode != 0 || !strings.Contains(string(out.Stdout), "carried") {
			t.Fatalf("exec through %s %s: exit %d %q", r.gwAddr, when, out.ExitCode, out.Stdout)
		}
	}

	// The control: A is SIGKILLed and stays dead. B leads once A's
	// hold has run out.
	_, renewed := hold()
	deadRec, recRenewed, _ := recording(onA)
	killed := time.Now()
	ra.stopGateway(syscall.SIGKILL)
	served(rb, "after A's death")
	slow := time.Since(killed)
	if at := takenOver(onA, deadRec); at.Before(recRenewed.Add(kube.ShareDuration)) {
		t.Errorf("A's recording was taken over at %s, before its lease ran out (%s)", at.Format(time.RFC3339Nano), recRenewed.Add(kube.ShareDuration).Format(time.RFC3339Nano))
	}
	slowRec := time.Since(killed)
	leaderB, _ := hold()
	roles.waitLeader(t, "B leads", pods[rb])
	if !strings.HasPrefix(leaderB, pods[rb]+"-") {
		t.Fatalf("after A's death the hold is %q's, not B's", leaderB)
	}
	if le, err := b.Client().CoordinationV1().Leases(b.Namespace()).Get(ctx, kube.HoldLease, metav1.GetOptions{}); err != nil || le.Spec.AcquireTime == nil || le.Spec.AcquireTime.Time.Before(renewed.Add(kube.HoldDuration)) {
		t.Errorf("B took A's hold before it ran out (renewed %s, taken %v): %v", renewed.Format(time.RFC3339Nano), le.Spec.AcquireTime, err)
	}
	t.Logf("A killed and not started again: B served the session %.1f s after the kill, and had taken A's recording over by %.1f s", slow.Seconds(), slowRec.Seconds())

	// A starts again: the hold is B's, of another Pod, so A frees
	// nothing and stands by.
	const freedSays = "given back, so that a replica leads at once"
	fromA := logSize(ra)
	start(ra, "A, started again")
	listening(ra, fromA)
	waitFor(t, time.Minute, "A to stand by, ready", func() bool { return httpStatus(ra.gwURL+"/readyz") == 200 })
	if h, _ := hold(); h != leaderB {
		t.Fatalf("A started again while B led, and the hold went from %q to %q", leaderB, h)
	}
	if strings.Contains(logSince(ra, fromA), freedSays) {
		t.Errorf("A, started again while B led, says it freed a hold")
	}
	// B holds both recordings (the one it took over too).
	for _, id := range recorded {
		if h, _, _ := recording(id); h != leaderB {
			t.Fatalf("the recording of %s is held by %q, not by B (%s)", id, h, leaderB)
		}
	}

	// B is SIGKILLed, and its container starts again at once: the run
	// that starts gives the dead run's hold back, and a replica leads
	// (whichever takes it first) before that hold would have run out.
	fromB = logSize(rb)
	killed = time.Now()
	rb.stopGateway(syscall.SIGKILL)
	// When B's dead run last renewed (it renews no more).
	_, renewed = hold()
	var recRenewedB []time.Time
	for _, id := range recorded {
		_, r, _ := recording(id)
		recRenewedB = append(recRenewedB, r)
	}
	start(rb, "B, started again")
	served(ra, "after B's death and restart")
	fast := time.Since(killed)
	for i, id := range recorded {
		if at := takenOver(id, leaderB); !at.Before(recRenewedB[i].Add(kube.ShareDuration)) {
			t.Errorf("the recording of %s, held by B's dead run, was taken over at %s, not before its lease ran out (%s)", id, at.Format(time.RFC3339Nano), recRenewedB[i].Add(kube.ShareDuration).Format(time.RFC3339Nano))
		}
	}
	fastRec := time.Since(killed)
	if !strings.Contains(logSince(rb, fromB), freedSays) {
		t.Errorf("B, started again, did not say it freed its dead run's hold")
	}
	le, err := b.Client().CoordinationV1().Leases(b.Namespace()).Get(ctx, kube.HoldLease, metav1.GetOptions{})
	if err != nil || le.Spec.HolderIdentity == nil || *le.Spec.HolderIdentity == leaderB || le.Spec.AcquireTime == nil {
		t.Fatalf("the hold after B's restart: %v %v", le, err)
	}
	if at := le.Spec.AcquireTime.Time; !at.Before(renewed.Add(kube.HoldDuration)) {
		t.Errorf("the hold was taken at %s, not before B's dead run's hold ran out (%s)", at.Format(time.RFC3339Nano), renewed.Add(kube.HoldDuration).Format(time.RFC3339Nano))
	}
	t.Logf("B killed and started again at once: %s leads; the session was served %.1f s after the kill (×%.2f of %.1f s when the killed replica does not start again), and both recordings B's dead run held were taken over by %.1f s (×%.2f of %.1f s)",
		*le.Spec.HolderIdentity, fast.Seconds(), fast.Seconds()/slow.Seconds(), slow.Seconds(), fastRec.Seconds(), fastRec.Seconds()/slowRec.Seconds(), slowRec.Seconds())

	// Each recording's trail says it was taken over (twice for the one
	// A had), and each recording goes on in a part of its new holder.
	for _, id := range recorded {
		want := 1
		if id == onA {
			want = 2
		}
		waitFor(t, time.Minute, "recording_taken_over in the trail of "+id, func() bool {
			n := 0
			for _, ev := range ra.events(t, ra.keyA, id) {
				if ev.Type == "recording_taken_over" {
					n++
				}
			}
			return n >= want
		})
		waitFor(t, 2*time.Minute, "a part of the recording of "+id+" after the restart", func() bool { return recordingParts(t, ra, id) >= want+1 })
	}

	// The sessions end through whichever replica: nothing is left.
	for _, id := range recorded {
		if st, body := ra.api(t, ra.keyA, "DELETE", "/v1/sessions/"+id, nil); st != 200 && st != 204 {
			t.Errorf("delete the session: %d %s", st, body)
		}
	}
	waitFor(t, 2*time.Minute, "the sessions' Pods and recording leases to go", func() bool {
		pods, err := b.Client().CoreV1().Pods(b.Namespace()).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelSession})
		if err != nil || len(pods.Items) > 0 {
			return false
		}
		for _, id := range recorded {
			if _, err := b.Client().CoordinationV1().Leases(b.Namespace()).Get(ctx, "sandgate-recording-"+id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false
			}
		}
		return true
	})
}
