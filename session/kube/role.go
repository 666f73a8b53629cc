package kube

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// LabelGatewayRole is on the Pod of the gateway replica that leads the
// namespace, with the value RoleLeader. The egress proxy's Service
// selects it: the proxy knows a session by the address its connection
// comes from, which a replica standing by would hide if it forwarded
// the connection, so the proxy's traffic must go to the leader itself.
// (The API's Service sends to every replica that is ready: one standing
// by forwards to the leader.)
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
// and it is no session's.
func (b *Backend) CheckPod(ctx context.Context, pod string) error {
	p, err := b.client.CoreV1().Pods(b.cfg.Namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("this gateway's Pod %s in namespace %s: %w", pod, b.cfg.Namespace, err)
	}
	if isSessionPod(p.Labels) {
		return fmt.Errorf("pod %s is a session's, not a gateway replica's", pod)
	}
	return nil
}

func isSessionPod(labels map[string]string) bool {
	return labels[LabelManaged] == managedBy || labels[LabelSession] != ""
}

func (b *Backend) setRole(ctx context.Context, name string, leader bool) error {
	pods := b.client.CoreV1().Pods(b.cfg.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && !leader {
			return nil // gone: nothing to take off
		}
		if err != nil {
			return err
		}
		if isSessionPod(p.Labels) {
			return fmt.Errorf("pod %s is a session's, not a gateway replica's", name)
		}
		isLeader := p.Labels[LabelGatewayRole] == RoleLeader && p.Annotations[annDeletionCost] == leaderCost
		_, labelled := p.Labels[LabelGatewayRole]
		_, costed := p.Annotations[annDeletionCost]
		if leader && isLeader || !leader && !labelled && !costed {
			return nil
		}
		if leader {
			if p.Labels == nil {
				p.Labels = map[string]string{}
			}
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Labels[LabelGatewayRole] = RoleLeader
			p.Annotations[annDeletionCost] = leaderCost
		} else {
			delete(p.Labels, LabelGatewayRole)
			delete(p.Annotations, annDeletionCost)
		}
		_, err = pods.Update(ctx, p, metav1.UpdateOptions{})
		return err
	})
}
