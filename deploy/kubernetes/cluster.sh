#!/bin/bash
# cluster.sh: a real single-node Kubernetes on this host, for trying the
# Kubernetes backend and for its tests. Not for production: point Sandgate
# at the cluster you already run (see README.md here).
#
#   cluster.sh build   build etcd, kube-apiserver, kube-controller-manager,
#                      kube-scheduler, kubelet, kube-proxy and the
#                      NetworkPolicy enforcer (cached, keyed by version)
#   cluster.sh up      build, then start the cluster unless it runs; prints
#                      the admin kubeconfig's path
#   cluster.sh down    stop it, its Pods' containers and its network; keep
#                      the binaries
#   cluster.sh status  exit 0 when the API answers
#   cluster.sh import ARCHIVE
#                      import an OCI archive into the cluster's containerd
#   cluster.sh image NAME PROGRAM [HOST_PROGRAM...]
#                      build an image of one static program (its
#                      entrypoint, run as 65532, with the host's CA
#                      certificates), and of host programs with their
#                      libraries, named NAME, and import it
#
# It runs its own containerd (socket /run/sandgate-kube/containerd.sock)
# with the CRI plugin, so the host's containerd, which the embedded
# backend uses, keeps its configuration. There is no registry here: the
# sandbox ("pause") image is built from ./pause and images are imported
# into containerd's k8s.io namespace (cluster.sh import ARCHIVE).
#
# Measured on these machines (Debian bookworm, cgroup v1, containerd 1.6):
# lowering oom_score_adj is refused, so CRI runs with
# restrict_oom_score_adj; the kubelet uses the cgroupfs driver with
# failCgroupV1: false and cgroupsPerQOS: false; the API server advertises a
# non-loopback address, held by an empty bridge made here (these kernels
# have no dummy interface driver).
#
# The bridge plugin enforces no NetworkPolicy, so the cluster runs
# kube-network-policies (SIG Network's reference enforcer, ./build/netpol)
# on the node, and every new IPv4 connection a Pod opens goes to it
# through an nfqueue: it decides, and while it is not there the
# connection is dropped (Pods have no IPv6 path but to the node's input,
# which drops it). The enforcer's own nftables rules do not load on these
# kernels, which lack nftables' queue expression ("syncing nftables rules
# ... no such file or directory" in its log); the queue is reached with
# iptables' NFQUEUE target instead, which they have.
set -Eeuo pipefail
trap 'status=$?; echo "cluster.sh: line $LINENO: \`$BASH_COMMAND\` failed with exit status $status" >&2' ERR

