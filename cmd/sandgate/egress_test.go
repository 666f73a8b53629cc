package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/egress"
)

const baseConfig = `{"minio": {"endpoint": "127.0.0.1:9000"}, "tokens": {"active_key": "k", "keys": {"k": "0123456789abcdef0123456789abcdef"}},
 "tenants": [{"name": "t", "api_key_sha256": ["0000000000000000000000000000000000000000000000000000000000000000"]}]%s}`

func loadConfig(t *testing.T, extra string) (*Config, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, []byte(strings.Replace(baseConfig, "%s", extra, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return LoadConfig(p)
}

// TestEgressLimitsConfig: the egress.* limits have defaults, take
// settings, and refuse nonsense.
func TestEgressLimitsConfig(t *testing.T) {
	c, err := loadConfig(t, "")
	if err != nil {
		t.Fatal(err)
	}
	l := c.egressLimits()
	if l.SessionConns != egress.DefaultSessionConns || l.SessionConnRate != egress.DefaultSessionConnRate ||
		l.SessionBytesPerSecond != egress.DefaultSessionBytesPerSecond || l.IdleTimeout != egress.DefaultIdleTimeout ||
		l.MaxConns != egress.ConnsForFiles(egress.DefaultFileReserve) {
		t.Errorf("defaults: %+v", l)
	}
	c, err = loadConfig(t, `, "egress": {"session_max_conns": 8, "session_new_conns_per_second": 2.5, "session_bytes_per_second": 1048576, "idle_timeout": "5s", "max_conns": 500}`)
	if err != nil {
		t.Fatal(err)
	}
	if l := c.egressLimits(); l.SessionConns != 8 || l.SessionConnRate != 2.5 || l.SessionBytesPerSecond != 1<<20 || l.IdleTimeout != 5*time.Second || l.MaxConns != 500 {
		t.Errorf("settings: %+v", l)
	}
	c, err = loadConfig(t, `, "egress": {"file_reserve": 4096}`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.egressLimits().MaxConns, egress.ConnsForFiles(4096); got != want {
		t.Errorf("file_reserve 4096: max_conns %d, want %d", got, want)
	}
	for _, bad := range []string{
		`, "egress": {"session_max_conns": 0}`,
		`, "egress": {"session_bytes_per_second": 10}`,
		`, "egress": {"idle_timeout": "1ms"}`,
		`, "egress": {"max_conns": -1}`,
		`, "egress": {"session_conns": 5}`,
	} {
		if _, err := loadConfig(t, bad); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// TestTenantsConfig: admin keys, capacity and quotas load; nonsense is
// refused, each beside a config that loads.
func TestTenantsConfig(t *testing.T) {
	const zero = "0000000000000000000000000000000000000000000000000000000000000000"
	const one = "1111111111111111111111111111111111111111111111111111111111111111"
	c, err := loadConfig(t, `, "admin_key_sha256": ["`+one+`"], "capacity": {"max_sessions": 10, "min_free_disk_mb": 512}, "drain_timeout": "30s"`)
	if err != nil || len(c.AdminKeySHA256) != 1 || c.Capacity.MaxSessions != 10 || c.DrainTimeout.Duration != 30*time.Second {
		t.Fatalf("a good config: %+v %v", c, err)
	}
	for name, extra := range map[string]string{
		"an admin key that is a tenant's": `, "admin_key_sha256": ["` + strings.ToUpper(zero) + `"]`,
		"a short admin digest":            `, "admin_key_sha256": ["abc"]`,
		"negative capacity":               `, "capacity": {"max_sessions": -1}`,
		"a long drain":                    `, "drain_timeout": "2h"`,
	} {
		if _, err := loadConfig(t, extra); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	p := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(p, []byte(strings.Replace(strings.Replace(baseConfig, "%s", "", 1), `"name": "t"`, `"name": "Team/A"`, 1)), 0o600)
	if _, err := LoadConfig(p); err == nil || !strings.Contains(err.Error(), "Team/A") {
		t.Errorf("a bad tenant name: %v", err)
	}
}
