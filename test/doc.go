// Package test holds the end-to-end tests: the sandgate binary against a
// real containerd, real Chromium sessions and a real MinIO server. They run
// under `make test` (SANDGATE_E2E=1, as root); without it they skip.
package test