KUBE_VERSION=v1.37.2 # also in build/go.mod
CACHE=${SANDGATE_CACHE:-/var/cache/sandgate}
LOGS=${SANDGATE_LOGS:-/var/log/sandgate}/kube
STATE=${SANDGATE_KUBE_STATE:-/var/lib/sandgate-kube}
RUN=/run/sandgate-kube
NODE=sandgate-node
NODE_IP=${SANDGATE_KUBE_NODE_IP:-10.97.0.1}
POD_CIDR=${SANDGATE_KUBE_POD_CIDR:-10.98.0.0/24}
POD_BASE=${POD_CIDR%/*}
POD_GW=${POD_BASE%.*}.$((${POD_BASE##*.} + 1)) # the bridge's address: the Pods' gateway
EGRESS_PORT=3128
SERVICE_CIDR=10.99.0.0/24
API_PORT=16443
NETPOL_QUEUE=100
ETCD_PORT=23790
PROXY_HEALTH_PORT=10256
PROXY_METRICS_PORT=10249
HERE=$(cd "$(dirname "$0")" && pwd)
export PATH=/usr/local/go/bin:$PATH
PAUSE_IMAGE=sandgate.local/pause:1

step() { printf '\n== %s\n' "$*" >&2; }

# The binaries' directories are keyed by the inputs that make them: the
# wrapper module (versions), the Go toolchain.
bindir() {
	local key
	key=$( (cat "$HERE/build/go.mod" "$HERE/build/go.sum"; go version) | sha256sum | cut -c1-12)
	echo "$CACHE/kubernetes-$KUBE_VERSION-$key"
}

netpoldir() {
	local key
	key=$( (cat "$HERE/build/netpol/go.mod" "$HERE/build/netpol/go.sum" "$HERE/build/netpol/main.go"; go version) | sha256sum | cut -c1-12)
	echo "$CACHE/netpol-$key"
}

proxydir() {
	local key
	key=$( (cat "$HERE/build/proxy/go.mod" "$HERE/build/proxy/go.sum"; go version) | sha256sum | cut -c1-12)
	echo "$CACHE/kube-proxy-$KUBE_VERSION-$key"
}

etcddir() {
	local key
	key=$( (cat "$HERE/build/etcd/go.mod" "$HERE/build/etcd/go.sum"; go version) | sha256sum | cut -c1-12)
	echo "$CACHE/etcd-$key"
}

build() {
	local dir
	dir=$(bindir)
	mkdir -p "$LOGS"
	if [ ! -x "$dir/kubelet" ]; then
		step "building Kubernetes $KUBE_VERSION (once; about 15 minutes)"
		mkdir -p "$dir.tmp"
		(cd "$HERE/build" && CGO_ENABLED=0 go build -trimpath -o "$dir.tmp/" \
			k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
			k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet) >"$LOGS/build.log" 2>&1 || {
			tail -20 "$LOGS/build.log" >&2
			exit 1
		}
		rm -rf "$dir"
		mv "$dir.tmp" "$dir"
	fi
	local etcd
	etcd=$(etcddir)/etcd
	if [ ! -x "$etcd" ]; then
		step "building etcd (once; about a minute)"
		mkdir -p "$(etcddir)"
		(cd "$HERE/build/etcd" && CGO_ENABLED=0 go build -trimpath -o "$etcd.tmp" go.etcd.io/etcd/server/v3) >"$LOGS/etcd-build.log" 2>&1 || {
			tail -20 "$LOGS/etcd-build.log" >&2
			exit 1
		}
		mv "$etcd.tmp" "$etcd"
	fi
	local netpol
	netpol=$(netpoldir)/netpol
	if [ ! -x "$netpol" ]; then
		step "building the NetworkPolicy enforcer (once; a few minutes)"
		mkdir -p "$(netpoldir)"
		(cd "$HERE/build/netpol" && CGO_ENABLED=0 go build -trimpath -o "$netpol.tmp" .) >"$LOGS/netpol-build.log" 2>&1 || {
			tail -20 "$LOGS/netpol-build.log" >&2
			exit 1
		}
		mv "$netpol.tmp" "$netpol"
	fi
	local proxy
	proxy=$(proxydir)/kube-proxy
	if [ ! -x "$proxy" ]; then
		step "building kube-proxy (once; a few minutes)"
		mkdir -p "$(proxydir)"
		(cd "$HERE/build/proxy" && CGO_ENABLED=0 go build -trimpath -o "$proxy.tmp" k8s.io/kubernetes/cmd/kube-proxy) >"$LOGS/proxy-build.log" 2>&1 || {
			tail -20 "$LOGS/proxy-build.log" >&2
			exit 1
		}
		mv "$proxy.tmp" "$proxy"
	fi
	local pause="$CACHE/kube-pause.oci.tar"
	local pkey
	pkey=$( (cat "$HERE/pause/main.go"; go version) | sha256sum | cut -c1-12)
	if [ ! -s "$pause" ] || [ "$(cat "$pause.key" 2>/dev/null)" != "$pkey" ]; then
		pause_image "$pause"
		echo "$pkey" >"$pause.key"
	fi
}

# pause_image writes an OCI archive of a one-file image: the pause program.
pause_image() {
	local tmp
	tmp=$(mktemp -d)
	mkdir -p "$tmp/root"
	(cd "$HERE/pause" && CGO_ENABLED=0 go build -trimpath -o "$tmp/root/pause" .)
	oci_archive "$tmp/root" "$PAUSE_IMAGE" '"Entrypoint":["/pause"],"User":"65535:65535"' "$1"
	rm -rf "$tmp"
}

# program_image NAME PROGRAM [HOST_PROGRAM...]: builds and imports an
# image of one static program: /usr/local/bin/<its name>, its
# entrypoint, run as 65532 (a user /etc/passwd names, as distroless's
# nonroot), with the host's CA certificates and a /tmp; and with each
# HOST_PROGRAM (a program on the host's PATH, ffmpeg say) at its host
# path, with the shared libraries it loads.
program_image() {
	local name=$1 prog=$2 base extra lib
	shift 2
	base=$(basename "$prog")
	if ! [[ $name =~ ^[a-z0-9][a-z0-9./_:-]*$ && $base =~ ^[A-Za-z0-9._-]+$ ]]; then
		echo "cluster.sh image: unusable name $name or program $base" >&2
		exit 2
	fi
	if ldd "$prog" >/dev/null 2>&1; then
		echo "cluster.sh image: $prog is not static (ldd lists its libraries); build it with CGO_ENABLED=0" >&2
		exit 1
	fi
	umask 022
	# Global, for the trap that removes it when a step fails.
	tmp=$(mktemp -d)
	trap 'rm -rf "${tmp:-}"' EXIT
	mkdir -p "$tmp/root/usr/local/bin" "$tmp/root/etc/ssl/certs" "$tmp/root/tmp" "$tmp/root/home/nonroot"
	cp "$prog" "$tmp/root/usr/local/bin/$base"
	chmod 755 "$tmp/root/usr/local/bin/$base"
	for extra in "$@"; do
		extra=$(command -v "$extra")
		if ldd "$extra" | grep -q 'not found'; then
			echo "cluster.sh image: $extra lacks libraries: $(ldd "$extra" | grep 'not found')" >&2
			exit 1
		fi
		for lib in "$extra" $(ldd "$extra" | grep -o '/[^ ]*'); do
			mkdir -p "$tmp/root$(dirname "$lib")"
			cp -L "$lib" "$tmp/root$lib"
		done
	done
	# Debian's CA bundle as shipped (Mozilla's), not the host's, which may
	# hold CAs added locally.
	cat /usr/share/ca-certificates/mozilla/*.crt >"$tmp/root/etc/ssl/certs/ca-certificates.crt"
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$tmp/root/etc/passwd"
	printf 'root:x:0:\nnonroot:x:65532:\n' >"$tmp/root/etc/group"
	chmod 1777 "$tmp/root/tmp"
	chown 65532:65532 "$tmp/root/home/nonroot"
	oci_archive "$tmp/root" "$name" "$(printf '"Entrypoint":["/usr/local/bin/%s"],"User":"65532:65532","Env":["PATH=/usr/local/bin:/usr/bin:/bin","HOME=/home/nonroot"]' "$base")" "$tmp/image.tar"
	ctr -a "$RUN/containerd.sock" -n k8s.io images import --all-platforms "$tmp/image.tar" >/dev/null
	rm -rf "$tmp"
}

# oci_archive ROOT NAME CONFIG OUT: writes an OCI archive of an image of
# one layer, ROOT's files, with CONFIG (the members of the image
# config's "config"), named NAME.
oci_archive() {
	local root=$1 name=$2 conf=$3 out=$4 tmp
	tmp=$(mktemp -d)
	mkdir -p "$tmp/oci/blobs/sha256"
	tar -C "$root" --sort=name --numeric-owner --mtime=@0 -cf "$tmp/layer.tar" .
	local layer layer_size config config_size manifest manifest_size
	layer=$(sha256sum <"$tmp/layer.tar" | cut -d' ' -f1)
	layer_size=$(stat -c %s "$tmp/layer.tar")
	mv "$tmp/layer.tar" "$tmp/oci/blobs/sha256/$layer"
	printf '{"architecture":"amd64","os":"linux","config":{%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$conf" "$layer" >"$tmp/config"
	config=$(sha256sum <"$tmp/config" | cut -d' ' -f1)
	config_size=$(stat -c %s "$tmp/config")
	mv "$tmp/config" "$tmp/oci/blobs/sha256/$config"
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
		"$config" "$config_size" "$layer" "$layer_size" >"$tmp/manifest"
	manifest=$(sha256sum <"$tmp/manifest" | cut -d' ' -f1)
	manifest_size=$(stat -c %s "$tmp/manifest")
	mv "$tmp/manifest" "$tmp/oci/blobs/sha256/$manifest"
	printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
		"$manifest" "$manifest_size" "$name" "$name" >"$tmp/oci/index.json"
	echo '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci/oci-layout"
	tar -C "$tmp/oci" -cf "$out.tmp" .
	mv "$out.tmp" "$out"
	rm -rf "$tmp"
}

# pki writes a CA and the certificates and kubeconfigs the parts use, once
# each.
pki() {
	local p=$STATE/pki
	mkdir -p "$p"
	chmod 700 "$p"
	cert() { # name subject [extensions]
		openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$p/$1.key" -out "$p/$1.csr" 2>/dev/null
		printf '%s\n' "${3:-extendedKeyUsage=clientAuth}" >"$p/$1.ext"
		openssl x509 -req -in "$p/$1.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 3650 \
			-extfile "$p/$1.ext" -out "$p/$1.crt" 2>/dev/null
		rm -f "$p/$1.csr" "$p/$1.ext"
	}
	kubeconfig() { # who
		cat >"$p/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sandgate-kube
  cluster:
    server: https://$NODE_IP:$API_PORT
    certificate-authority: $p/ca.crt
users:
- name: $1
  user:
    client-certificate: $p/$1.crt
    client-key: $p/$1.key
contexts:
- name: sandgate-kube
  context: {cluster: sandgate-kube, user: $1}
current-context: sandgate-kube
EOF
	}
	if [ ! -s "$p/admin.kubeconfig" ]; then
		openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=sandgate-kube-ca" \
			-keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
		cert apiserver "/CN=kube-apiserver" \
			"subjectAltName=IP:$NODE_IP,IP:10.99.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth"
		cert apiserver-kubelet "/O=system:masters/CN=kube-apiserver-kubelet-client"
		cert kubelet "/O=system:nodes/CN=system:node:$NODE"
		cert controller-manager "/CN=system:kube-controller-manager"
		cert scheduler "/CN=system:kube-scheduler"
		openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
		openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
		local who
		for who in kubelet controller-manager scheduler; do
			kubeconfig $who
		done
		# The admin's last: its kubeconfig says the PKI is complete.
		cert admin "/O=system:masters/CN=sandgate-kube-admin"
		kubeconfig admin
	fi
	# kube-proxy's, added after the rest (a PKI made before it lacks it):
	# the user the API server's default policy binds to
	# system:node-proxier.
	if [ ! -s "$p/proxy.kubeconfig" ]; then
		cert proxy "/CN=system:kube-proxy"
		kubeconfig proxy
	fi
}

api_ok() {
	local p=$STATE/pki
	[ -s "$p/admin.crt" ] && curl -sf --max-time 2 --cacert "$p/ca.crt" --cert "$p/admin.crt" --key "$p/admin.key" \
		"https://$NODE_IP:$API_PORT/readyz" >/dev/null 2>&1
}

# start NAME COMMAND...: runs a part in its own session, logs to a file,
# keeps its pid.
start() {
	local name=$1
	shift
	# 9>&-: the parts must not hold the lock of this script.
	setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null 9>&- &
	echo $! >"$RUN/$name.pid"
}

# wait_for WHAT SECONDS COMMAND...: polls until COMMAND succeeds.
wait_for() {
	local what=$1 secs=$2
	shift 2
	local end=$((SECONDS + secs))
	until "$@"; do
		if [ $SECONDS -ge $end ]; then
			echo "cluster.sh: $what did not come up in ${secs}s; see $LOGS" >&2
			exit 1
		fi
		sleep 0.5
	done
}

up() {
	build
	if api_ok && all_alive && netpol_rule -C 2>/dev/null && netpol_api_rule -C 2>/dev/null; then
		echo "$STATE/pki/admin.kubeconfig"
		return
	fi
	down quiet
	local bin etcd
	bin=$(bindir)
	etcd=$(etcddir)/etcd
	mkdir -p "$STATE" "$RUN" "$LOGS" "$STATE/cni"
	pki
	local p=$STATE/pki

	step "starting a single-node Kubernetes $KUBE_VERSION at https://$NODE_IP:$API_PORT"
	# Traffic between Pods is bridged: the node's filters (and so the
	# NetworkPolicy enforcer) see it only through br_netfilter.
	modprobe br_netfilter 2>/dev/null || true
	[ -s "$STATE/bridge-nf.saved" ] || sysctl -e net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables >"$STATE/bridge-nf.saved"
	sysctl -q -w net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1 || {
		echo "cluster.sh: br_netfilter is not available: traffic between Pods would pass no filter" >&2
		exit 1
	}
	# No dummy driver on these kernels: an empty bridge holds the address.
	ip link show sgk0 >/dev/null 2>&1 || ip link add sgk0 type bridge
	ip addr replace "$NODE_IP/32" dev sgk0
	ip link set sgk0 up
	# Services' addresses lead nowhere but through kube-proxy's rules: a
	# connection the node opens to one before kube-proxy has its rule
	# goes to the empty bridge, not off the machine by the default route.
	ip route replace "$SERVICE_CIDR" dev sgk0
	# The Pods' bridge, with its address, before the first Pod (the CNI
	# plugin would make it then, and takes it as it finds it): a gateway
	# on the node can serve its egress proxy there from the start.
	ip link show sgkbr0 >/dev/null 2>&1 || ip link add sgkbr0 type bridge
	ip addr replace "$POD_GW/${POD_CIDR#*/}" dev sgkbr0
	ip link set sgkbr0 up

	# Pods have a default route through the node, as in any cluster, and
	# the node lets them answer it, reach each other over IPv4 (where
	# NetworkPolicy lets them) and reach network namespaces the tests make
	# (host side of their veth named sgkt*, or sgth* for the suite's test
	# hosts, which a gateway Pod's egress proxy reaches), where
	# NetworkPolicy lets them, and nothing else: not the
	# host's services, not another machine, not each other over IPv6 (the
	# link-local addresses every Pod has, which the enforcer's IPv4 queue
	# would not see). Two host services are open to them:
	# - the API server, as in any cluster (a gateway run in the cluster
	#   reaches it through the Service "kubernetes"); which Pods may is
	#   the NetworkPolicy enforcer's to decide (netpol_api_rule), so a
	#   session Pod may not;
	# - a gateway run on the node serves its egress proxy on the bridge's
	#   address ($POD_GW, port $EGRESS_PORT), the trial's stand-in for
	#   the proxy's Service; it serves sessions only, known by their Pod
	#   addresses.
	# Bridged traffic passes these hooks only with br_netfilter's
	# bridge-nf-call-* on, which up makes sure of.
	nft -f - <<EOF
