package kube

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/sandgate/sandgate/session"
)

// Sources finds the session Pod behind an address, for an egress proxy
// of a replica that stands by (the leader's knows its sessions): a
// connection's source is its Pod's IP.
//
// What it answers is read from the API server, as Look reads (a watch's
// cache that stalled would keep an ended session's address, which may
// have gone to another tenant's Pod since), and used for sourceFresh:
// a browser's burst of connections costs one read. A Pod is found by its
// address once (a list by status.podIP), then read by its name. An
// address no session that starts or runs holds is asked again at its
// next connection.
type Sources struct {
	pods corev1client.PodInterface // a client of its own (NewSources)

	mu   sync.Mutex
	seen map[netip.Addr]*sourceSeen
}

// sourceFresh is how long a read of an address's Pod is used; far less
// than a Pod takes to go and its address to come back on another.
const sourceFresh = 2 * time.Second

// sourceStale is how long an answer is used while the API server does
// not answer: no Pod is given the address meanwhile, as none is created
// or deleted (as Serves reasons).
const sourceStale = 30 * time.Second

// maxSources bounds the addresses remembered; past it, those not asked
// for a minute are forgotten.
const maxSources = 4096

type sourceSeen struct {
	ready  chan struct{} // closed once read
	at     time.Time
	name   string            // the Pod's, once found
	record map[string]string // nil: no running session Pod holds it
	err    error
	used   time.Time
}

// NewSources reads with s's credentials, through a client of its own:
// its reads (one per address every sourceFresh, with connections) share
// no rate limit with the leases the replica renews.
func NewSources(s *Sessions) (*Sources, error) {
	rc := rest.CopyConfig(s.b.rest)
	rc.QPS, rc.Burst = 100, 200
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &Sources{pods: c.CoreV1().Pods(s.b.cfg.Namespace), seen: map[netip.Addr]*sourceSeen{}}, nil
}

// Record is the record of the session Pod that holds address a, runs and
// is not being deleted (false: none does, or more than one claims it).
func (r *Sources) Record(ctx context.Context, a netip.Addr) (map[string]string, bool, error) {
	now := time.Now()
	r.mu.Lock()
	sn := r.seen[a]
	if sn != nil {
		select {
		case <-sn.ready:
			if now.Sub(sn.at) > sourceFresh {
				sn = nil
			}
		default: // a read under way: its answer serves
		}
	}
	var name string
	old := r.seen[a]
	if old != nil && sn == nil {
		name = old.name // read by its name this time
	}
	read := sn == nil
	if read {
		if len(r.seen) >= maxSources {
			r.forgetLocked(now)
		}
		sn = &sourceSeen{ready: make(chan struct{}), used: now}
		r.seen[a] = sn
	}
	sn.used = now
	r.mu.Unlock()
	if read {
		sn.name, sn.record, sn.err = r.read(ctx, a, name)
		sn.at = time.Now()
		if sn.err == nil && !liveSession(sn.record) {
			// No session that starts or runs holds it (yet: a Pod that
			// has just started may not be marked running, a warm one may
			// be claimed at any moment): asked again next time.
			sn.at = time.Time{}
		}
		if sn.err != nil {
			sn.at = time.Time{} // asked again next time
			if old != nil && old.err == nil && old.record != nil && now.Sub(old.at) < sourceStale {
				// The last answer, while the API server does not answer
				// (still its time: asked again next time).
				sn.name, sn.record, sn.err, sn.at = old.name, old.record, nil, old.at
			}
		}
		close(sn.ready)
	}
	select {
	case <-sn.ready:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	if sn.err != nil {
		return nil, false, sn.err
	}
	return sn.record, sn.record != nil, nil
}

func (r *Sources) forgetLocked(now time.Time) {
	for a, sn := range r.seen {
		select {
		case <-sn.ready:
			if now.Sub(sn.used) > time.Minute {
				delete(r.seen, a)
			}
		default:
		}
	}
	if len(r.seen) >= maxSources {
		clear(r.seen) // all asked within the minute: read afresh
	}
}

// read finds a's Pod: by name when one held it at the last read, else
// (or when that one no longer holds it) by a list of the session Pods
// with a as their IP.
func (r *Sources) read(ctx context.Context, a netip.Addr, name string) (string, map[string]string, error) {
	pods := r.pods
	if name != "" {
		o, err := pods.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return name, nil, err
		case holds(o, a):
			rec, err := record(o)
			if err != nil {
				return name, nil, nil
			}
			return name, rec, nil
		}
	}
	list, err := pods.List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{LabelManaged: managedBy}).String(),
		FieldSelector: "status.podIP=" + a.String(),
	})
	if err != nil {
		return "", nil, fmt.Errorf("list pods: %w", err)
	}
	var found *corev1.Pod
	for i := range list.Items {
		if o := &list.Items[i]; holds(o, a) {
			if found != nil {
				return "", nil, nil // two claim it: neither is believed
			}
			found = o
		}
	}
	if found == nil {
		return "", nil, nil
	}
	rec, err := record(found)
	if err != nil {
		return found.Name, nil, nil
	}
	return found.Name, rec, nil
}

// liveSession: rec is the record of a session that starts or runs.
func liveSession(rec map[string]string) bool {
	if rec == nil {
		return false
	}
	info, err := session.InfoFromRecord(rec)
	return err == nil && (info.State == session.StateStarting || info.State == session.StateRunning)
}

// holds: o runs, is not being deleted and has a as its IP.
func holds(o *corev1.Pod, a netip.Addr) bool {
	ip, err := netip.ParseAddr(o.Status.PodIP)
	return err == nil && ip == a && o.Status.Phase == corev1.PodRunning && o.DeletionTimestamp == nil
}
