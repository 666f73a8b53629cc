package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/tenant"
)

// Config is the gateway's whole configuration, read from one JSON file.
type Config struct {
	// Listen is the address the gateway serves on, e.g. "127.0.0.1:8080".
	Listen string `json:"listen"`
	// PublicURL is how clients reach the gateway, e.g. "http://127.0.0.1:8080".
	// Preview URLs and CDP WebSocket URLs are built on it.
	PublicURL string `json:"public_url"`
	// Hosts are the Host header values the gateway answers to; the host of
	// PublicURL is always one of them.
	Hosts []string `json:"hosts"`
	// TrustedProxies are the reverse proxies (IPs or CIDR prefixes) whose
	// X-Forwarded-Host and X-Forwarded-Proto the gateway believes; from
	// any other client those headers are ignored. Empty: none.
	TrustedProxies []string `json:"trusted_proxies"`
	// ReadTimeout bounds reading one request (default 60s); file uploads
	// get UploadTimeout (default 30m) once authenticated.
	ReadTimeout   Duration `json:"read_timeout"`
	UploadTimeout Duration `json:"upload_timeout"`
	// DrainTimeout bounds how long a stopping gateway (SIGTERM) waits for
	// the session creates under way before it closes (default 2m).
	DrainTimeout Duration `json:"drain_timeout"`
	// Limits bound what the gateway takes from a session or a client
	// over CDP and through downloads; zero takes the default.
	Limits struct {
		CDPClientMessageBytes  int64 `json:"cdp_client_message_bytes"`  // 32 MiB
		CDPBrowserMessageBytes int64 `json:"cdp_browser_message_bytes"` // 128 MiB
		DownloadBytes          int64 `json:"download_bytes"`            // 512 MiB
		DownloadsPerSession    int   `json:"downloads_per_session"`     // 1000
	} `json:"limits"`

	Containerd struct {
		Address     string `json:"address"`
		Namespace   string `json:"namespace"`
		Snapshotter string `json:"snapshotter"`
	} `json:"containerd"`

	// Backend runs the sessions' sandboxes: "containerd" (the default,
	// on this host) or "kubernetes" (Pods in Kubernetes.Namespace; see
	// deploy/kubernetes/README.md). Under kubernetes, pools do not freeze,
	// and per-session egress allow lists are refused unless the gateway
	// serves its egress proxy to the cluster (egress.listen).
	Backend    string `json:"backend"`
	Kubernetes struct {
		// Kubeconfig: a path; empty means in-cluster.
		Kubeconfig string `json:"kubeconfig"`
		Namespace  string `json:"namespace"`
		// Image is the session image as the nodes know it (default:
		// the image `sandgate image build` makes).
		Image      string `json:"image"`
		PullPolicy string `json:"pull_policy"` // Always, IfNotPresent (default), Never
		// RuntimeClasses maps kata, gvisor and runc to the RuntimeClass
		// their Pods name (default kata: kata, gvisor: gvisor; runc has
		// none unless named). Seccomp maps a runtime to the Localhost
		// profile its Pods run under (`sandgate seccomp-profile`).
		RuntimeClasses map[string]string `json:"runtime_classes"`
		Seccomp        map[string]string `json:"seccomp"`
		// Advertise is where other gateway replicas reach this one
		// (ip:port; serve's -advertise overrides it). With it, a replica
		// that does not lead stands by, forwarding to the leader, and
		// takes over when the leader dies; without it, a second gateway
		// on the namespace is refused.
		Advertise string `json:"advertise"`
		// Pod is this gateway's own Pod (serve's -pod overrides it;
		// the Deployment passes its name). While this replica leads, the
		// Pod carries the label sandgate.io/gateway-role=leader (and a
		// higher deletion cost).
		Pod string `json:"pod"`
	} `json:"kubernetes"`

	// StateDir holds per-session workspaces.
	StateDir string `json:"state_dir"`
	// Sessions bounds what the gateway remembers of ended sessions: they
	// answer GET and events for retention (default 1h), at most max_ended
	// (default 1000) of them; their artifacts stay in the store.
	Sessions struct {
		Retention Duration `json:"retention"`
		MaxEnded  int      `json:"max_ended"`
	} `json:"sessions"`
	// Pools are warm pools: sessions of one shape started ahead, each
	// handed to the first create request of that shape (and never to a
	// second). A request of another shape starts cold.
	Pools []struct {
		Kind    string `json:"kind"`    // default browser
		Runtime string `json:"runtime"` // default: default_runtime
		Screen  struct {
			Width  int `json:"width"`
			Height int `json:"height"`
		} `json:"screen"` // default 1280x800
		Size int `json:"size"`
	} `json:"pools"`
	// PoolLimits bound all pools together: pooled sessions at once
	// (default: the sum of the sizes), the host memory a refill leaves
	// available besides the new session's limit (default 1024 MB), and
	// the age at which an unclaimed pooled session is replaced (30m).
	// With freeze, pooled sessions are frozen while they wait (no CPU;
	// a thawed Chromium is slow for seconds after the claim). A refill
	// starts refill_delay after the claim it replaces (default 1s), so
	// the claimed session's first exchanges do not share the CPU with a
	// session start.
	PoolLimits struct {
		Freeze               bool     `json:"freeze"`
		MaxSessions          int      `json:"max_sessions"`
		MinAvailableMemoryMB int      `json:"min_available_memory_mb"`
		MaxAge               Duration `json:"max_age"`
		RefillDelay          Duration `json:"refill_delay"`
	} `json:"pool_limits"`
	// CacheDir holds built session image archives.
	CacheDir string `json:"cache_dir"`

	Network struct {
		Bridge    string `json:"bridge"`
		Subnet    string `json:"subnet"`
		PluginDir string `json:"plugin_dir"`
		NetNSDir  string `json:"netns_dir"`
	} `json:"network"`

	// DefaultRuntime is used when a create request names none. Empty means
	// the strongest usable handler (kata, then gvisor); runc is used only
	// when named here.
	DefaultRuntime string `json:"default_runtime"`
	Runtimes       struct {
		Gvisor struct {
			// Runsc is the path of a runsc wrapper the runc shim runs
			// instead of runc.
			Runsc string `json:"runsc"`
		} `json:"gvisor"`
	} `json:"runtimes"`

	MinIO struct {
		Endpoint   string   `json:"endpoint"`
		AccessKey  string   `json:"access_key"`
		SecretKey  string   `json:"secret_key"`
		Bucket     string   `json:"bucket"`
		Secure     bool     `json:"secure"`
		PresignTTL Duration `json:"presign_ttl"`
	} `json:"minio"`

	Tokens struct {
		// ActiveKey names the key that signs new preview tokens; all keys
		// verify, so a rotated-out key keeps working until removed.
		ActiveKey string            `json:"active_key"`
		Keys      map[string]string `json:"keys"`
	} `json:"tokens"`

	Egress struct {
		// ProxyPort is the egress proxy's port on the bridge's address.
		ProxyPort uint16 `json:"proxy_port"`
		// Under backend kubernetes: Listen is where the proxy listens
		// (":3128" in a gateway Pod) and Advertise the ip:port its
		// sessions are told (the cluster IP of the proxy's Service, say
		// "10.96.12.34:3128"). Without them there is no
		// proxy there, and allow lists and credential bindings are
		// refused. The containerd backend's proxy is on its bridge.
		Listen    string `json:"listen"`
		Advertise string `json:"advertise"`
		// DNS is the resolver the proxy asks ("ip:53"); empty: the host's.
		DNS string `json:"dns"`
		// Hosts pins names to addresses, before DNS.
		Hosts map[string][]string `json:"hosts"`
		// ExemptNetworks are private networks sessions may reach when a
		// name on their allow list resolves there (a staging network).
		ExemptNetworks []string `json:"exempt_networks"`
		// UpstreamCAFile adds CAs that intercepted hosts are verified
		// against, besides the system's.
		UpstreamCAFile string `json:"upstream_ca_file"`

		// Limits per session at the proxy: connections held at once,
		// new connections per second, bytes per second in each
		// direction, and the idle time after which a tunnel or a
		// keep-alive connection closes.
		SessionMaxConns          int      `json:"session_max_conns"`
		SessionNewConnsPerSecond float64  `json:"session_new_conns_per_second"`
		SessionBytesPerSecond    int64    `json:"session_bytes_per_second"`
		IdleTimeout              Duration `json:"idle_timeout"`
		// MaxConns bounds the proxy's connections of all sessions, the
		// sessions' and the upstream ones. Zero: the gateway's open
		// file limit less FileReserve, which no session can reach.
		MaxConns    int `json:"max_conns"`
		FileReserve int `json:"file_reserve"`
	} `json:"egress"`

	Recording struct {
		// FPS of recordings (default 5) and the length of the segments
		// streamed to MinIO while a session runs (default 2s).
		FPS     int      `json:"fps"`
		Segment Duration `json:"segment"`
	} `json:"recording"`

	// RetentionCheck is how often expired artifacts are looked for.
	RetentionCheck Duration `json:"retention_check"`

	Vault struct {
		// Key seals stored credentials and derives the session CAs: 64
		// hex digits. Without it, credentials are unavailable.
		Key    string `json:"key"`
		Bucket string `json:"bucket"`
	} `json:"vault"`

	// Profiles: browser profiles, sealed under a key derived from
	// vault.key (without it, profiles are unavailable), and the bounds of
	// what a profile's save and a workspace snapshot may hold.
	Profiles struct {
		Bucket string `json:"bucket"`
		// KeepVersions is how many versions a profile keeps (default 5).
		KeepVersions int `json:"keep_versions"`
		// MaxBytes bounds a profile (default 128 MiB); MaxSnapshotBytes
		// a workspace snapshot (default 1 GiB); MaxEntries the files of
		// either (default 100000).
		MaxBytes         int64 `json:"max_bytes"`
		MaxSnapshotBytes int64 `json:"max_snapshot_bytes"`
		MaxEntries       int   `json:"max_entries"`
	} `json:"profiles"`

	// Capacity bounds the tenant sessions the gateway runs at once, all
	// tenants together (0: no limit; pooled sessions do not count). A
	// create beyond it waits in line like one over its tenant's quota,
	// and /readyz answers 503 while the gateway is full.
	Capacity struct {
		MaxSessions int `json:"max_sessions"`
		// MinFreeDiskMB is the free space a create needs in the state
		// directory and containerd's root (default 1024; -1: no check).
		// Below it creates answer 503 and /readyz says why.
		MinFreeDiskMB int `json:"min_free_disk_mb"`
	} `json:"capacity"`

	Tenants []TenantConfig `json:"tenants"`
	// AdminKeySHA256 are hex SHA-256 digests of the admin API's keys
	// (/admin/v1: tenants and their API keys at runtime). None: the
	// admin API is off.
	AdminKeySHA256 []string `json:"admin_key_sha256"`
}

