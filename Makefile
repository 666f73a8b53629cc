# Sandgate. Both targets run as root on Debian bookworm and install what
# they need themselves (deploy/setup.sh).
export PATH := /usr/local/go/bin:$(PATH)

.PHONY: up test bench build

up:
	deploy/up.sh

build:
	go build -o bin/sandgate ./cmd/sandgate

# Unit tests, then the end-to-end suite against real containerd, Chromium
# and MinIO.
test:
	deploy/setup.sh
	cd test/node && npm ci --no-audit --no-fund --loglevel=error
	go vet ./...
	SANDGATE_E2E=1 go test -count=1 -timeout 40m ./...

# Benchmarks: cold start and CDP round trip, each beside its baseline.
bench:
	deploy/setup.sh
	SANDGATE_E2E=1 go test -count=1 -timeout 40m -run '^$$' -bench ColdStart -benchtime 10x ./test/
	SANDGATE_E2E=1 go test -count=1 -timeout 40m -run '^$$' -bench CDPRoundTrip -benchtime 2000x ./test/
