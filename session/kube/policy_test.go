package kube

import (
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
)

// TestPolicyTypes: a policy without policyTypes governs ingress, and
// egress only when it has egress rules, as the API defines.
func TestPolicyTypes(t *testing.T) {
	egressRule := []networkingv1.NetworkPolicyEgressRule{{}}
	for _, c := range []struct {
		name    string
		spec    networkingv1.NetworkPolicySpec
		in, out bool
	}{
		{"no types, no rules", networkingv1.NetworkPolicySpec{}, true, false},
		{"no types, egress rules", networkingv1.NetworkPolicySpec{Egress: egressRule}, true, true},
		{"egress only", networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}, false, true},
		{"both", networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}}, true, true},
	} {
		in, out := policyTypes(networkingv1.NetworkPolicy{Spec: c.spec})
		if in != c.in || out != c.out {
			t.Errorf("%s: ingress %v egress %v, want %v %v", c.name, in, out, c.in, c.out)
		}
	}
}
