package session

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	gocni "github.com/containerd/go-cni"
	"github.com/sandgate/sandgate/ids"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetworkConfig says how session network namespaces are wired.
type NetworkConfig struct {
	Bridge    string // host bridge, e.g. "sandgate0"
	Subnet    string // session addresses, e.g. "10.231.0.0/16"
	PluginDir string // CNI plugin binaries
	NetNSDir  string // where named namespaces live, normally /run/netns
	IPAMDir   string // host-local IPAM state
}

// network creates and removes one namespace per session on a CNI bridge.
// Namespaces are named prefix+session id; the prefix is the containerd
// namespace's, so two gateways on one host never take each other's.
type network struct {
	cfg    NetworkConfig
	cni    gocni.CNI
	prefix string
	// gateway is the bridge's own address, where the egress proxy listens.
	gateway netip.Addr
}

func newNetwork(cfg NetworkConfig, prefix string) (*network, error) {
	if cfg.NetNSDir != "/run/netns" && cfg.NetNSDir != "/var/run/netns" {
		return nil, fmt.Errorf("netns dir %q: only /run/netns is supported", cfg.NetNSDir)
	}
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "sandgate",
  "plugins": [{
    "type": "bridge",
    "bridge": %q,
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}
  }]
}`, cfg.Bridge, cfg.Subnet, cfg.IPAMDir)
	if err := sharedNetNSDir(cfg.NetNSDir); err != nil {
		return nil, err
	}
	gw, err := gatewayAddr(cfg.Subnet)
	if err != nil {
		return nil, err
	}
	if err := ensureBridge(cfg.Bridge, gw); err != nil {
		return nil, err
	}
	c, err := gocni.New(gocni.WithPluginDir([]string{cfg.PluginDir}), gocni.WithInterfacePrefix("eth"))
	if err != nil {
		return nil, fmt.Errorf("cni: %w", err)
	}
	if err := c.Load(gocni.WithLoNetwork, gocni.WithConfListBytes([]byte(conf))); err != nil {
		return nil, fmt.Errorf("cni config: %w", err)
	}
	return &network{cfg: cfg, cni: c, prefix: prefix, gateway: gw.Addr()}, nil
}

// gatewayAddr is the bridge's address: the subnet's first host, which is
// what CNI's host-local IPAM gives the gateway.
func gatewayAddr(subnet string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(subnet)
	if err != nil || !p.Addr().Is4() || p.Bits() > 29 {
		return netip.Prefix{}, fmt.Errorf("network subnet %q: want an IPv4 prefix of /29 or larger", subnet)
	}
	p = p.Masked()
	return netip.PrefixFrom(p.Addr().Next(), p.Bits()), nil
}

// ensureBridge creates the bridge with its address before any session
// exists, so that the egress proxy can listen on it from the start. The
// CNI bridge plugin then finds it ready.
func ensureBridge(name string, addr netip.Prefix) error {
	link, err := netlink.LinkByName(name)
	if _, missing := err.(netlink.LinkNotFoundError); missing {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("create bridge %s: %w", name, err)
		}
		link, err = netlink.LinkByName(name)
	}
	if err != nil {
		return fmt.Errorf("bridge %s: %w", name, err)
	}
	want := &netlink.Addr{IPNet: &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), 32)}}
	if err := netlink.AddrReplace(link, want); err != nil {
		return fmt.Errorf("address bridge %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("bring up bridge %s: %w", name, err)
	}
	return nil
}

func (n *network) nsName(id string) string { return n.prefix + id }

func (n *network) nsPath(id string) string { return filepath.Join(n.cfg.NetNSDir, n.nsName(id)) }

// create makes the session's namespace and attaches it to the bridge,
// returning the session's address. On error nothing is left behind.
func (n *network) create(ctx context.Context, id string) (netip.Addr, error) {
	if err := newNamedNetNS(n.nsName(id)); err != nil {
		return netip.Addr{}, fmt.Errorf("create netns: %w", err)
	}
	res, err := n.cni.Setup(ctx, id, n.nsPath(id))
	if err != nil {
		n.remove(context.WithoutCancel(ctx), id)
		return netip.Addr{}, fmt.Errorf("cni add: %w", err)
	}
	// Sessions share the bridge but must not reach each other: their
	// host-side veths are isolated bridge ports, which talk only to the
	// host, never to one another.
	isolated := false
	for name, iface := range res.Interfaces {
		// go-cni adds an empty placeholder for its default interface name.
		if iface.Sandbox != "" || iface.Mac == "" || name == n.cfg.Bridge {
			continue
		}
		link, err := netlink.LinkByName(name)
		if err == nil {
			err = netlink.LinkSetIsolated(link, true)
		}
		if err != nil {
			n.remove(context.WithoutCancel(ctx), id)
			return netip.Addr{}, fmt.Errorf("isolate bridge port %s: %w", name, err)
		}
		isolated = true
	}
	if !isolated {
		n.remove(context.WithoutCancel(ctx), id)
		return netip.Addr{}, errors.New("cni reported no host-side interface to isolate")
	}
	for name, iface := range res.Interfaces {
		if !strings.HasPrefix(name, "eth") || iface.Sandbox == "" {
			continue
		}
		for _, ipc := range iface.IPConfigs {
			if a, ok := netip.AddrFromSlice(ipc.IP); ok && a.Unmap().Is4() {
				return a.Unmap(), nil
			}
		}
	}
	n.remove(context.WithoutCancel(ctx), id)
	return netip.Addr{}, errors.New("cni gave the session no IPv4 address")
}

// remove detaches and deletes the namespace; a missing one is not an error.
// CNI DEL runs even without the namespace, so host-local releases the
// address (a leftover reservation blocks the next session of that id).
func (n *network) remove(ctx context.Context, id string) error {
	path := n.nsPath(id)
	cniPath := ""
	var st unix.Statfs_t
	if unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC {
		cniPath = path
	}
	var errs []error
	if err := n.cni.Remove(ctx, id, cniPath); err != nil {
		errs = append(errs, fmt.Errorf("cni del: %w", err))
	}
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		errs = append(errs, fmt.Errorf("unmount netns: %w", err))
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove netns: %w", err))
	}
	return errors.Join(errs...)
}

// sharedNetNSDir makes the namespace directory a shared mount, as
// iproute2 does, so that unmounting a namespace reaches the copies that
// container mount namespaces took; without it removal fails with EBUSY.
func sharedNetNSDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == unix.EINVAL {
		// Not a mount point yet: bind it onto itself first.
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", dir, err)
		}
		err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// leftovers lists session ids whose namespaces exist.
func (n *network) leftovers() []string {
	entries, _ := os.ReadDir(n.cfg.NetNSDir)
	var out []string
	for _, e := range entries {
		id, ok := strings.CutPrefix(e.Name(), n.prefix)
		if ok && ids.IsSession(id) {
			out = append(out, id)
		}
	}
	return out
}

// newNamedNetNS creates /run/netns/name without moving this process:
// the work happens on a locked thread that is restored afterwards.
func newNamedNetNS(name string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		ns, err := netns.NewNamed(name)
		if err != nil {
			// NewNamed may have switched the thread already.
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
			errc <- err
			return
		}
		ns.Close()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: it dies with this goroutine
			// instead of running other code in the wrong namespace.
			errc <- fmt.Errorf("restore netns: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	return <-errc
}
