package session

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// firewall holds the kernel rules that make the egress proxy the only way
// out of a session. One nftables table per gateway (named after its
// containerd namespace) on the host:
//
//	input:   from the bridge, only replies and TCP to the proxy's address
//	         and port are accepted; everything else (DNS, other host
//	         ports, ICMP, IPv6) is dropped.
//	forward: nothing is routed from or to the bridge, so no packet of a
//	         session reaches another network, the metadata address or
//	         another session (bridge ports are isolated as well).
//
// The rules live outside the sessions' namespaces, so nothing in a session
// can change them, and they hold for every runtime: gVisor sends its
// packets through the veth from its own network stack, past any rule inside
// the namespace, but not past the host's.
type firewall struct {
	table  string
	bridge string
	proxy  netip.AddrPort
}

func newFirewall(namespace, bridge string, proxy netip.AddrPort) *firewall {
	return &firewall{table: "sandgate_" + strings.ReplaceAll(namespace, "-", "_"), bridge: bridge, proxy: proxy}
}

// install replaces the gateway's table with a fresh one in one transaction.
func (f *firewall) install() error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: f.table}
	// Adding then deleting makes the delete succeed whether or not the
	// table existed; the new table follows in the same transaction.
	conn.AddTable(t)
	conn.DelTable(t)
	t = conn.AddTable(t)
	accept := nftables.ChainPolicyAccept
	input := conn.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	forward := conn.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})

	fromBridge := ifaceIs(expr.MetaKeyIIFNAME, f.bridge)
	rule := func(c *nftables.Chain, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: all})
	}
	rule(input, fromBridge, established(), verdict(expr.VerdictAccept))
	rule(input, fromBridge, toProxy(f.proxy), verdict(expr.VerdictAccept))
	rule(input, fromBridge, counted(), verdict(expr.VerdictDrop))
	rule(forward, fromBridge, counted(), verdict(expr.VerdictDrop))
	rule(forward, ifaceIs(expr.MetaKeyOIFNAME, f.bridge), counted(), verdict(expr.VerdictDrop))
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("install nftables table %s: %w", f.table, err)
	}
	return nil
}

func ifaceIs(key expr.MetaKey, name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

func established() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// toProxy matches IPv4 TCP to the proxy's address and port.
func toProxy(p netip.AddrPort) []expr.Any {
	addr := p.Addr().As4()
	port := make([]byte, 2)
	binary.BigEndian.PutUint16(port, p.Port())
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:]},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port},
	}
}

func counted() []expr.Any { return []expr.Any{&expr.Counter{}} }

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }
