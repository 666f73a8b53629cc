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

// MarkLeader labels pod, this replica's own, as the namespace's leader,
// then takes the label off every other Pod that has it: the Pod of a
// replica that led before (dead, or restarted to stand by). It refuses
// a session's Pod: the proxy's traffic must never go there.
func (b *Backend) MarkLeader(ctx context.Context, pod string) error {
	if err := b.setRole(ctx, pod, true); err != nil {
		return err
	}
	pods := b.client.CoreV1().Pods(b.cfg.Namespace)
	l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: LabelGatewayRole})
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
// a Pod whose container led before it restarted.
func (b *Backend) Unmark(ctx context.Context, pod string) error {
	return b.setRole(ctx, pod, false)
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
		if p.Labels[LabelManaged] == managedBy || p.Labels[LabelSession] != "" {
			return fmt.Errorf("pod %s is a session's, not a gateway replica's", name)
		}
		_, has := p.Labels[LabelGatewayRole]
		if has == leader && (!leader || p.Labels[LabelGatewayRole] == RoleLeader) {
			return nil
		}
		if leader {
			if p.Labels == nil {
				p.Labels = map[string]string{}
			}
			p.Labels[LabelGatewayRole] = RoleLeader
		} else {
			delete(p.Labels, LabelGatewayRole)
		}
		_, err = pods.Update(ctx, p, metav1.UpdateOptions{})
		return err
	})
}
