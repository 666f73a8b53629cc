package kube

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandgate/sandgate/ids"
	"github.com/sandgate/sandgate/session"
)

// casPods makes client refuse a Pod's update made at a version other
// than the stored one (409), as the API server does and client-go's
// fake does not; an update with no version is taken, as the API server
// takes a Pod's. Every write gets a new version.
func casPods(client *fake.Clientset) {
	var version atomic.Int64
	version.Store(100)
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	client.PrependReactor("update", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		o := a.(k8stesting.UpdateAction).GetObject().(*corev1.Pod)
		cur, err := client.Tracker().Get(gvr, o.Namespace, o.Name)
		if err != nil {
			return true, nil, err
		}
		if o.ResourceVersion != "" && o.ResourceVersion != cur.(*corev1.Pod).ResourceVersion {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), o.Name, errors.New("the object has been modified"))
		}
		o.ResourceVersion = strconv.FormatInt(version.Add(1), 10)
		return false, nil, nil
	})
}

// TestUpdateRecordIsCompareAndSwap: a delete's stop (running to
// stopping) that lands between an extension's read of the record and
// its write wins: the extension's write is refused, it reads the Pod
// again, sees the session stopping and gives up, and the expiry stays
// as it was. The control: an extension with no other writer is written
// on its first read, and its expiry mirrored in the Pod's label.
func TestUpdateRecordIsCompareAndSwap(t *testing.T) {
	id := ids.NewSession()
	expires := time.Now().UTC().Add(time.Hour).Truncate(time.Second)
	raw, _ := json.Marshal(map[string]string{"sandgate.session": id, session.RecordTenant: "t", session.RecordState: "running",
		session.RecordExpires: expires.Format(time.RFC3339Nano)})
	client := fake.NewSimpleClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "ns", ResourceVersion: "1",
			Labels: map[string]string{LabelManaged: managedBy}, Annotations: map[string]string{AnnInfo: string(raw)}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3"},
	})
	casPods(client)
	s := NewSessions(context.Background(), &Backend{client: client, cfg: Config{Namespace: "ns"}})
	ctx := context.Background()
	errNotRunning := errors.New("not running")
	extend := func(to time.Time, between func()) (map[string]string, int, error) {
		asked := 0
		rec, _, err := s.UpdateRecord(ctx, id, func(rec map[string]string, running bool) (map[string]string, error) {
			if asked++; asked == 1 && between != nil {
				between()
			}
			if rec[session.RecordState] != "running" || !running || rec[session.RecordAddr] != "10.1.2.3" {
				return nil, errNotRunning
			}
			return map[string]string{session.RecordExpires: to.Format(time.RFC3339Nano)}, nil
		})
		return rec, asked, err
	}
	later := expires.Add(time.Hour)
	rec, asked, err := extend(later, nil)
	if err != nil || asked != 1 || rec[session.RecordExpires] != later.Format(time.RFC3339Nano) {
		t.Fatalf("an extension alone: %v (asked %d, record %v)", err, asked, rec)
	}
	o, _ := client.CoreV1().Pods("ns").Get(ctx, podName(id), metav1.GetOptions{})
	if o.Labels[LabelExpires] != strconv.FormatInt(later.Unix(), 10) {
		t.Errorf("the expiry label reads %q after the extension, want %d", o.Labels[LabelExpires], later.Unix())
	}

	stop := func() {
		if _, _, err := s.UpdateRecord(ctx, id, func(rec map[string]string, _ bool) (map[string]string, error) {
			if rec[session.RecordState] != "running" {
				return nil, nil
			}
			return map[string]string{session.RecordState: "stopping", session.RecordStopAsked: time.Now().UTC().Format(time.RFC3339Nano)}, nil
		}); err != nil {
			t.Errorf("the stop: %v", err)
		}
	}
	_, asked, err = extend(later.Add(time.Hour), stop)
	if !errors.Is(err, errNotRunning) || asked != 2 {
		t.Fatalf("an extension the stop came before the write of: %v (asked %d), want it asked again and refused", err, asked)
	}
	rec, err = s.Sandbox(id).Record(ctx)
	if err != nil || rec[session.RecordState] != "stopping" || rec[session.RecordExpires] != later.Format(time.RFC3339Nano) || rec[session.RecordStopAsked] == "" {
		t.Fatalf("after the stop and the refused extension: %v %v, want stopping at the expiry before", rec, err)
	}
	// A change of nothing writes nothing.
	before, _ := client.CoreV1().Pods("ns").Get(ctx, podName(id), metav1.GetOptions{})
	stop()
	after, _ := client.CoreV1().Pods("ns").Get(ctx, podName(id), metav1.GetOptions{})
	if before.ResourceVersion != after.ResourceVersion {
		t.Errorf("a stop of a stopping session wrote the Pod (version %s to %s)", before.ResourceVersion, after.ResourceVersion)
	}
	// A Pod whose record cannot be read, and none, hold no session:
	// nothing asked, nothing written.
	garbled := ids.NewSession()
	if _, err := client.CoreV1().Pods("ns").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(garbled), Namespace: "ns",
		Labels: map[string]string{LabelManaged: managedBy}, Annotations: map[string]string{AnnInfo: "{"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{garbled, ids.NewSession()} {
		asked := false
		_, _, err := s.UpdateRecord(ctx, other, func(map[string]string, bool) (map[string]string, error) { asked = true; return nil, nil })
		if !errors.Is(err, session.ErrSandboxGone) || asked {
			t.Errorf("a record of session %s's: %v (asked %v), want no session", other, err, asked)
		}
	}
}

