# Sandgate. Both targets run as root on Debian bookworm and install what
# they need themselves (deploy/setup.sh).
export PATH := /usr/local/go/bin:$(PATH)
# bash for pipefail: a test run piped through test/failures keeps its status.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

.PHONY: up test bench load build viewer

up:
	deploy/up.sh

build:
	go build -o bin/sandgate ./cmd/sandgate

# Unit tests, then the end-to-end suite against real containerd, Chromium
# and MinIO.
test:
	deploy/setup.sh
	# The single-node cluster the Kubernetes backend's tests run on
	# (binaries cached by version; about 18 minutes the first time).
	deploy/kubernetes/cluster.sh build
	cd test/node && npm ci --no-audit --no-fund --loglevel=error
	cd examples/node && npm ci --no-audit --no-fund --loglevel=error
	cd sdk/typescript && npm ci --no-audit --no-fund --loglevel=error && npx tsc --noEmit -p .
	go vet ./...
	# Every package but the end-to-end suite (a listed set once missed
	# mcpserver, sdk and ids).
	go test -count=1 $$(go list ./... | grep -v '/test$$')
	# -json through test/failures: printed as -v prints it (every skip
	# with its reason: Kata, where it is not installed), and the failed
	# tests' output repeated at the very end, where a CI log cut to its
	# tail still shows it.
	go build -o /tmp/sandgate-failures ./test/failures
	SANDGATE_E2E=1 go test -count=1 -json -timeout 75m ./test/ 2>&1 | /tmp/sandgate-failures

# Benchmarks, each beside its baseline: cold start, CDP round trip, VNC
# frames, action round trip, exec, runtimes, page loads through the egress
# proxy, what recording costs.
bench:
	deploy/setup.sh
	SANDGATE_E2E=1 go test -count=1 -timeout 40m -run '^$$' -bench ColdStart -benchtime 10x ./test/
	# gVisor's own floor under a cold start: a bare runsc sandbox's Chromium.
	SANDGATE_E2E=1 go test -count=1 -timeout 40m -run '^$$' -bench GVisorFloor -benchtime 5x ./test/
	SANDGATE_E2E=1 go test -count=1 -timeout 40m -run '^$$' -bench CDPRoundTrip -benchtime 2000x ./test/
	SANDGATE_E2E=1 go test -count=1 -timeout 40m -run '^$$' -bench VNC -benchtime 200x ./test/
	SANDGATE_E2E=1 go test -count=1 -timeout 40m -run '^$$' -bench ActionRoundTrip -benchtime 30x ./test/
	SANDGATE_E2E=1 go test -count=1 -timeout 40m -run '^$$' -bench Exec -benchtime 50x ./test/
	SANDGATE_E2E=1 go test -count=1 -timeout 40m -run '^$$' -bench Runtimes -benchtime 5x ./test/
	SANDGATE_E2E=1 go test -count=1 -timeout 40m -run '^$$' -bench EgressPageLoad -benchtime 20x ./test/
	SANDGATE_E2E=1 go test -count=1 -timeout 40m -run '^$$' -bench Recording -benchtime 1x ./test/
	# Two replicas on the trial cluster: CDP, shell and exec round trips
	# through the leader and through a replica that stands by.
	SANDGATE_E2E=1 go test -count=1 -timeout 40m -run '^$$' -bench KubeRelay -benchtime 200x ./test/

# Issue 15's load and soak run (about 40 minutes; see test/load_test.go
# for its knobs): 20 sessions, 200 CDP clients, 10 VNC viewers for 5
# minutes, then 30 minutes of create, drive, delete cycles.
load:
	deploy/setup.sh
	SANDGATE_E2E=1 SANDGATE_LOAD=1 go test -count=1 -v -timeout 80m -run 'TestLoadAndSoak' ./test/

# Rebuild the viewer's noVNC bundle (committed, embedded in the binary)
# from the pinned npm packages.
viewer:
	cd gateway/viewer && npm ci --no-audit --no-fund && npm run build
