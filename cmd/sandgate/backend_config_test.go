package main

import (
	"strings"
	"testing"
)

// TestBackendConfig: containerd by default; kubernetes with its
// namespace, the RuntimeClasses it was given on top of the defaults; and
// what the kubernetes backend cannot honour refused with the reason.
func TestBackendConfig(t *testing.T) {
	c, err := loadConfig(t, "")
	if err != nil || c.Backend != "containerd" {
		t.Fatalf("default backend %q, %v", c.Backend, err)
	}
	c, err = loadConfig(t, `, "backend": "kubernetes", "kubernetes": {"namespace": "sandgate", "runtime_classes": {"runc": "dev-runc"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if rc := c.Kubernetes.RuntimeClasses; rc["runc"] != "dev-runc" || rc["gvisor"] != "gvisor" || rc["kata"] != "kata" || c.Kubernetes.PullPolicy != "IfNotPresent" {
		t.Fatalf("kubernetes defaults: %+v", c.Kubernetes)
	}
	c, err = loadConfig(t, `, "backend": "kubernetes", "kubernetes": {"namespace": "s"}, "egress": {"listen": ":3128", "advertise": "10.96.0.12:3128"}`)
	if err != nil || proxyURL(c) != "http://10.96.0.12:3128" {
		t.Fatalf("kubernetes with an egress proxy: %v, %q", err, proxyURL(c))
	}
	if c, err := loadConfig(t, `, "backend": "kubernetes", "kubernetes": {"namespace": "s", "pod": "sandgate-gateway-7d9c-x2k"}`); err != nil || c.Kubernetes.Pod != "sandgate-gateway-7d9c-x2k" {
		t.Errorf("a gateway's own Pod: %v", err)
	}
	if c, err := loadConfig(t, `, "backend": "kubernetes", "kubernetes": {"namespace": "s", "advertise": "10.244.0.7:8080"}`); err != nil || c.Kubernetes.Advertise != "10.244.0.7:8080" {
		t.Fatalf("kubernetes with a replica's address: %v", err)
	}
	if _, err := loadConfig(t, `, "backend": "kubernetes", "kubernetes": {"namespace": "s"}, "pools": [{"size": 1}]`); err != nil {
		t.Fatalf("a warm pool under kubernetes: %v", err)
	}
	if c, err := loadConfig(t, ""); err != nil || proxyURL(c) != "" {
		t.Fatalf("containerd: proxy URL %q, %v (its sessions are told the bridge's address)", proxyURL(c), err)
	}
	for extra, want := range map[string]string{
		`, "backend": "nomad"`:      "not one of containerd, kubernetes",
		`, "backend": "kubernetes"`: "kubernetes.namespace is required",
		`, "backend": "kubernetes", "kubernetes": {"namespace": "s", "pull_policy": "Sometimes"}`:                                    "pull_policy",
		`, "backend": "kubernetes", "kubernetes": {"namespace": "s"}, "pools": [{"size": 1}], "pool_limits": {"freeze": true}`:       "freeze needs backend containerd",
		`, "egress": {"listen": ":3128", "advertise": "10.0.0.1:3128"}`:                                                              "for backend kubernetes",
		`, "backend": "kubernetes", "kubernetes": {"namespace": "s"}, "egress": {"listen": ":3128"}`:                                 "go together",
		`, "backend": "kubernetes", "kubernetes": {"namespace": "s"}, "egress": {"listen": ":3128", "advertise": "proxy.svc:3128"}`:  "not ip:port",
		`, "backend": "kubernetes", "kubernetes": {"namespace": "s"}, "egress": {"listen": ":3128", "advertise": "0.0.0.0:3128"}`:    "can reach",
		`, "backend": "kubernetes", "kubernetes": {"namespace": "s"}, "egress": {"listen": "nowhere", "advertise": "10.0.0.1:3128"}`: "egress.listen",
		`, "kubernetes": {"advertise": "10.0.0.1:8080"}`:                                                                             "for backend kubernetes",
		`, "backend": "kubernetes", "kubernetes": {"namespace": "s", "advertise": "gateway:8080"}`:                                   "not ip:port",
		`, "backend": "kubernetes", "kubernetes": {"namespace": "s", "advertise": "10.0.0.1:0"}`:                                     "can reach",
		`, "kubernetes": {"pod": "sandgate-gateway-0"}`:                                                                              "for backend kubernetes",
		`, "backend": "kubernetes", "kubernetes": {"namespace": "s", "pod": "Gateway_0"}`:                                            "not a Pod's name",
	} {
		if _, err := loadConfig(t, extra); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %q", extra, err, want)
		}
	}
}
