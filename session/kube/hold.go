package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HoldLease names the Lease a gateway holds over its namespace's
// sessions. One replica at a time leads a namespace: it runs the
// sessions, their trails, revocations and recordings. The others stand
// by: they forward what they are sent to the leader and take the lease
// over when the leader stops renewing it (it died), adopting its
// sessions from their Pods and MinIO.
const HoldLease = "sandgate-gateway"

// HoldDuration is how long the hold lasts without a renewal; a gateway
// renews it every third of that.
const HoldDuration = 15 * time.Second

// holdDuration is HoldDuration, shorter in tests.
var holdDuration = HoldDuration

// A leader that has not renewed for two thirds of the hold's duration,
// counted from when it sent its last renewal that succeeded, stops
// leading (lost is called) before another replica may take the lease
// over: that one waits the full duration from when it saw that renewal,
// which was later. So two never lead at once (as client-go's leader
// election does with its RenewDeadline). A failed renewal is tried
// again every renewRetry.
func renewDeadline() time.Duration { return holdDuration * 2 / 3 }

const renewRetry = time.Second

// AnnotationAddress, on the hold lease, is where the leading replica
// serves (ip:port), for the replicas that stand by to forward to.
const AnnotationAddress = "sandgate.io/address"

// AnnotationRelays, on the hold lease, says the leading replica answers
// the replicas that relay preview connections themselves (its internal
// relay routes): its value is the holder's identity, so that a leader
// of an earlier version, which keeps the annotation it found, does not
// seem to. A replica standing by relays them only then, and forwards
// them to a leader of an earlier version, as in a rolling update.
const AnnotationRelays = "sandgate.io/relays"

// AnnotationRelayExec, on the hold lease, says the same of what goes
// through the Pod exec API, the sessions' shells and commands: the
// leader admits those a replica carries (its value, too, is the
// holder's identity). A leader of the version before admits only
// preview connections.
const AnnotationRelayExec = "sandgate.io/relay-exec"

// AnnotationRelayFiles, on the hold lease, says the same of the
// sessions' file uploads and downloads (its value, too, is the
// holder's identity): the leader records their events as its own, and
// stores an upload's before it answers the report.
const AnnotationRelayFiles = "sandgate.io/relay-files"

// AnnotationRelayActions, on the hold lease, says the same of the
// sessions' actions and screenshots (its value, too, is the holder's
// identity).
const AnnotationRelayActions = "sandgate.io/relay-actions"

// AnnotationRelaySnapshots, on the hold lease, says the same of the
// sessions' workspace snapshots (its value, too, is the holder's
// identity): the leader records a snapshot_saved a replica reports.
const AnnotationRelaySnapshots = "sandgate.io/relay-snapshots"

// AnnotationAdoptsAlone, on the hold lease, says the leading replica
// adopts the sessions a replica standing by created while no leader
// answered, and leaves those still starting to their creator (its
// value, too, is the holder's identity). A replica creates sessions
// alone only when the last leader said so: a leader of an earlier
// version would remove one still starting, and never adopt one made
// after it took over.
const AnnotationAdoptsAlone = "sandgate.io/adopts-alone"

