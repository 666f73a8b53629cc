package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// admissionLease names the Lease the creates made while no leader
// answers take in turn (session.Alone.Lock): each counts the sessions
// and makes its Pod while it holds it, so that two cannot both take a
// tenant's last slot, whichever replica makes them. It is held for
// that moment only, renewed meanwhile, and removed as it is given back;
// one whose holder died runs out after admissionHold.
const admissionLease = "sandgate-admission"

// admissionHold is how long the lease holds without a renewal (its
// holder renews it every third of that); admissionWait how long a
// create waits for it at most (a dead holder's lease runs out
// meanwhile).
const (
	admissionHold = 10 * time.Second
	admissionWait = admissionHold + 5*time.Second
)

// LockAdmission takes the admission lease for one create of replica
// identity, waiting while another create holds it (within ctx, and at
// most admissionWait), and renews it until unlock gives it back. Each
// call holds it under a name of its own (identity and a random word),
// so that two creates of one replica exclude each other too. lost says whether another create took the lease over meanwhile (this
// one could not renew it in time): what it counted may be stale.
func (b *Backend) LockAdmission(ctx context.Context, identity string, log *slog.Logger) (unlock func(), lost func() bool, err error) {
	return b.lockAdmission(ctx, identity, admissionHold, admissionWait, log)
}

func (b *Backend) lockAdmission(ctx context.Context, identity string, hold, wait time.Duration, log *slog.Logger) (unlock func(), lost func() bool, err error) {
	var word [4]byte
	rand.Read(word[:])
	l := &Leases{Client: b.client, Namespace: b.cfg.Namespace, Identity: identity + "/" + hex.EncodeToString(word[:]), Duration: hold}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for pause := 20 * time.Millisecond; ; pause = min(2*pause, 250*time.Millisecond) {
		held, holder, err := l.Acquire(wctx, admissionLease, "admission")
		if err == nil && held {
			break
		}
		select {
		case <-wctx.Done():
			if err == nil {
				err = fmt.Errorf("held by %s", holder)
			}
			return nil, nil, fmt.Errorf("the replicas' admission lease: %w (%v)", err, wctx.Err())
		case <-time.After(pause):
		}
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	// taken: another took the lease over; renewed: when the last
	// renewal that succeeded was sent (the take, first). One not
	// renewed for hold may be another's by now, whatever this one saw.
	var taken atomic.Bool
	var renewed atomic.Int64
	renewed.Store(time.Now().UnixNano())
	go func() {
		defer close(stopped)
		tick := time.NewTicker(hold / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			sent := time.Now()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), hold/3)
			err := l.Renew(rctx, admissionLease)
			cancel()
			if err == nil {
				renewed.Store(sent.UnixNano())
			}
			if errors.Is(err, ErrLeaseLost) {
				taken.Store(true)
				log.Warn("the replicas' admission lease was taken over while this create held it", "holder", l.Identity)
				return
			}
		}
	}()
	return func() {
			close(stop)
			<-stopped
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			// One not given back runs out after hold.
			l.Release(rctx, admissionLease)
		}, func() bool {
			return taken.Load() || time.Since(time.Unix(0, renewed.Load())) >= hold
		}, nil
}

// AdoptsAlone says whether the namespace's last leader, dead or alive,
// adopts the sessions created while no leader answered
// (AnnotationAdoptsAlone): read from the hold lease as it is, expired
// or not.
func (b *Backend) AdoptsAlone(ctx context.Context) (bool, error) {
	le, err := b.client.CoordinationV1().Leases(b.cfg.Namespace).Get(ctx, HoldLease, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	holder := deref(le.Spec.HolderIdentity)
	return holder != "" && le.Annotations[AnnotationAdoptsAlone] == holder, nil
}
