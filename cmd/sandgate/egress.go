package main

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/vault"
)

// vaultKey decodes vault.key; nil when no vault is configured.
func (c *Config) vaultKey() ([]byte, error) {
	if c.Vault.Key == "" {
		return nil, nil
	}
	k, err := hex.DecodeString(c.Vault.Key)
	if err != nil || len(k) != 32 {
		return nil, errors.New("vault.key must be 64 hex digits (32 bytes)")
	}
	return k, nil
}

// vaultConfig is the vault's config, with its key.
func vaultConfig(cfg *Config, key []byte) vault.Config {
	return vault.Config{Endpoint: cfg.MinIO.Endpoint, AccessKey: cfg.MinIO.AccessKey, SecretKey: cfg.MinIO.SecretKey,
		Secure: cfg.MinIO.Secure, Bucket: cfg.Vault.Bucket, Key: key}
}

// caSecret derives the secret the session CAs come from, apart from the
// key that seals credentials.
func caSecret(vaultKey []byte) ([]byte, error) {
	if vaultKey == nil {
		return nil, nil
	}
	return hkdf.Key(sha256.New, vaultKey, nil, "sandgate egress session ca", 32)
}

// sessionCAEnv gives a session the key hashes of its own CA, which its
// Chromium trusts; the key stays here. Every session gets them, not only
// those with credential bindings: a warm pool starts Chromium before it
// knows the bindings its claimant brings. Trusting the CA alone opens
// nothing: the proxy intercepts only bound hosts.
func sessionCAEnv(secret []byte) func(session.Info) []string {
	return func(info session.Info) []string {
		if secret == nil {
			return nil
		}
		ca, err := egress.NewCA(secret, info.ID)
		if err != nil {
			return nil
		}
		return []string{"SANDGATE_CA_SPKI=" + strings.Join(ca.SPKIHashes(), ",")}
	}
}

// egressLimits are the proxy's limits from egress.*: per session, and in
// all, leaving egress.file_reserve of the gateway's open files.
func (c *Config) egressLimits() egress.Limits {
	e := c.Egress
	l := egress.Limits{
		SessionConns:          e.SessionMaxConns,
		SessionConnRate:       e.SessionNewConnsPerSecond,
		SessionBytesPerSecond: e.SessionBytesPerSecond,
		IdleTimeout:           e.IdleTimeout.Duration,
		MaxConns:              e.MaxConns,
	}
	if l.MaxConns == 0 {
		l.MaxConns = egress.ConnsForFiles(e.FileReserve)
	}
	return l
}

// policies finds a session's egress policy by its bridge address.
type policies struct{ m *session.Manager }

func (p policies) Policy(src netip.Addr) (egress.Policy, bool) {
	info, ok := p.m.BySource(src)
	if !ok {
		return egress.Policy{}, false
	}
	return policyOf(info), true
}

// policyOf is what info's session may reach, with which credentials.
func policyOf(info session.Info) egress.Policy {
	pol := egress.Policy{Session: info.ID, Tenant: info.Tenant, Bindings: info.Egress.Credentials}
	for _, a := range info.Egress.Allow {
		if pat, err := egress.ParsePattern(a); err == nil {
			pol.Allow = append(pol.Allow, pat)
		}
	}
	return pol
}

// secrets opens vault credentials for the proxy.
type secrets struct{ v *vault.Vault }

func (s secrets) Credential(ctx context.Context, tenant, id string) (egress.Credential, error) {
	if s.v == nil {
		return egress.Credential{}, errors.New("no vault")
	}
	c, err := s.v.Open(ctx, tenant, id)
	if err != nil {
		return egress.Credential{}, err
	}
	return egress.Credential{Kind: c.Kind, Name: c.FieldName, Username: c.Username, Secret: c.Secret,
		Destinations: gateway.Destinations(c.Meta)}, nil
}

// Placeholder is what fill_credential types for a credential in a
// session; the proxy swaps it for the secret at the bound destinations.
func (s secrets) Placeholder(session, credential string) string {
	if s.v == nil {
		return ""
	}
	return s.v.Placeholder(session, credential)
}

// startEgress runs the egress proxy on the bridge's address, the one
// place the kernel rules let sessions connect to (backend kubernetes:
// egress.listen).
func startEgress(cfg *Config, m *session.Manager, v *vault.Vault, ca []byte, log *slog.Logger) (*egress.Proxy, error) {
	ec, err := egressConfig(cfg, func(id, typ string, f map[string]any) { m.Record(id, typ, f) }, ca, log)
	if err != nil {
		return nil, err
	}
	addr := m.ProxyAddr().String()
	if !m.ProxyAddr().IsValid() {
		addr = cfg.Egress.Listen // a backend with its own network
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("egress proxy on %s: %w", addr, err)
	}
	return serveEgress(ec, l, policies{m}, secrets{v}, log), nil
}

// egressConfig is the proxy's config from egress.*: audit records its
// events.
func egressConfig(cfg *Config, audit func(id, typ string, f map[string]any), ca []byte, log *slog.Logger) (egress.Config, error) {
	ec := egress.Config{CASecret: ca, Log: log.With("component", "egress"), Audit: audit, Limits: cfg.egressLimits()}
	static := map[string][]netip.Addr{}
	for name, addrs := range cfg.Egress.Hosts {
		h, ok := egress.NormalizeHost(name)
		if !ok {
			return ec, fmt.Errorf("config: egress.hosts: %q is not a host name", name)
		}
		for _, a := range addrs {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				return ec, fmt.Errorf("config: egress.hosts.%s: %q is not an IP address", name, a)
			}
			static[h] = append(static[h], ip)
		}
	}
	ec.Resolver = egress.NewResolver(cfg.Egress.DNS, static)
	for _, n := range cfg.Egress.ExemptNetworks {
		p, err := netip.ParsePrefix(n)
		if err != nil {
			return ec, fmt.Errorf("config: egress.exempt_networks: %q is not a CIDR prefix", n)
		}
		ec.Exempt = append(ec.Exempt, p.Masked())
	}
	if cfg.Egress.UpstreamCAFile != "" {
		pem, err := os.ReadFile(cfg.Egress.UpstreamCAFile)
		if err != nil {
			return ec, fmt.Errorf("config: egress.upstream_ca_file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return ec, errors.New("config: egress.upstream_ca_file holds no PEM certificate")
		}
		ec.UpstreamRoots = pool
	}
	return ec, nil
}

// serveEgress runs the egress proxy of config ec on l: pol finds the
// session behind a connection, sec opens its credentials.
func serveEgress(ec egress.Config, l net.Listener, pol egress.Policies, sec egress.Secrets, log *slog.Logger) *egress.Proxy {
	p := egress.New(ec, pol, sec)
	go func() {
		if err := p.Serve(l); err != nil {
			log.Error("egress proxy stopped", "err", err)
		}
	}()
	log.Info("egress proxy listening", "addr", l.Addr().String(), "max_conns", ec.Limits.MaxConns,
		"session_max_conns", ec.Limits.SessionConns, "session_bytes_per_second", ec.Limits.SessionBytesPerSecond, "idle_timeout", ec.Limits.IdleTimeout)
	return p
}

// proxyURL is where sessions of the kubernetes backend reach the egress
// proxy; empty when the gateway serves none there.
func proxyURL(cfg *Config) string {
	if cfg.Backend != "kubernetes" || cfg.Egress.Advertise == "" {
		return ""
	}
	return "http://" + cfg.Egress.Advertise
}
