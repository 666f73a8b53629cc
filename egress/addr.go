package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
)

// forbidden are the destinations the proxy never connects to, whatever a
// name resolves to: this host, private and shared networks, link-local
// (with the cloud metadata addresses), multicast and reserved space.
var forbidden = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local or metadata"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "NAT64"},
	{netip.MustParsePrefix("fc00::/7"), "private"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "metadata"},
}

// Forbidden returns why the proxy refuses an address, or "" if it may
// connect. IPv4-mapped IPv6 addresses are judged as the IPv4 they carry.
func Forbidden(a netip.Addr, exempt []netip.Prefix) string {
	a = a.Unmap()
	for _, p := range exempt {
		if p.Contains(a) {
			return ""
		}
	}
	for _, f := range forbidden {
		if f.prefix.Contains(a) {
			return f.why
		}
	}
	return ""
}

// Resolver turns host names into addresses. Static entries (for names an
// operator pins) win over DNS; without a DNS server the system's is used.
type Resolver struct {
	Static map[string][]netip.Addr
	dns    *net.Resolver
}

// NewResolver uses server ("ip:53") for DNS, or the system's when empty.
func NewResolver(server string, static map[string][]netip.Addr) *Resolver {
	r := &Resolver{Static: static, dns: net.DefaultResolver}
	if server != "" {
		r.dns = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, server)
		}}
	}
	return r
}

// Lookup resolves a normalised host; an IP literal resolves to itself.
func (r *Resolver) Lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	if as, ok := r.Static[host]; ok {
		return as, nil
	}
	as, err := r.dns.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	return as, nil
}
