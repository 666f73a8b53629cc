#!/bin/bash
# up.sh: set up this host and run Sandgate in the foreground: containerd,
# MinIO (a separate server process) and the gateway. Prints a development
# API key and an example the first time.
#
# The first run writes a config; these choose what goes in it (the
# defaults suit one gateway per host):
#   SANDGATE_CONFIG   config file (/etc/sandgate/config.json); the dev API
#                     key is kept beside it
#   SANDGATE_DATA     state directory, MinIO's data in it (/var/lib/sandgate)
#   SANDGATE_LOGS     logs of containerd and MinIO (/var/log/sandgate)
#   SANDGATE_LISTEN   the gateway's address (127.0.0.1:8080)
#   SANDGATE_MINIO    MinIO's address (127.0.0.1:9000), its console one
#                     port above
#   SANDGATE_NAMESPACE, SANDGATE_BRIDGE, SANDGATE_SUBNET
#                     containerd namespace, CNI bridge and subnet (the
#                     gateway's defaults: sandgate, sandgate0, 10.231.0.0/16)
# Later runs read everything from the config. MinIO is started when
# nothing answers at the config's endpoint; its pid goes to
# $SANDGATE_DATA/minio.pid.
set -Eeuo pipefail
# Every failure says what failed, where: set -e alone exits silently.
trap 'status=$?; echo "deploy/up.sh: line $LINENO: \`$BASH_COMMAND\` failed with exit status $status" >&2' ERR
cd "$(dirname "$0")/.."

CACHE=${SANDGATE_CACHE:-/var/cache/sandgate}
LOGS=${SANDGATE_LOGS:-/var/log/sandgate}
CONFIG=${SANDGATE_CONFIG:-/etc/sandgate/config.json}
DATA=${SANDGATE_DATA:-/var/lib/sandgate}
LISTEN=${SANDGATE_LISTEN:-127.0.0.1:8080}
MINIO_ADDR=${SANDGATE_MINIO:-127.0.0.1:9000}
export PATH=/usr/local/go/bin:$PATH

die() {
	echo "deploy/up.sh: $*" >&2
	exit 1
}

# config_value KEY prints the first string value of "KEY" in the config.
config_value() {
	sed -n "s/.*\"$1\": *\"\([^\"]*\)\".*/\1/p" "$CONFIG" | head -1
}

deploy/setup.sh
printf '\n== building sandgate\n' >&2
go build -o bin/sandgate ./cmd/sandgate

