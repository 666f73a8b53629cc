package kube

import (
	"context"
	"fmt"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Isolation says which directions of session Pods' traffic some
// NetworkPolicy of the namespace governs: a Pod no policy selects for a
// direction is open in it. Whether the cluster enforces the policies is
// beyond what the API can tell.
type Isolation struct {
	Ingress, Egress bool
}

// Isolation reads the namespace's NetworkPolicies and reports those
// that select the labels every session Pod has. It tells whether a
// policy governs them, not what it allows (one allowing everything
// counts), and a policy that needs more of a Pod than those labels (a
// tenant's) is counted as if it held for all.
func (b *Backend) Isolation(ctx context.Context) (Isolation, error) {
	list, err := b.client.NetworkingV1().NetworkPolicies(b.cfg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return Isolation{}, fmt.Errorf("network policies of %s: %w", b.cfg.Namespace, err)
	}
	// The labels every session Pod has, whatever its session.
	pod := labels.Set{LabelManaged: managedBy}
	var iso Isolation
	for _, np := range list.Items {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(pod) {
			continue
		}
		in, out := policyTypes(np)
		iso.Ingress = iso.Ingress || in
		iso.Egress = iso.Egress || out
	}
	return iso, nil
}

// policyTypes are the directions a policy governs, defaulted as the API
// defines: Ingress always, Egress when it has egress rules.
func policyTypes(np networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(np.Spec.PolicyTypes) == 0 {
		return true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}