table inet sandgate_kube
delete table inet sandgate_kube
table inet sandgate_kube {
	chain input {
		type filter hook input priority 0; policy accept;
		iifname "sgkbr0" ct state established,related accept
		iifname "sgkbr0" ip daddr $POD_GW tcp dport $EGRESS_PORT accept
		iifname "sgkbr0" ip daddr $NODE_IP tcp dport $API_PORT accept
		iifname "sgkbr0" drop
	}
	chain forward {
		type filter hook forward priority 0; policy accept;
		meta nfproto ipv6 iifname "sgkbr0" drop
		meta nfproto ipv6 oifname "sgkbr0" drop
		iifname "sgkbr0" oifname "sgkbr0" accept
		iifname "sgkbr0" oifname "sgkt*" accept
		iifname "sgkbr0" oifname "sgth*" accept
		iifname "sgkbr0" drop
		oifname "sgkbr0" ct state established,related accept
		oifname "sgkbr0" drop
	}
}
EOF
	cat >"$STATE/cni/10-sandgate-kube.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "sandgate-kube", "plugins": [
  {"type": "bridge", "bridge": "sgkbr0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$STATE/cni-ipam"}}
]}
EOF
	cat >"$STATE/containerd.toml" <<EOF
version = 2
root = "$STATE/containerd"
state = "$RUN/containerd"
[grpc]
  address = "$RUN/containerd.sock"
