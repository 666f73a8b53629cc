package kube

import (
	"context"
	"fmt"
	"time"
)

// admissionLease names the Lease the replicas that create sessions while
// no leader answers take in turn (session.Alone.Lock): each counts the
// sessions and makes its Pod while it holds it, so that two cannot both
// take a tenant's last slot. It is held for that moment only, and
// removed as it is given back; one whose holder died runs out after
// admissionHold.
const admissionLease = "sandgate-admission"

// admissionHold is how long the lease holds without its holder giving it
// back; admissionWait how long a replica waits for it at most (a dead
// holder's lease runs out meanwhile).
const (
	admissionHold = 10 * time.Second
	admissionWait = admissionHold + 5*time.Second
)

// LockAdmission takes the replicas' admission lease for identity,
// waiting for it while another replica holds it (within ctx, and at
// most admissionWait); unlock gives it back.
func (b *Backend) LockAdmission(ctx context.Context, identity string) (unlock func(), err error) {
	l := &Leases{Client: b.client, Namespace: b.cfg.Namespace, Identity: identity, Duration: admissionHold}
	ctx, cancel := context.WithTimeout(ctx, admissionWait)
	defer cancel()
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		held, holder, err := l.Acquire(ctx, admissionLease, "admission")
		if err == nil && held {
			return func() {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				// One not given back runs out after admissionHold.
				l.Release(rctx, admissionLease)
			}, nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("held by %s", holder)
			}
			return nil, fmt.Errorf("the replicas' admission lease: %w (%v)", err, ctx.Err())
		case <-time.After(wait):
		}
	}
}
