//go:build tools

// Package build pins the Kubernetes programs the cluster tests run, so
// `go build` builds them at the version in go.mod: see ../cluster.sh.
package build

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