[ttrpc]
  address = "$RUN/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$RUN/runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gvisor]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gvisor.options]
        BinaryName = "$CACHE/runsc"
        SystemdCgroup = false
        Root = "$RUN/runsc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni"
EOF
	start containerd containerd --config "$STATE/containerd.toml"
	wait_for containerd 30 ctr -a "$RUN/containerd.sock" version >/dev/null 2>&1
	ctr -a "$RUN/containerd.sock" -n k8s.io images import --all-platforms "$CACHE/kube-pause.oci.tar" >/dev/null

	start etcd "$etcd" --name sandgate-kube --data-dir "$STATE/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
		--initial-cluster sandgate-kube=http://127.0.0.1:23800 --log-level warn
	start apiserver "$bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
		--advertise-address "$NODE_IP" --bind-address "$NODE_IP" --secure-port "$API_PORT" \
		--service-cluster-ip-range "$SERVICE_CIDR" \
		--tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" --client-ca-file "$p/ca.crt" \
		--service-account-key-file "$p/sa.pub" --service-account-signing-key-file "$p/sa.key" \
		--service-account-issuer https://kubernetes.default.svc \
		--kubelet-client-certificate "$p/apiserver-kubelet.crt" --kubelet-client-key "$p/apiserver-kubelet.key" \
		--kubelet-preferred-address-types InternalIP \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction
	wait_for kube-apiserver 120 api_ok
	start controller-manager "$bin/kube-controller-manager" --kubeconfig "$p/controller-manager.kubeconfig" \
		--service-account-private-key-file "$p/sa.key" --root-ca-file "$p/ca.crt" \
		--use-service-account-credentials=true --leader-elect=false --bind-address 127.0.0.1 --secure-port 0
	start scheduler "$bin/kube-scheduler" --kubeconfig "$p/scheduler.kubeconfig" \
		--leader-elect=false --bind-address 127.0.0.1 --secure-port 0
	# It watches every namespace's policies and Pods: the admin's
	# credentials, as befits a part of the trial cluster itself.
	start netpol "$(netpoldir)/netpol" -kubeconfig "$p/admin.kubeconfig" -node "$NODE" -nfqueue-id "$NETPOL_QUEUE"
	wait_for "the NetworkPolicy enforcer" 60 netpol_ok
	netpol_rule -C 2>/dev/null || netpol_rule -I
	netpol_api_rule -C 2>/dev/null || netpol_api_rule -I

	cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
