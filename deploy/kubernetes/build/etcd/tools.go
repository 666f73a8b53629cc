//go:build tools

// Package etcd pins the etcd server the test cluster runs: see
// ../../cluster.sh. (go install refuses etcd's module directly: its
// go.mod has replace directives.)
package etcd

import _ "go.etcd.io/etcd/server/v3"
