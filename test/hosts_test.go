package test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netns"
)

// The test's own hosts: a network namespace holding every address the
// tests send session traffic to, so nothing leaves the machine even if a
// rule under test is broken. The gateway's egress proxy reaches them
// through a veth; sessions may reach them only through the proxy.
//
// Forwarded traffic from the test bridge is also routed into this
// namespace whatever its destination (a policy rule on iif sgtest0), so a
// broken firewall sends session packets here, never off the host.
const (
	hostsNS      = "sgtest-hosts"
	hostsVeth    = "sgth0"
	hostsGW      = "10.233.0.1"
	hostsPrivate = "10.233.0.2" // private: the proxy must refuse it
	// TEST-NET-2 addresses, each routed alone (/32) into the namespace:
	// the machine's package registries live in TEST-NET-3 here, so a
	// wider route would take them away from the image build.
	sitesIP    = "198.51.100.10"
	otherIP    = "198.51.100.11"
	dnsIP      = "198.51.100.53"
	metadataIP = "169.254.169.254"
	hostsIPv6  = "2001:db8:5a::10"
	hostsTable = "2323"
)

// Names the proxy resolves (config egress.hosts) to the test's hosts.
var testHostNames = map[string][]string{
	"pages.sandgate.test":       {sitesIP},
	"site.sandgate.test":        {sitesIP},
	"intercepted.sandgate.test": {sitesIP},
	"basic.sandgate.test":       {sitesIP},
	"bearer.sandgate.test":      {sitesIP},
	"login.sandgate.test":       {sitesIP},
	"other.sandgate.test":       {otherIP},
	"private.sandgate.test":     {hostsPrivate},
	"metadata.sandgate.test":    {metadataIP},
	"mixed.sandgate.test":       {hostsPrivate, metadataIP},
}

type testHosts struct {
	caFile  string
	caPool  *x509.CertPool
	servers []*http.Server
	closers []func()
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// removeTestHosts undoes newTestHosts; it is safe to run on a host
// without them (a previous run that died).
func removeTestHosts() {
	exec.Command("ip", "rule", "del", "iif", testBridge, "lookup", hostsTable).Run()
	exec.Command("ip", "route", "flush", "table", hostsTable).Run()
	for _, a := range []string{sitesIP, otherIP, dnsIP} {
		exec.Command("ip", "route", "del", a+"/32").Run()
	}
	exec.Command("ip", "netns", "del", hostsNS).Run()
}

func newTestHosts(dir string) (*testHosts, error) {
	removeTestHosts()
	steps := [][]string{
		{"ip", "netns", "add", hostsNS},
		{"ip", "link", "add", hostsVeth, "type", "veth", "peer", "name", "eth0", "netns", hostsNS},
		{"ip", "addr", "add", hostsGW + "/24", "dev", hostsVeth},
		{"ip", "-6", "addr", "add", "2001:db8:5a::1/64", "dev", hostsVeth, "nodad"},
		{"ip", "link", "set", hostsVeth, "up"},
		{"ip", "netns", "exec", hostsNS, "ip", "link", "set", "lo", "up"},
		{"ip", "netns", "exec", hostsNS, "ip", "addr", "add", hostsPrivate + "/24", "dev", "eth0"},
		{"ip", "netns", "exec", hostsNS, "ip", "-6", "addr", "add", hostsIPv6 + "/64", "dev", "eth0", "nodad"},
		{"ip", "netns", "exec", hostsNS, "ip", "link", "set", "eth0", "up"},
		{"ip", "netns", "exec", hostsNS, "ip", "route", "add", "default", "via", hostsGW},
		{"ip", "route", "add", sitesIP + "/32", "via", hostsPrivate},
		{"ip", "route", "add", otherIP + "/32", "via", hostsPrivate},
		{"ip", "route", "add", dnsIP + "/32", "via", hostsPrivate},
		{"ip", "route", "add", "default", "via", hostsPrivate, "dev", hostsVeth, "onlink", "table", hostsTable},
		{"ip", "rule", "add", "iif", testBridge, "lookup", hostsTable},
	}
	for _, a := range []string{sitesIP, otherIP, dnsIP, metadataIP} {
		steps = append(steps, []string{"ip", "netns", "exec", hostsNS, "ip", "addr", "add", a + "/32", "dev", "eth0"})
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			removeTestHosts()
			return nil, err
		}
	}
	h := &testHosts{}
	if err := h.makeCA(dir); err != nil {
		return nil, err
	}
	return h, nil
}

func (h *testHosts) close() {
	for _, s := range h.servers {
		s.Close()
	}
	for _, c := range h.closers {
		c()
	}
	removeTestHosts()
}

// listenIn opens a listener inside the hosts namespace: the socket keeps
// its namespace after the thread returns to the host's.
func listenIn(network, addr string) (net.Listener, net.PacketConn, error) {
	return listenInNS(hostsNS, network, addr)
}

// listenInNS opens a listener inside the named network namespace.
func listenInNS(name, network, addr string) (net.Listener, net.PacketConn, error) {
	type result struct {
		l   net.Listener
		pc  net.PacketConn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- result{err: err}
			return
		}
		target, err := netns.GetFromName(name)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			ch <- result{err: err}
			return
		}
		var r result
		if strings.HasPrefix(network, "udp") {
			r.pc, r.err = net.ListenPacket(network, addr)
		} else {
			r.l, r.err = net.Listen(network, addr)
		}
		if err := netns.Set(orig); err == nil {
			runtime.UnlockOSThread() // else the thread dies with the goroutine
		}
		ch <- r
	}()
	r := <-ch
	return r.l, r.pc, r.err
}

// serve runs handler on addr inside the hosts namespace, with TLS when
// cert is set.
func (h *testHosts) serve(addr string, cert *tls.Certificate, handler http.Handler) error {
	l, _, err := listenIn("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s in %s: %w", addr, hostsNS, err)
	}
	if cert != nil {
		l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{*cert}})
	}
	// Handshakes Chromium refuses (the test CA is not its) are expected.
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	h.servers = append(h.servers, srv)
	go srv.Serve(l)
	return nil
}

// makeCA creates the test's own CA for its HTTPS sites; the gateway
// trusts it as an upstream CA (egress.upstream_ca_file).
func (h *testHosts) makeCA(dir string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Sandgate test sites CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	ca, _ := x509.ParseCertificate(der)
	h.caPool = x509.NewCertPool()
	h.caPool.AddCert(ca)
	h.caFile = filepath.Join(dir, "test-sites-ca.pem")
	if err := os.WriteFile(h.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	var names []string
	for n := range testHostNames {
		names = append(names, n)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "sandgate test sites"},
		DNSNames: names, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &leafKey.PublicKey, key)
	if err != nil {
		return err
	}
	siteCert = &tls.Certificate{Certificate: [][]byte{leafDER, der}, PrivateKey: leafKey}
	return nil
}

// siteCert is the HTTPS sites' certificate, signed by the test CA.
var siteCert *tls.Certificate