containerRuntimeEndpoint: unix://$RUN/containerd.sock
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $p/ca.crt}
authorization: {mode: AlwaysAllow}
# No registry: images are imported, never pulled, and never collected.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
EOF
	# The kubelet sets kernel.panic, kernel.panic_on_oops and
	# vm.overcommit_memory on its host; down puts them back.
	[ -s "$STATE/sysctl.saved" ] || sysctl -e kernel.panic kernel.panic_on_oops vm.overcommit_memory \
		kernel.keys.root_maxkeys kernel.keys.root_maxbytes >"$STATE/sysctl.saved"
	start kubelet "$bin/kubelet" --config "$STATE/kubelet.yaml" --kubeconfig "$p/kubelet.kubeconfig" \
		--hostname-override "$NODE" --node-ip "$NODE_IP" --root-dir "$STATE/kubelet"
	wait_for "the node $NODE" 120 node_ready
	# Services: kube-proxy, iptables mode (these kernels' nftables lack
	# pieces its nftables mode needs; iptables here is iptables-nft).
	# It leaves the host's conntrack settings and route_localnet alone,
	# and serves node ports on the node's address only.
	cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $p/proxy.kubeconfig}
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $POD_CIDR
nodePortAddresses: ["$NODE_IP/32"]
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false}
healthzBindAddress: 127.0.0.1:$PROXY_HEALTH_PORT
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
EOF
	# down cleans its rules up with the same binary, whatever the cache
	# holds by then.
	echo "$(proxydir)/kube-proxy" >"$RUN/proxy.bin"
	start proxy "$(proxydir)/kube-proxy" --config "$STATE/kube-proxy.yaml"
	wait_for kube-proxy 60 proxy_ok
	# Pods need their namespace's default ServiceAccount, which the
	# controller manager makes.
	wait_for "the default ServiceAccount" 120 sa_ready
	all_alive || {
		echo "cluster.sh: $dead exited; see $LOGS/$dead.log" >&2
		tail -5 "$LOGS/$dead.log" >&2
		exit 1
	}
	echo "$p/admin.kubeconfig"
}

PARTS="containerd etcd apiserver controller-manager scheduler netpol kubelet proxy"

# all_alive: every part runs; else $dead names one that does not.
all_alive() {
	local part
	for part in $PARTS; do
		[ -s "$RUN/$part.pid" ] && kill -0 "$(cat "$RUN/$part.pid")" 2>/dev/null || {
			dead=$part
			return 1
		}
	done
}

# get PATH: the API's answer, as the admin.
get() {
	local p=$STATE/pki
	curl -sf --max-time 2 --cacert "$p/ca.crt" --cert "$p/admin.crt" --key "$p/admin.key" \
		"https://$NODE_IP:$API_PORT$1" 2>/dev/null
}

# netpol_rule -C|-I|-D: checks, inserts or deletes the rule that sends
# Pods' IPv4 packets that start a connection, or belong to none, (to each
# other and out; not the node's own to them) to the enforcer's queue.
# Without --queue-bypass: dropped while the enforcer is gone. In the
# mangle table, which runs before the filter table's rules: kube-proxy
# accepts there the packets it marks (a Pod's connection to a node port
# or an external IP), which would pass no policy.
netpol_rule() {
	iptables -w -t mangle "$1" FORWARD -i sgkbr0 -m conntrack ! --ctstate ESTABLISHED,RELATED -m comment --comment sandgate-kube-netpol \
		-j NFQUEUE --queue-num "$NETPOL_QUEUE"
}

