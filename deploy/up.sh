#!/bin/bash
# up.sh: set up this host and run Sandgate in the foreground: containerd,
# MinIO (a separate server process) and the gateway. Prints a development
# API key and an example the first time.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${SANDGATE_CACHE:-/var/cache/sandgate}
LOGS=${SANDGATE_LOGS:-/var/log/sandgate}
CONFIG=${SANDGATE_CONFIG:-/etc/sandgate/config.json}
DATA=${SANDGATE_DATA:-/var/lib/sandgate}
export PATH=/usr/local/go/bin:$PATH

deploy/setup.sh
printf '\n== building sandgate\n' >&2
go build -o bin/sandgate ./cmd/sandgate

mkdir -p "$(dirname "$CONFIG")" "$DATA/minio"
if [ ! -f "$CONFIG" ]; then
	minio_secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
	token_key=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
	vault_key=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
	read -r key hash < <(bin/sandgate hash-key | tr '\n' ' ')
	umask 077
	cat >"$CONFIG" <<JSON
{
  "listen": "127.0.0.1:8080",
  "public_url": "http://127.0.0.1:8080",
  "hosts": ["localhost:8080"],
  "runtimes": {"gvisor": {"runsc": "$CACHE/runsc"}},
  "state_dir": "$DATA",
  "cache_dir": "$CACHE",
  "minio": {"endpoint": "127.0.0.1:9000", "access_key": "sandgate", "secret_key": "$minio_secret"},
  "tokens": {"active_key": "k1", "keys": {"k1": "$token_key"}},
  "vault": {"key": "$vault_key"},
  "tenants": [{"name": "dev", "api_key_sha256": ["$hash"], "max_sessions": 8, "default_ttl": "15m", "max_ttl": "4h"}]
}
JSON
	echo "$key" >"$(dirname "$CONFIG")/dev-api-key"
	chmod 600 "$(dirname "$CONFIG")/dev-api-key"
fi

minio_user=$(sed -n 's/.*"access_key": *"\([^"]*\)".*/\1/p' "$CONFIG")
minio_pass=$(sed -n 's/.*"secret_key": *"\([^"]*\)".*/\1/p' "$CONFIG")
if ! curl -fsS -o /dev/null http://127.0.0.1:9000/minio/health/live 2>/dev/null; then
	printf '\n== starting MinIO on 127.0.0.1:9000 (data in %s/minio)\n' "$DATA" >&2
	MINIO_ROOT_USER=$minio_user MINIO_ROOT_PASSWORD=$minio_pass \
		setsid "$CACHE/minio" server "$DATA/minio" --address 127.0.0.1:9000 --console-address 127.0.0.1:9001 \
		>"$LOGS/minio.log" 2>&1 </dev/null &
	for _ in $(seq 1 100); do
		curl -fsS -o /dev/null http://127.0.0.1:9000/minio/health/live 2>/dev/null && break
		sleep 0.2
	done
fi

printf '\n== session image (built once per definition, about 4 minutes)\n' >&2
bin/sandgate image build -config "$CONFIG"

key_file="$(dirname "$CONFIG")/dev-api-key"
cat >&2 <<TXT

Sandgate is starting on http://127.0.0.1:8080 (sessions run under gVisor by default).
Development API key: $(cat "$key_file" 2>/dev/null || echo "(see your config)")

Try it from another shell:
  export SANDGATE_URL=http://127.0.0.1:8080 SANDGATE_API_KEY=\$(cat $key_file)
  bin/sandgate session create
  bin/sandgate session preview SESSION_ID        # a CDP URL for Playwright, Puppeteer, chromedp, rod
  bin/sandgate session screenshot SESSION_ID -o shot.png

TXT
exec bin/sandgate serve -config "$CONFIG"