// Hold takes the namespace's hold for identity, which serves at address
// ("" when no other replica can reach it). With wait > 0, a holder
// that renews for that long keeps it and Hold fails naming it; with
// wait 0, Hold waits until the hold is free, for as long as ctx lasts
// (a replica standing by). The hold is then renewed until keep ends,
// when it is given back; lost is called if it is lost meanwhile (another
// replica took it, or it could not be renewed in time), and must stop
// this gateway's work. The returned channel is closed once the hold has
// been given back (or the attempt failed), after keep ends: a gateway
// waits for it before it exits, so the next one need not wait for the
// hold to run out.
func (b *Backend) Hold(ctx, keep context.Context, identity, address string, wait time.Duration, log *slog.Logger, lost func()) (<-chan struct{}, error) {
	l := &Leases{Client: b.client, Namespace: b.cfg.Namespace, Identity: identity, Duration: holdDuration,
		Annotations: map[string]string{AnnotationAddress: address, AnnotationRelays: identity, AnnotationRelayExec: identity, AnnotationRelayFiles: identity,
			AnnotationRelayActions: identity, AnnotationRelaySnapshots: identity, AnnotationAdoptsAlone: identity}}
	deadline := time.Now().Add(wait)
	said := ""
	var sent time.Time // when the acquisition that succeeded was sent
	for {
		sent = time.Now()
		held, holder, err := l.Acquire(ctx, HoldLease, "gateway")
		if err != nil && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil {
			if wait > 0 {
				return nil, fmt.Errorf("the namespace's gateway lease: %w", err)
			}
			log.Warn("cannot read the namespace's gateway lease; trying again", "err", err)
		} else if held {
			break
		} else if wait > 0 && time.Now().After(deadline) {
			return nil, fmt.Errorf("another gateway (%s) runs the sessions of namespace %s, and this one has no address to stand by at (kubernetes.advertise)", holder, b.cfg.Namespace)
		} else if holder != said {
			log.Info("standing by: another replica leads the namespace", "leader", holder, "namespace", b.cfg.Namespace)
			said = holder
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	log.Info("leading the namespace's sessions", "namespace", b.cfg.Namespace, "identity", identity)
	released := make(chan struct{})
	go func() {
		defer close(released)
		giveUp := time.NewTimer(time.Until(sent.Add(renewDeadline())))
		defer giveUp.Stop()
		next := time.NewTimer(holdDuration / 3)
		defer next.Stop()
		for {
			select {
			case <-keep.Done():
				rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				l.Release(rctx, HoldLease)
				cancel()
				return
			case <-giveUp.C:
				log.Error("could not renew the namespace's gateway lease in time: stopping, before another replica takes over", "namespace", b.cfg.Namespace)
				lost()
				<-keep.Done() // not ours to give back
				return
			case <-next.C:
			}
			at := time.Now()
			left := time.Until(sent.Add(renewDeadline()))
			if left <= 0 {
				continue // giveUp fires
			}
			rctx, cancel := context.WithTimeout(keep, min(left, holdDuration/3))
			err := l.Renew(rctx, HoldLease)
			cancel()
			switch {
			case err == nil:
				sent = at
				giveUp.Reset(time.Until(sent.Add(renewDeadline())))
				next.Reset(holdDuration / 3)
			case errors.Is(err, ErrLeaseLost):
				log.Error("lost the namespace's gateway lease to another replica: stopping", "namespace", b.cfg.Namespace)
				lost()
				<-keep.Done()
				return
			case keep.Err() != nil:
				next.Reset(0) // ending: the release above
			default:
				log.Warn("could not renew the namespace's gateway lease; trying again", "err", err)
				next.Reset(renewRetry)
			}
		}
	}()
	return released, nil
}

// Leader reads the namespace's hold: the identity of the replica that
// leads and the address it serves at; both empty when nobody holds it,
// or when the holder has not renewed the hold within its duration (by
// this machine's clock): a replica that stopped renewing may be dead,
// and its address someone else's by now.
func (b *Backend) Leader(ctx context.Context) (identity, address string, err error) {
	l, err := b.ReadLead(ctx)
	return l.Identity, l.Address, err
}

// Lead is the namespace's hold as a replica reads it (ReadLead).
type Lead struct {
	Identity, Address string
	// Relays: the leader answers replicas that relay preview
	// connections (AnnotationRelays).
	Relays bool
	// Exec: it admits the shells and commands such replicas carry
	// (AnnotationRelayExec).
	Exec bool
	// Files: it admits the file uploads and downloads they carry
	// (AnnotationRelayFiles).
	Files bool
	// Actions: it admits the actions and screenshots they carry
	// (AnnotationRelayActions).
	Actions bool
	// Snapshots: it admits the workspace snapshots they take
	// (AnnotationRelaySnapshots).
	Snapshots bool
}

// ReadLead reads the namespace's hold as Leader does, with whether the
// leader answers relaying replicas.
func (b *Backend) ReadLead(ctx context.Context) (Lead, error) {
	le, err := b.client.CoordinationV1().Leases(b.cfg.Namespace).Get(ctx, HoldLease, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Lead{}, nil
	}
	if err != nil {
		return Lead{}, err
	}
	renewed := le.Spec.RenewTime
	d := time.Duration(deref(le.Spec.LeaseDurationSeconds)) * time.Second
	if renewed == nil || time.Since(renewed.Time) > d {
		return Lead{}, nil
	}
	holder := deref(le.Spec.HolderIdentity)
	return Lead{Identity: holder, Address: le.Annotations[AnnotationAddress],
		Relays:    holder != "" && le.Annotations[AnnotationRelays] == holder,
		Exec:      holder != "" && le.Annotations[AnnotationRelayExec] == holder,
		Files:     holder != "" && le.Annotations[AnnotationRelayFiles] == holder,
		Actions:   holder != "" && le.Annotations[AnnotationRelayActions] == holder,
		Snapshots: holder != "" && le.Annotations[AnnotationRelaySnapshots] == holder}, nil
}

// Identity names one run of a gateway replica in Pod pod, whose UID
// is uid: the Pod's name and UID (without its dashes), the process's id
// and a random word of 8 hex digits. The next run of the replica's
// container (it was SIGKILLed, or ran out of memory) tells its
// predecessor's leases by it (Predecessor, FreeDeadHold). A replica in
// no Pod (uid "") is named by its host's name, pid and word alone.
func Identity(pod, uid string, pid int, word string) string {
	if uid == "" {
		return fmt.Sprintf("%s-%d-%s", pod, pid, word)
	}
	return fmt.Sprintf("%s-%s-%d-%s", pod, strings.ReplaceAll(uid, "-", ""), pid, word)
}

// Predecessor reports whether holder names an earlier run than
// identity in the Pod of that name and UID: the Pod's name and UID,
// then "-<pid>-<8 hex digits>", and not identity itself. A Pod's UID is
// its own for good (a Pod made again under the same name has another),
// and the kubelet starts a container's next run only once the last
// one's processes are gone: such a run is dead once this one runs in
// the Pod.
func Predecessor(pod, uid, holder, identity string) bool {
	if uid == "" {
		return false
	}
	rest, ok := strings.CutPrefix(holder, pod+"-"+strings.ReplaceAll(uid, "-", "")+"-")
	if !ok || holder == identity {
		return false
	}
	pid, word, ok := strings.Cut(rest, "-")
	if !ok || pid == "" || len(word) != 8 {
		return false
	}
	for _, c := range pid {
		if c < '0' || c > '9' {
			return false
		}
	}
	for _, c := range word {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// deadGrace: the hold of a dead run is given back once it has not been
// renewed for this long, so that what that run sent just before it died
// (a Pod's create, a trail's upload) has landed before another replica
// adopts its sessions.
const deadGrace = 2 * time.Second

// FreeDeadHold gives the namespace's hold back when an earlier run of
// this replica, in the same Pod (name and UID) and serving at the same
// address, holds it: that run is dead (its container restarted), so
// nobody need wait for its hold to run out before leading. It waits
// until the hold is deadGrace old. It returns the identity it freed, ""
// when it freed nothing. The caller must hold a listener on address's
// port already. The delete is conditional on the version read, so a
// hold renewed or taken meanwhile is left alone.
func (b *Backend) FreeDeadHold(ctx context.Context, pod, uid, identity, address string) (string, error) {
	leases := b.client.CoordinationV1().Leases(b.cfg.Namespace)
	le, err := leases.Get(ctx, HoldLease, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	holder := deref(le.Spec.HolderIdentity)
	if !Predecessor(pod, uid, holder, identity) || address == "" || le.Annotations[AnnotationAddress] != address {
		return "", nil
	}
	if r := le.Spec.RenewTime; r != nil {
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Until(r.Add(deadGrace))):
		}
	}
	rv := le.ResourceVersion
	err = leases.Delete(ctx, HoldLease, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return "", nil // given back, renewed or taken meanwhile
	}
	if err != nil {
		return "", err
	}
	return holder, nil
}
