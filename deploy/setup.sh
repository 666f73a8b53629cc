#!/bin/bash
# setup.sh: install and start what Sandgate needs on a Debian bookworm host,
# as root. Idempotent: a second run only checks. Slow parts are cached
# under /var/cache/sandgate, keyed by their inputs (the MinIO version, the
# session image definition).
set -Eeuo pipefail
# Every failure says what failed, where: set -e alone exits silently.
trap 'status=$?; echo "deploy/setup.sh: line $LINENO: \`$BASH_COMMAND\` failed with exit status $status" >&2' ERR

MINIO_VERSION=${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}
# gVisor from the Go module proxy's go branch. It must be built static
# (CGO_ENABLED=0): a cgo build fails at gofer start ("error executing
# umounter") on these hosts.
GVISOR_VERSION=${GVISOR_VERSION:-v0.0.0-20260527191743-a81fd9dd382e}
CACHE=${SANDGATE_CACHE:-/var/cache/sandgate}
LOGS=${SANDGATE_LOGS:-/var/log/sandgate}
export PATH=/usr/local/go/bin:$PATH
mkdir -p "$CACHE" "$LOGS"

step() { printf '\n== %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
	echo "setup.sh must run as root (containerd, network namespaces)" >&2
	exit 1
fi

packages=(containerd runc containernetworking-plugins mmdebstrap iproute2 nftables chromium xvfb ca-certificates curl ffmpeg)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js runs the Playwright and Puppeteer compatibility tests; a machine
# that has it from elsewhere keeps its own.
command -v npm >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
	step "installing Debian packages: ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$LOGS/apt.log" 2>&1 || {
		tail -20 "$LOGS/apt.log" >&2
		exit 1
	}
fi

if ! command -v go >/dev/null; then
	echo "Go is required (/usr/local/go/bin/go)" >&2
	exit 1
fi

# Static (no cgo), as MinIO's own releases are: the trial cluster runs
# the same binary as an image of that one file (TestKubeDeployment).
minio="$CACHE/minio-$MINIO_VERSION-static/minio"
if [ ! -x "$minio" ]; then
	step "building the MinIO server $MINIO_VERSION (once; about 8 minutes)"
	tmp=$(mktemp -d)
	(cd "$tmp" && CGO_ENABLED=0 GOBIN="$CACHE/minio-$MINIO_VERSION-static" GOFLAGS=-mod=mod go install "github.com/minio/minio@$MINIO_VERSION") >"$LOGS/minio-build.log" 2>&1 || {
		tail -20 "$LOGS/minio-build.log" >&2
		exit 1
	}
	rm -rf "$tmp"
fi
ln -sf "$minio" "$CACHE/minio"

runsc_dir="$CACHE/runsc-$GVISOR_VERSION"
if [ ! -x "$runsc_dir/runsc" ]; then
	step "building gVisor's runsc $GVISOR_VERSION (once; a few minutes)"
	tmp=$(mktemp -d)
	(cd "$tmp" && CGO_ENABLED=0 GOBIN="$runsc_dir" GOFLAGS=-mod=mod go install "gvisor.dev/gvisor/runsc@$GVISOR_VERSION") >"$LOGS/runsc-build.log" 2>&1 || {
		tail -20 "$LOGS/runsc-build.log" >&2
		exit 1
	}
	rm -rf "$tmp"
fi
# containerd's runc shim runs this wrapper in place of runc for the gvisor
# handler (runc option BinaryName): gVisor's own shim cannot set
# oom_score_adj here, and systrap needs no KVM or ptrace. --oci-seccomp
# installs the container's seccomp profile in gVisor's kernel, so a
# session is refused the same calls (user namespaces, keyrings, ptrace,
# bpf) as under runc; without it runsc ignores the profile. Rewritten on
# every run, so an older wrapper gains the flag.
#
# Two things make the runc shim work with runsc for the second container
# of a sandbox (a Kubernetes Pod's container beside its pause container):
#  - "runsc start" starts that container's gofer, which inherits start's
#    stdout and stderr. The runc shim reads those to their end, so it
#    waited as long as the gofer lived and the Pod stayed in
#    ContainerCreating. Here start writes to a file, handed on after.
#  - The runc shim learns that a container exited when the pid in its
#    pid file exits; for such a container runsc writes the sandbox's pid,
#    which lives on, so a stopped container was never seen to stop (and a
#    Pod never finished terminating). After create, a waiter takes that
#    place: it waits for the container inside the sandbox ("runsc wait")
#    and exits with its status; the shim, a subreaper, reaps it.
cat >"$runsc_dir/runsc-sandgate.tmp" <<WRAP
#!/bin/sh
runsc="$runsc_dir/runsc"
# The subcommand is the first word that is neither a flag nor the value
# of one of the global flags go-runc passes (--root, --log, --log-format).
cmd= bundle= pidfile= id= prev=
for arg do
	if [ -z "\$cmd" ]; then
		case "\$prev" in
		--root|--log|--log-format|--criu) prev= ; continue ;;
		esac
		case "\$arg" in
		-*) prev=\$arg ; continue ;;
		esac
		cmd=\$arg
	fi
	case "\$prev" in
	--bundle|-b) bundle=\$arg ;;
	--pid-file) pidfile=\$arg ;;
	esac
	case "\$arg" in
	--bundle=*) bundle=\${arg#--bundle=} ;;
	--pid-file=*) pidfile=\${arg#--pid-file=} ;;
	esac
	prev=\$arg
	id=\$arg
done
if [ "\$cmd" = start ]; then
	out=\$(mktemp /tmp/runsc-start.XXXXXX) || exit 1
	"\$runsc" --platform=systrap --oci-seccomp "\$@" >"\$out" 2>&1
	status=\$?
	cat "\$out"
	rm -f "\$out"
	exit \$status
fi
if [ "\$cmd" = create ] && [ -n "\$pidfile" ] && [ -n "\$bundle" ] &&
	grep -q '"io.kubernetes.cri.container-type": *"container"' "\$bundle/config.json" 2>/dev/null; then
	"\$runsc" --platform=systrap --oci-seccomp "\$@" || exit
	# The same global flags (--root, --log) reach runsc state and wait.
	n=0
	for arg do
		[ "\$arg" = create ] && break
		n=\$((n + 1))
	done
	globals=
	i=0
	for arg do
		[ \$i -ge \$n ] && break
		globals="\$globals '\$(printf %s "\$arg" | sed "s/'/'\\\\''/g")'"
		i=\$((i + 1))
	done
	(
		eval "set -- \$globals"
		# Until the container starts. Two seconds of failed lookups in a
		# row mean it is gone (deleted before it started).
		misses=0
		while :; do
			if state=\$("\$runsc" --platform=systrap "\$@" state "\$id" 2>/dev/null); then
				misses=0
				printf %s "\$state" | grep -q '"status": *"\\(running\\|stopped\\)"' && break
			else
				misses=\$((misses + 1))
				[ \$misses -ge 40 ] && exit 137
			fi
			sleep 0.05
		done
		code=\$("\$runsc" --platform=systrap "\$@" wait "\$id" 2>/dev/null | sed -n 's/.*"exitStatus": *\\([0-9]*\\).*/\\1/p')
		exit "\${code:-137}"
	) </dev/null >/dev/null 2>&1 &
	printf %s \$! >"\$pidfile"
	exit 0
fi
# runsc says "sandbox is not running" of a container whose sandbox has
# exited; the runc shim takes only runc's words ("container not running")
# for "already gone". Otherwise containerd's kill of a Pod's exited pause
# container failed as unknown, again and again, and the Pod never
# finished terminating.
if [ "\$cmd" = kill ]; then
	out=\$("\$runsc" --platform=systrap --oci-seccomp "\$@" 2>&1)
	status=\$?
	[ \$status -eq 0 ] && exit 0
	case "\$out" in
	*"is not running"*) printf 'container not running (runsc: %s)\n' "\$out" >&2 ;;
	*) printf '%s\n' "\$out" >&2 ;;
	esac
	exit \$status
fi
exec "\$runsc" --platform=systrap --oci-seccomp "\$@"
WRAP
chmod +x "$runsc_dir/runsc-sandgate.tmp"
mv -f "$runsc_dir/runsc-sandgate.tmp" "$runsc_dir/runsc-sandgate"
ln -sfn "$runsc_dir/runsc-sandgate" "$CACHE/runsc"

# containerd: this host may have no init system running services.
if ! ctr version >/dev/null 2>&1; then
	step "starting containerd"
	if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
		systemctl start containerd
	else
		setsid containerd >"$LOGS/containerd.log" 2>&1 < /dev/null &
	fi
	for _ in $(seq 1 100); do
		ctr version >/dev/null 2>&1 && break
		sleep 0.1
	done
	ctr version >/dev/null || { echo "containerd did not start; see $LOGS/containerd.log" >&2; exit 1; }
fi