// TenantConfig is one tenant: its hashed API keys and limits.
type TenantConfig struct {
	Name string `json:"name"`
	// APIKeySHA256 are hex SHA-256 digests of the tenant's API keys.
	APIKeySHA256 []string `json:"api_key_sha256"`
	MaxSessions  int      `json:"max_sessions"`
	// MaxCPUs and MaxMemoryMB bound the resources of the tenant's
	// sessions together, as they asked for them (0: no limit).
	MaxCPUs     float64 `json:"max_cpus"`
	MaxMemoryMB int     `json:"max_memory_mb"`
	// MaxRecordings bounds its recording sessions at once,
	// MaxCreatesPerMinute its creates in a minute, MaxArtifactBytes what
	// its artifacts may take in the store (0: no limit).
	MaxRecordings       int      `json:"max_recordings"`
	MaxCreatesPerMinute int      `json:"max_creates_per_minute"`
	MaxArtifactBytes    int64    `json:"max_artifact_bytes"`
	DefaultTTL          Duration `json:"default_ttl"`
	MaxTTL              Duration `json:"max_ttl"`
	MaxIdle             Duration `json:"max_idle"`
	// AllowRoot lets the tenant run commands as root (still without
	// capabilities) in its sessions.
	AllowRoot bool `json:"allow_root"`
	// MaxFileBytes bounds one file upload (default 1 GiB).
	MaxFileBytes int64 `json:"max_file_bytes"`
	// EgressAllow is added to the allow list of every session of the
	// tenant: "host:port" or "*.example.com:443".
	EgressAllow []string `json:"egress_allow"`
	// ArtifactRetention removes the tenant's artifacts this long after
	// they were stored; zero keeps them.
	ArtifactRetention Duration `json:"artifact_retention"`
}

// Duration is a time.Duration written as "90s" or "10m" in JSON.
type Duration struct{ time.Duration }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"90s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// LoadConfig reads and checks a config file; unknown fields are errors.
func LoadConfig(path string) (*Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c := defaultConfig()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

func defaultConfig() *Config {
	c := &Config{Listen: "127.0.0.1:8080", PublicURL: "http://127.0.0.1:8080", StateDir: "/var/lib/sandgate", CacheDir: "/var/cache/sandgate"}
	c.Containerd.Address = "/run/containerd/containerd.sock"
	c.Containerd.Namespace = "sandgate"
	c.Containerd.Snapshotter = "overlayfs"
	c.Backend = "containerd"
	c.Kubernetes.PullPolicy = "IfNotPresent"
	c.Kubernetes.RuntimeClasses = map[string]string{"kata": "kata", "gvisor": "gvisor"}
	c.Network.Bridge = "sandgate0"
	c.Network.Subnet = "10.231.0.0/16"
	c.Network.PluginDir = "/usr/lib/cni"
	c.Network.NetNSDir = "/run/netns"
	c.ReadTimeout = Duration{gateway.DefaultReadTimeout}
	c.UploadTimeout = Duration{gateway.DefaultUploadTimeout}
	c.DrainTimeout = Duration{2 * time.Minute}
	c.MinIO.Bucket = "sandgate-artifacts"
	c.MinIO.PresignTTL = Duration{5 * time.Minute}
	c.Egress.ProxyPort = session.DefaultProxyPort
	c.Egress.SessionMaxConns = egress.DefaultSessionConns
	c.Egress.SessionNewConnsPerSecond = egress.DefaultSessionConnRate
	c.Egress.SessionBytesPerSecond = egress.DefaultSessionBytesPerSecond
	c.Egress.IdleTimeout = Duration{egress.DefaultIdleTimeout}
	c.Egress.FileReserve = egress.DefaultFileReserve
	c.Vault.Bucket = "sandgate-vault"
	c.Profiles.Bucket = "sandgate-profiles"
	return c
}

func (c *Config) check() error {
	var errs []error
	if c.MinIO.Endpoint == "" {
		errs = append(errs, errors.New("minio.endpoint is required"))
	}
	if len(c.Tokens.Keys) == 0 || c.Tokens.Keys[c.Tokens.ActiveKey] == "" {
		errs = append(errs, errors.New("tokens.active_key must name one of tokens.keys"))
	}
	for id, k := range c.Tokens.Keys {
		if len(k) < 32 {
			errs = append(errs, fmt.Errorf("tokens.keys.%s is shorter than 32 characters", id))
		}
	}
	if len(c.Tenants) == 0 && len(c.AdminKeySHA256) == 0 {
		errs = append(errs, errors.New("at least one tenant, or an admin key to add tenants with, is required"))
	}
	for _, h := range c.AdminKeySHA256 {
		if b, err := hex.DecodeString(h); err != nil || len(b) != 32 {
			errs = append(errs, errors.New("admin_key_sha256: each must be 64 hex digits (sandgate hash-key prints one)"))
			break
		}
	}
	admin := map[string]bool{}
	for _, h := range c.AdminKeySHA256 {
		admin[strings.ToLower(h)] = true
	}
	for _, t := range c.Tenants {
		if t.Name == "" || len(t.APIKeySHA256) == 0 {
			errs = append(errs, errors.New("every tenant needs a name and an api_key_sha256"))
		}
		if t.Name != "" && !tenant.ValidName(t.Name) {
			errs = append(errs, fmt.Errorf("tenant %q: a name is 1 to 63 of a-z, 0-9 and -, starting with a letter or digit", t.Name))
		}
		for _, h := range t.APIKeySHA256 {
			if b, err := hex.DecodeString(h); err != nil || len(b) != 32 {
				errs = append(errs, fmt.Errorf("tenant %s: api_key_sha256: each must be 64 hex digits (sandgate hash-key prints one)", t.Name))
				break
			}
			if admin[strings.ToLower(h)] {
				errs = append(errs, fmt.Errorf("tenant %s: one of its keys is also an admin key; use separate keys", t.Name))
			}
		}
		if t.MaxSessions < 0 || t.MaxCPUs < 0 || t.MaxMemoryMB < 0 || t.MaxRecordings < 0 || t.MaxCreatesPerMinute < 0 || t.MaxArtifactBytes < 0 {
			errs = append(errs, fmt.Errorf("tenant %s: the max_* quotas must not be negative (0: no limit)", t.Name))
		}
		for _, a := range t.EgressAllow {
			if _, err := egress.ParsePattern(a); err != nil {
				errs = append(errs, fmt.Errorf("tenant %s: egress_allow: %w", t.Name, err))
			}
		}
	}
	if e := c.Egress; e.SessionMaxConns < 1 || e.SessionNewConnsPerSecond <= 0 || e.SessionBytesPerSecond < 64<<10 ||
		e.IdleTimeout.Duration < time.Second || e.MaxConns < 0 || e.FileReserve < 0 {
		errs = append(errs, errors.New("egress: session_max_conns and session_new_conns_per_second must be positive, session_bytes_per_second at least 65536, idle_timeout at least 1s, max_conns and file_reserve not negative"))
	}
	for _, p := range c.TrustedProxies {
		if _, err := netip.ParsePrefix(p); err != nil {
			if _, err := netip.ParseAddr(p); err != nil {
				errs = append(errs, fmt.Errorf("trusted_proxies: %q is not an IP address or CIDR prefix", p))
			}
		}
	}
	if c.Capacity.MaxSessions < 0 {
		errs = append(errs, errors.New("capacity: max_sessions must not be negative (0: no limit)"))
	}
	if l := c.Limits; l.CDPClientMessageBytes < 0 || l.CDPBrowserMessageBytes < 0 || l.DownloadBytes < 0 || l.DownloadsPerSession < 0 {
		errs = append(errs, errors.New("limits: sizes and counts must not be negative (0 takes the default)"))
	}
	if c.DrainTimeout.Duration < 0 || c.DrainTimeout.Duration > time.Hour {
		errs = append(errs, errors.New("drain_timeout must be between 0 and 1h"))
	}
	if c.ReadTimeout.Duration < time.Second || c.UploadTimeout.Duration < c.ReadTimeout.Duration {
		errs = append(errs, errors.New("read_timeout must be at least 1s and upload_timeout at least read_timeout"))
	}
	if _, err := c.vaultKey(); err != nil {
		errs = append(errs, err)
	}
	switch c.DefaultRuntime {
	case "", "runc", "gvisor", "kata":
	default:
		errs = append(errs, fmt.Errorf("default_runtime %q is not one of kata, gvisor, runc", c.DefaultRuntime))
	}
	switch c.Backend {
	case "containerd":
		if c.Egress.Listen != "" || c.Egress.Advertise != "" {
			errs = append(errs, errors.New("egress.listen and egress.advertise are for backend kubernetes; the containerd backend's proxy listens on its bridge (egress.proxy_port)"))
		}
		if c.Kubernetes.Advertise != "" || c.Kubernetes.Pod != "" {
			errs = append(errs, errors.New("kubernetes.advertise and kubernetes.pod are for backend kubernetes (gateway replicas)"))
		}
	case "kubernetes":
		if (c.Egress.Listen == "") != (c.Egress.Advertise == "") {
			errs = append(errs, errors.New("egress.listen and egress.advertise go together: where the proxy listens and where sessions reach it"))
		}
		if c.Egress.Advertise != "" {
			// An address, not a name: session Pods reach nothing but the
			// proxy, no DNS (the proxy's Service's cluster IP, say).
			if ap, err := netip.ParseAddrPort(c.Egress.Advertise); err != nil {
				errs = append(errs, fmt.Errorf("egress.advertise %q is not ip:port (sessions reach no DNS to look a name up)", c.Egress.Advertise))
			} else if ap.Addr().IsUnspecified() || ap.Port() == 0 {
				errs = append(errs, fmt.Errorf("egress.advertise %q: sessions need an address and a port they can reach", c.Egress.Advertise))
			}
			if _, err := net.ResolveTCPAddr("tcp", c.Egress.Listen); err != nil {
				errs = append(errs, fmt.Errorf("egress.listen %q: %v", c.Egress.Listen, err))
			}
		}
		if c.Kubernetes.Advertise != "" {
			if err := checkAdvertise(c.Kubernetes.Advertise); err != nil {
				errs = append(errs, fmt.Errorf("kubernetes.advertise: %w", err))
			}
		}
		if c.Kubernetes.Pod != "" {
			if err := checkPodName(c.Kubernetes.Pod); err != nil {
				errs = append(errs, fmt.Errorf("kubernetes.pod: %w", err))
			}
		}
		if c.Kubernetes.Namespace == "" {
			errs = append(errs, errors.New("kubernetes.namespace is required with backend kubernetes"))
		}
		if len(c.Pools) > 0 && c.PoolLimits.Freeze {
			errs = append(errs, errors.New("pool_limits.freeze needs backend containerd: a Pod cannot be paused"))
		}
		switch c.Kubernetes.PullPolicy {
		case "Always", "IfNotPresent", "Never":
		default:
			errs = append(errs, fmt.Errorf("kubernetes.pull_policy %q is not one of Always, IfNotPresent, Never", c.Kubernetes.PullPolicy))
		}
	default:
		errs = append(errs, fmt.Errorf("backend %q is not one of containerd, kubernetes", c.Backend))
	}
	for i, p := range c.Pools {
		if p.Size < 0 || p.Size > 64 {
			errs = append(errs, fmt.Errorf("pools[%d].size must be between 0 and 64", i))
		}
	}
	if l := c.PoolLimits; l.MaxSessions < 0 || l.MinAvailableMemoryMB < 0 || (l.MaxAge.Duration != 0 && l.MaxAge.Duration < time.Minute) || l.RefillDelay.Duration < 0 || l.RefillDelay.Duration > time.Minute {
		errs = append(errs, errors.New("pool_limits: max_sessions and min_available_memory_mb must not be negative, max_age at least 1m, refill_delay between 0 and 1m"))
	}
	return errors.Join(errs...)
}

// checkAdvertise checks an address other replicas reach a gateway at.
// checkPodName: a Pod's name, as the API server takes it.
func checkPodName(name string) error {
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return fmt.Errorf("%q is not a Pod's name: %s", name, strings.Join(msgs, "; "))
	}
	return nil
}

func checkAdvertise(a string) error {
	ap, err := netip.ParseAddrPort(a)
	if err != nil {
		return fmt.Errorf("%q is not ip:port", a)
	}
	if ap.Addr().IsUnspecified() || ap.Port() == 0 {
		return fmt.Errorf("%q: other replicas need an address and a port they can reach", a)
	}
	return nil
}

// listenPort is the port of a listen address (host:port): a replica's
// egress proxy listens on the same one in every replica's Pod.
func listenPort(listen string) (uint16, error) {
	_, p, err := net.SplitHostPort(listen)
	if err != nil {
		return 0, fmt.Errorf("egress.listen %q: %w", listen, err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("egress.listen %q: no port", listen)
	}
	return uint16(n), nil
}
