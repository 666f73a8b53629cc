package main

import (
	"slices"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
)

// TestGatewayConfig: trusted_proxies, read_timeout and upload_timeout
// have defaults, take settings, and refuse nonsense.
func TestGatewayConfig(t *testing.T) {
	c, err := loadConfig(t, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.TrustedProxies) != 0 || c.ReadTimeout.Duration != gateway.DefaultReadTimeout || c.UploadTimeout.Duration != gateway.DefaultUploadTimeout {
		t.Errorf("defaults: %v %v %v", c.TrustedProxies, c.ReadTimeout, c.UploadTimeout)
	}
	c, err = loadConfig(t, `, "trusted_proxies": ["10.0.0.1", "192.168.0.0/16", "::1"], "read_timeout": "5s", "upload_timeout": "2h"`)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.TrustedProxies, []string{"10.0.0.1", "192.168.0.0/16", "::1"}) || c.ReadTimeout.Duration != 5*time.Second || c.UploadTimeout.Duration != 2*time.Hour {
		t.Errorf("settings: %v %v %v", c.TrustedProxies, c.ReadTimeout, c.UploadTimeout)
	}
	for _, bad := range []string{
		`, "trusted_proxies": ["proxy.example"]`,
		`, "trusted_proxies": ["10.0.0.0/33"]`,
		`, "read_timeout": "10ms"`,
		`, "read_timeout": "2m", "upload_timeout": "1m"`,
	} {
		if _, err := loadConfig(t, bad); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}
