//go:build tools

// Package proxy pins kube-proxy at the cluster's version: the trial
// cluster's Services (see ../../cluster.sh). Its own module, so that
// its build is cached apart from the other programs'.
package proxy

import _ "k8s.io/kubernetes/cmd/kube-proxy"