# netpol_api_rule -C|-I|-D: the same for Pods' connections to the API
# server (the node's input, not forwarded).
netpol_api_rule() {
	iptables -w -t mangle "$1" INPUT -i sgkbr0 -d "$NODE_IP" -p tcp --dport "$API_PORT" -m conntrack ! --ctstate ESTABLISHED,RELATED \
		-m comment --comment sandgate-kube-netpol-api -j NFQUEUE --queue-num "$NETPOL_QUEUE"
}

# proxy_ok: kube-proxy has its rules in place (its /healthz says healthy
# while it starts, before it has written any): the Service kubernetes's
# among them.
proxy_ok() {
	curl -sf --max-time 2 "http://127.0.0.1:$PROXY_HEALTH_PORT/healthz" >/dev/null 2>&1 &&
		iptables -w -t nat -S KUBE-SERVICES 2>/dev/null | grep -q 'default/kubernetes:https'
}

# netpol_ok: the enforcer listens on its queue.
netpol_ok() {
	awk -v q="$NETPOL_QUEUE" '$1 == q {found = 1} END {exit !found}' /proc/net/netfilter/nfnetlink_queue
}

sa_ready() {
	get /api/v1/namespaces/default/serviceaccounts/default >/dev/null
}

node_ready() {
	get "/api/v1/nodes/$NODE" | tr -d ' \n' | grep -q '"type":"Ready","status":"True"'
}

# stop NAME: TERM, then KILL after 10 s.
stop() {
	local f=$RUN/$1.pid pid
	[ -s "$f" ] || return 0
	pid=$(cat "$f")
	if kill -0 "$pid" 2>/dev/null; then
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 1 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -9 "$pid" 2>/dev/null || true
	fi
	rm -f "$f"
}