mkdir -p "$(dirname "$CONFIG")" "$DATA/minio" "$LOGS"
key_file="$(dirname "$CONFIG")/dev-api-key"
admin_key_file="$(dirname "$CONFIG")/admin-api-key"
if [ ! -f "$CONFIG" ]; then
	minio_secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
	token_key=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
	vault_key=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
	# hash-key prints a new key and its hash, one a line.
	keys=$(bin/sandgate hash-key)
	key=${keys%%$'\n'*}
	hash=${keys##*$'\n'}
	if [ -z "$key" ] || [ -z "$hash" ] || [ "$key" = "$hash" ]; then
		die "bin/sandgate hash-key printed no key and hash"
	fi
	admin_keys=$(bin/sandgate hash-key)
	admin_key=${admin_keys%%$'\n'*}
	admin_hash=${admin_keys##*$'\n'}
	[ -n "$admin_key" ] && [ -n "$admin_hash" ] && [ "$admin_key" != "$admin_hash" ] || die "bin/sandgate hash-key printed no admin key and hash"
	port=${LISTEN##*:}
	extra=""
	[ -z "${SANDGATE_NAMESPACE:-}" ] || extra+="
  \"containerd\": {\"namespace\": \"$SANDGATE_NAMESPACE\"},"
	if [ -n "${SANDGATE_BRIDGE:-}" ] || [ -n "${SANDGATE_SUBNET:-}" ]; then
		[ -n "${SANDGATE_BRIDGE:-}" ] && [ -n "${SANDGATE_SUBNET:-}" ] || die "set SANDGATE_BRIDGE and SANDGATE_SUBNET together"
		extra+="
  \"network\": {\"bridge\": \"$SANDGATE_BRIDGE\", \"subnet\": \"$SANDGATE_SUBNET\"},"
	fi
	umask 077
	cat >"$CONFIG.tmp" <<JSON
{
  "listen": "$LISTEN",
  "public_url": "http://$LISTEN",
  "hosts": ["localhost:$port"],$extra
  "runtimes": {"gvisor": {"runsc": "$CACHE/runsc"}},
  "state_dir": "$DATA",
  "cache_dir": "$CACHE",
  "minio": {"endpoint": "$MINIO_ADDR", "access_key": "sandgate", "secret_key": "$minio_secret"},
  "tokens": {"active_key": "k1", "keys": {"k1": "$token_key"}},
  "vault": {"key": "$vault_key"},
  "tenants": [{"name": "dev", "api_key_sha256": ["$hash"], "max_sessions": 8, "default_ttl": "15m", "max_ttl": "4h"}],
  "admin_key_sha256": ["$admin_hash"]
}
JSON
	echo "$key" >"$key_file"
	echo "$admin_key" >"$admin_key_file"
	mv "$CONFIG.tmp" "$CONFIG"
fi

minio_addr=$(config_value endpoint)
minio_user=$(config_value access_key)
minio_pass=$(config_value secret_key)
public_url=$(config_value public_url)
[ -n "$minio_addr" ] && [ -n "$minio_user" ] && [ -n "$minio_pass" ] || die "$CONFIG has no minio endpoint, access_key and secret_key"
if ! curl -fsS -o /dev/null "http://$minio_addr/minio/health/live" 2>/dev/null; then
	minio_port=${minio_addr##*:}
	console="${minio_addr%:*}:$((minio_port + 1))"
	printf '\n== starting MinIO on %s (data in %s/minio, log %s/minio.log)\n' "$minio_addr" "$DATA" "$LOGS" >&2
	MINIO_ROOT_USER=$minio_user MINIO_ROOT_PASSWORD=$minio_pass \
		setsid "$CACHE/minio" server "$DATA/minio" --address "$minio_addr" --console-address "$console" \
		>>"$LOGS/minio.log" 2>&1 </dev/null &
	echo $! >"$DATA/minio.pid"
	for _ in $(seq 1 300); do
		curl -fsS -o /dev/null "http://$minio_addr/minio/health/live" 2>/dev/null && break
		kill -0 "$(cat "$DATA/minio.pid")" 2>/dev/null || { tail -20 "$LOGS/minio.log" >&2; die "MinIO exited at start"; }
		sleep 0.2
	done
	curl -fsS -o /dev/null "http://$minio_addr/minio/health/live" 2>/dev/null || {
		tail -20 "$LOGS/minio.log" >&2
		die "MinIO did not answer on $minio_addr within 60 s"
	}
fi

printf '\n== session image (built once per definition, about 4 minutes)\n' >&2
bin/sandgate image build -config "$CONFIG"

cat >&2 <<TXT

Sandgate is starting on $public_url (sessions run under gVisor by default).
Development API key: $(cat "$key_file" 2>/dev/null || echo "(see your config)")

Try it from another shell:
  export SANDGATE_URL=$public_url SANDGATE_API_KEY=\$(cat $key_file)
  bin/sandgate session create
  bin/sandgate session preview SESSION_ID        # a CDP URL for Playwright, Puppeteer, chromedp, rod
  bin/sandgate session screenshot SESSION_ID -o shot.png

Tenants and API keys at runtime (admin key in $admin_key_file):
  SANDGATE_ADMIN_KEY=\$(cat $admin_key_file) bin/sandgate admin tenants list

TXT
exec bin/sandgate serve -config "$CONFIG"
