package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LabelGatewayRole is on the Pod of the gateway replica that leads the
// namespace, with the value RoleLeader: it tells an operator (and the
// tests) which replica leads, and goes with the leader's higher
// deletion cost. (The API's Service sends to every replica that is
// ready: one standing by forwards to the leader; the egress proxy's
// Service to every replica: each serves the sessions' egress.)
const (
	LabelGatewayRole = "sandgate.io/gateway-role"
	RoleLeader       = "leader"
)

// annDeletionCost, on the leader's Pod, makes its ReplicaSet remove the
// replicas that stand by first (a rolling update, a scale down): the
// sessions change hands once, not at every step.
const (
	annDeletionCost = "controller.kubernetes.io/pod-deletion-cost"
	leaderCost      = "1000"
)

// MarkLeader labels pod, this replica's own, as the namespace's leader,
// then takes the label off every other Pod that has it: the Pod of a
// replica that led before (dead, or restarted to stand by). It refuses
// a session's Pod: the proxy's traffic must never go there.
func (b *Backend) MarkLeader(ctx context.Context, pod string) error {
	if err := b.setRole(ctx, pod, true); err != nil {
		return err
	}
	pods := b.client.CoreV1().Pods(b.cfg.Namespace)
	l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: LabelGatewayRole + "=" + RoleLeader})
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range l.Items {
		if p.Name != pod {
			errs = append(errs, b.setRole(ctx, p.Name, false))
		}
	}
	return errors.Join(errs...)
}

// Unmark takes the leader's label off pod: a replica that stands by, in
// a Pod whose container led before it restarted, or one that stops
// leading.
func (b *Backend) Unmark(ctx context.Context, pod string) error {
	return b.setRole(ctx, pod, false)
}

// CheckPod says whether pod can be a gateway replica's own: it exists,
// and it is no session's. It returns the Pod's UID (see Identity).
func (b *Backend) CheckPod(ctx context.Context, pod string) (uid string, err error) {
	p, err := b.client.CoreV1().Pods(b.cfg.Namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("this gateway's Pod %s in namespace %s: %w", pod, b.cfg.Namespace, err)
	}
	if isSessionPod(p.Labels) {
		return "", fmt.Errorf("pod %s is a session's, not a gateway replica's", pod)
	}
	return string(p.UID), nil
}

func isSessionPod(labels map[string]string) bool {
	return labels[LabelManaged] == managedBy || labels[LabelSession] != ""
}

func (b *Backend) setRole(ctx context.Context, name string, leader bool) error {
	err := b.updateGatewayPod(ctx, name, func(p *corev1.Pod) bool {
		isLeader := p.Labels[LabelGatewayRole] == RoleLeader && p.Annotations[annDeletionCost] == leaderCost
		_, labelled := p.Labels[LabelGatewayRole]
		_, costed := p.Annotations[annDeletionCost]
		if leader && isLeader || !leader && !labelled && !costed {
			return false
		}
		if leader {
			p.Labels[LabelGatewayRole] = RoleLeader
			p.Annotations[annDeletionCost] = leaderCost
		} else {
			delete(p.Labels, LabelGatewayRole)
			delete(p.Annotations, annDeletionCost)
		}
		return true
	})
	if apierrors.IsNotFound(err) && !leader {
		return nil // gone: nothing to take off
	}
	return err
}

// Role keeps the leader's label right on a gateway replica's own Pod:
// off while the replica stands by (a container that led in the Pod and
// restarted may have left it on), on while it leads, off again once it
// stops leading. Each change is tried again until it succeeds or the
// next change replaces it; the next one waits for it to have given way.
// A nil Role (no Pod named) does nothing.
type Role struct {
	ctx  context.Context // the replica's hold
	pod  string
	log  *slog.Logger
	stop context.CancelFunc // the change under way
	done chan struct{}      // closed once it has ended
}

// NewRole keeps the label on pod for as long as ctx lasts.
func NewRole(ctx context.Context, pod string, log *slog.Logger) *Role {
	return &Role{ctx: ctx, pod: pod, log: log}
}

// StandBy takes the label off the Pod, in the background.
func (r *Role) StandBy(b *Backend) {
	if r != nil {
		r.change("take the leader's label off this replica's Pod", b.Unmark)
	}
}

// Lead labels the Pod as the leader's, in the background, once the
// change under way has given way.
func (r *Role) Lead(b *Backend) {
	if r != nil {
		r.change("label this replica's Pod as the leader", b.MarkLeader)
	}
}

// StepDown ends the change under way and takes the label off, trying
// for a few seconds: a replica that stops leading.
func (r *Role) StepDown(b *Backend) {
	if r == nil {
		return
	}
	r.end()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 5*time.Second)
	defer cancel()
	if err := b.Unmark(ctx, r.pod); err != nil {
		r.log.Warn("cannot take the leader's label off this replica's Pod; the next leader will", "err", err)
	}
}

func (r *Role) change(what string, do func(context.Context, string) error) {
	prevStop, prevDone := r.stop, r.done
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	r.stop, r.done = cancel, done
	if prevStop != nil {
		prevStop()
	}
	go func() {
		defer close(done)
		if prevDone != nil {
			<-prevDone
		}
		keepTrying(ctx, r.log, what, func(ctx context.Context) error { return do(ctx, r.pod) })
	}()
}

func (r *Role) end() {
	if r.stop != nil {
		r.stop()
		<-r.done
	}
}

// keepTrying runs do until it succeeds or ctx ends, from 2 s apart up
// to a minute, saying so when it fails.
func keepTrying(ctx context.Context, log *slog.Logger, what string, do func(context.Context) error) {
	for pause := 2 * time.Second; ; pause = min(2*pause, time.Minute) {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := do(dctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return
		}
		log.Warn("cannot "+what+"; trying again", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
	}
}
