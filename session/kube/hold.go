package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// HoldLease names the Lease a gateway holds over its namespace's
// sessions. Until gateway replicas share their state (revocations,
// trails, recordings), one gateway at a time may run a namespace's
// sessions: a second one would adopt the first one's Pods and remove
// the ones still starting.
const HoldLease = "sandgate-gateway"

// HoldDuration is how long the hold lasts without a renewal; a gateway
// renews it every third of that.
const HoldDuration = 10 * time.Second

// Hold takes the namespace's hold for identity, waiting up to wait for a
// holder that stopped renewing (a gateway that was killed) to run out;
// a holder that renews keeps it, and Hold fails naming it. The hold is
// then renewed until ctx ends, when it is given back; lost is called if
// it is lost meanwhile (this gateway was too slow to renew and another
// took it), and must stop this gateway's work.
func (b *Backend) Hold(ctx context.Context, identity string, wait time.Duration, log *slog.Logger, lost func()) error {
	l := &Leases{Client: b.client, Namespace: b.cfg.Namespace, Identity: identity, Duration: HoldDuration}
	deadline := time.Now().Add(wait)
	for {
		held, holder, err := l.Acquire(ctx, HoldLease, "gateway")
		if err != nil {
			return fmt.Errorf("the namespace's gateway lease: %w", err)
		}
		if held {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("another gateway (%s) runs the sessions of namespace %s: one gateway per namespace for now", holder, b.cfg.Namespace)
		}
		log.Info("waiting for the namespace's gateway lease", "holder", holder, "namespace", b.cfg.Namespace)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	go func() {
		tick := time.NewTicker(HoldDuration / 3)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				l.Release(rctx, HoldLease)
				cancel()
				return
			case <-tick.C:
			}
			rctx, cancel := context.WithTimeout(ctx, HoldDuration/3)
			err := l.Renew(rctx, HoldLease)
			cancel()
			if errors.Is(err, ErrLeaseLost) {
				log.Error("lost the namespace's gateway lease to another gateway: stopping", "namespace", b.cfg.Namespace)
				lost()
				return
			}
			if err != nil && ctx.Err() == nil {
				log.Warn("could not renew the namespace's gateway lease", "err", err)
			}
		}
	}()
	return nil
}