down() {
	[ "${1:-}" = quiet ] || step "stopping the single-node Kubernetes"
	# Pods first, through the API, while the kubelet runs: it stops
	# their containers and takes down their network (CNI).
	if api_ok && all_alive; then
		local p=$STATE/pki
		curl -sf --max-time 10 -X DELETE --cacert "$p/ca.crt" --cert "$p/admin.crt" --key "$p/admin.key" \
			"https://$NODE_IP:$API_PORT/api/v1/pods?gracePeriodSeconds=1" >/dev/null 2>&1 || true
		local end=$((SECONDS + 60))
		while [ $SECONDS -lt $end ] && get /api/v1/pods | tr -d ' \n' | grep -q '"kind":"Pod"'; do
			sleep 0.5
		done
	fi
	stop kubelet
	stop proxy
	# Its Services' rules go with it.
	local proxy_bin
	proxy_bin=$(cat "$RUN/proxy.bin" 2>/dev/null || true)
	if [ -x "$proxy_bin" ]; then
		"$proxy_bin" --cleanup >"$LOGS/proxy-cleanup.log" 2>&1 || true
		rm -f "$RUN/proxy.bin"
	fi
	if iptables -w -t nat -S 2>/dev/null | grep -q -- '-N KUBE-SERVICES'; then
		echo "cluster.sh: kube-proxy's rules are still there (iptables -t nat -S | grep KUBE-); see $LOGS/proxy-cleanup.log" >&2
	fi
	stop scheduler
	stop controller-manager
	stop apiserver
	stop etcd
	# The Pods' containers outlive the kubelet: end them (gVisor's
	# sandboxes with them), then containerd, then any shim left.
	if [ -S "$RUN/containerd.sock" ]; then
		local t c="ctr -a $RUN/containerd.sock -n k8s.io"
		for t in $($c tasks ls -q 2>/dev/null); do
			$c tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1 || true
		done
		for t in $($c tasks ls -q 2>/dev/null); do
			for _ in $(seq 1 50); do
				$c tasks delete "$t" >/dev/null 2>&1 && break
				sleep 0.1
			done
		done
	fi
	stop containerd
	# One started again by hand, which its pid file does not name.
	pkill -9 -f "^containerd --config $STATE/containerd.toml" 2>/dev/null || true
	pkill -9 -f "containerd-shim-runc-v2 .*-address $RUN/containerd.sock" 2>/dev/null || true
	pkill -9 -f "runsc-(sandbox|gofer) .*--root=$RUN/" 2>/dev/null || true
	# The enforcement goes last, once no Pod runs: until here a Pod's new
	# connections are still decided (or dropped, the enforcer stopped).
	while netpol_rule -D 2>/dev/null; do :; done
	while netpol_api_rule -D 2>/dev/null; do :; done
	stop netpol
	nft delete table inet kube-network-policies 2>/dev/null || true
	local m
	for m in $(awk -v d="$RUN/" '$2 ~ "^"d {print $2}' /proc/mounts | sort -r); do umount -l "$m" 2>/dev/null || true; done
	for m in $(awk -v d="$STATE/" '$2 ~ "^"d {print $2}' /proc/mounts | sort -r); do umount -l "$m" 2>/dev/null || true; done
	# Network namespaces of Pods whose sandbox was never torn down (a
	# force-deleted Pod). CRI names them cni-*, and this cluster's
	# containerd is taken to be the only CRI on a trial host. (Their
	# addresses cannot tell: gVisor takes a Pod's address into its own
	# network stack.)
	local ns
	for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ {print $1}'); do
		ip netns del "$ns" 2>/dev/null || true
	done
	ip link del sgkbr0 2>/dev/null || true
	ip link del sgk0 2>/dev/null || true
	nft delete table inet sandgate_kube 2>/dev/null || true
	local saved
	for saved in "$STATE/sysctl.saved" "$STATE/bridge-nf.saved"; do
		if [ -s "$saved" ]; then
			sysctl -q -p "$saved" || true
			rm -f "$saved"
		fi
	done
	# The cluster's objects and Pod state go; the PKI (so the
	# kubeconfig stays valid) and the imported images stay for the next up.
	rm -rf --one-file-system "$STATE/kubelet" "$STATE/cni-ipam" "$STATE/etcd"
}

# One up or down at a time.
mkdir -p "$RUN"
exec 9>"$RUN/lock"
flock 9

case ${1:-} in
build) build ;;
up) up ;;
down) down ;;
status) api_ok || exit 1 ;;
import)
	ctr -a "$RUN/containerd.sock" -n k8s.io images import --all-platforms "$2" >/dev/null
	;;
image)
	shift
	program_image "$@"
	;;
*)
	echo "usage: $0 build|up|down|status|import ARCHIVE|image NAME PROGRAM [HOST_PROGRAM...]" >&2
	exit 2
	;;
esac