// TestWatchRecords: each change to a session Pod's record (any
// writer's, this replica's too) reaches the hook WatchRecords set, in
// order; a change to the Pod that leaves its record as it was (its
// status) does not.
func TestWatchRecords(t *testing.T) {
	id := ids.NewSession()
	raw, _ := json.Marshal(map[string]string{"sandgate.session": id, session.RecordState: "running"})
	client := fake.NewSimpleClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "ns", ResourceVersion: "1",
			Labels: map[string]string{LabelManaged: managedBy}, Annotations: map[string]string{AnnInfo: string(raw)}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	})
	casPods(client)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := NewSessions(ctx, &Backend{client: client, cfg: Config{Namespace: "ns"}})
	seen := make(chan map[string]string, 16)
	s.WatchRecords(func(rec map[string]string) { seen <- rec })
	deadline := time.Now().Add(30 * time.Second)
	for !s.ends().synced() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// Its status changes: not a record's change.
	o, _ := client.CoreV1().Pods("ns").Get(ctx, podName(id), metav1.GetOptions{})
	o.Status.Phase, o.Status.PodIP = corev1.PodRunning, "10.1.2.3"
	if _, err := client.CoreV1().Pods("ns").UpdateStatus(ctx, o, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, exp := range []string{"2030-01-01T00:00:00Z", "2031-01-01T00:00:00Z"} {
		if _, err := s.Sandbox(id).SetRecord(ctx, map[string]string{session.RecordExpires: exp}); err != nil {
			t.Fatal(err)
		}
		select {
		case rec := <-seen:
			if rec[session.RecordExpires] != exp || rec["sandgate.session"] != id {
				t.Fatalf("the hook got %v, want the expiry %s", rec, exp)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the hook did not get the expiry %s", exp)
		}
	}
	select {
	case rec := <-seen:
		t.Errorf("the hook got %v more: a status change, or one twice", rec)
	default:
	}
}

// TestRecordMade: a record as the backend reads it says when the API
// server made the Pod, whatever its annotation says, and a write of the
// record does not store that time in the annotation; a Pod with no
// creation time (one not from an API server) says none.
func TestRecordMade(t *testing.T) {
	id := ids.NewSession()
	made := time.Now().UTC().Add(-time.Minute).Truncate(time.Second)
	raw, _ := json.Marshal(map[string]string{"sandgate.session": id, session.RecordTenant: "t", session.RecordState: "starting",
		session.RecordMade: "2999-01-01T00:00:00Z"})
	client := fake.NewSimpleClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "ns", CreationTimestamp: metav1.NewTime(made),
			Labels: map[string]string{LabelManaged: managedBy}, Annotations: map[string]string{AnnInfo: string(raw)}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3"},
	})
	s := NewSessions(context.Background(), &Backend{client: client, cfg: Config{Namespace: "ns"}})
	ctx := context.Background()
	rec, err := s.Sandbox(id).Record(ctx)
	if err != nil || rec[session.RecordMade] != made.Format(time.RFC3339Nano) {
		t.Fatalf("the record: %v %v, want made at %v", rec, err, made)
	}
	if _, _, err := s.UpdateRecord(ctx, id, func(map[string]string, bool) (map[string]string, error) {
		return map[string]string{session.RecordState: "running"}, nil
	}); err != nil {
		t.Fatal(err)
	}
	o, err := client.CoreV1().Pods("ns").Get(ctx, podName(id), metav1.GetOptions{})
	if err != nil || strings.Contains(o.Annotations[AnnInfo], session.RecordMade) || !strings.Contains(o.Annotations[AnnInfo], `"running"`) {
		t.Errorf("the annotation once written: %v %s, want the state and no creation time", err, o.Annotations[AnnInfo])
	}
	o.CreationTimestamp = metav1.Time{}
	if r, err := record(o); err != nil || r[session.RecordMade] != "" {
		t.Errorf("the record of a Pod with no creation time: %v %v", r, err)
	}
	o.Annotations[AnnInfo] = "{junk"
	if _, err := record(o); !errors.Is(err, session.ErrRecordUnreadable) {
		t.Errorf("a record that cannot be read: %v, want ErrRecordUnreadable", err)
	}
}
