package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

const adminUsage = `usage: sandgate admin SUBCOMMAND   (SANDGATE_URL and SANDGATE_ADMIN_KEY)
  tenants list
  tenants get NAME
  tenants create NAME [limits]
  tenants update NAME [limits]
  tenants disable NAME          refuse its keys and previews, stop its sessions
  tenants enable NAME
  keys list TENANT
  keys issue TENANT [-name NAME]   prints the key once
  keys revoke TENANT KEY_ID
limits: -max-sessions N -max-cpus N -max-memory-mb N -max-recordings N -max-creates-per-minute N
        -max-artifact-bytes N -default-ttl S -max-ttl S -max-idle S -allow-root=true|false
        -max-file-bytes N -egress-allow host:port (repeatable)`

// cmdAdmin runs the admin API's subcommands.
func cmdAdmin(ctx context.Context, args []string) error {
	if len(args) < 2 {
		return usageError(adminUsage)
	}
	base, key := strings.TrimRight(os.Getenv("SANDGATE_URL"), "/"), os.Getenv("SANDGATE_ADMIN_KEY")
	if base == "" || key == "" {
		return errors.New("set SANDGATE_URL and SANDGATE_ADMIN_KEY")
	}
	call := func(method, path string, in any) error {
		return adminCall(ctx, base, key, method, path, in)
	}
	what, sub, rest := args[0], args[1], flagsFirst(args[2:])
	fs := flag.NewFlagSet("admin "+what+" "+sub, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	limits := map[string]any{}
	if what == "tenants" && (sub == "create" || sub == "update") {
		adminLimitFlags(fs, limits)
	}
	keyName := fs.String("name", "", "what the key is for")
	if err := fs.Parse(rest); err != nil {
		return usageError(adminUsage)
	}
	arg := func(i int) string { return fs.Arg(i) }
	need := func(n int) error {
		if fs.NArg() != n {
			return usageError(adminUsage)
		}
		return nil
	}
	esc := url.PathEscape
	switch what + " " + sub {
	case "tenants list":
		return call("GET", "/admin/v1/tenants", nil)
	case "tenants get":
		if err := need(1); err != nil {
			return err
		}
		return call("GET", "/admin/v1/tenants/"+esc(arg(0)), nil)
	case "tenants create":
		if err := need(1); err != nil {
			return err
		}
		limits["name"] = arg(0)
		return call("POST", "/admin/v1/tenants", limits)
	case "tenants update":
		if err := need(1); err != nil {
			return err
		}
		return call("PATCH", "/admin/v1/tenants/"+esc(arg(0)), limits)
	case "tenants disable", "tenants enable":
		if err := need(1); err != nil {
			return err
		}
		return call("PATCH", "/admin/v1/tenants/"+esc(arg(0)), map[string]any{"disabled": sub == "disable"})
	case "keys list":
		if err := need(1); err != nil {
			return err
		}
		return call("GET", "/admin/v1/tenants/"+esc(arg(0))+"/keys", nil)
	case "keys issue":
		if err := need(1); err != nil {
			return err
		}
		return call("POST", "/admin/v1/tenants/"+esc(arg(0))+"/keys", map[string]any{"name": *keyName})
	case "keys revoke":
		if err := need(2); err != nil {
			return err
		}
		return call("DELETE", "/admin/v1/tenants/"+esc(arg(0))+"/keys/"+esc(arg(1)), nil)
	}
	return usageError(adminUsage)
}

// adminLimitFlags adds the limit flags; only those given reach limits.
func adminLimitFlags(fs *flag.FlagSet, limits map[string]any) {
	ints := []struct{ flag, field string }{
		{"max-sessions", "max_sessions"}, {"max-memory-mb", "max_memory_mb"}, {"default-ttl", "default_ttl_seconds"},
		{"max-ttl", "max_ttl_seconds"}, {"max-idle", "max_idle_seconds"}, {"max-file-bytes", "max_file_bytes"},
		{"max-recordings", "max_recordings"}, {"max-creates-per-minute", "max_creates_per_minute"}, {"max-artifact-bytes", "max_artifact_bytes"},
	}
	for _, f := range ints {
		fs.Func(f.flag, f.field, func(v string) error {
			var n int64
			if _, err := fmt.Sscan(v, &n); err != nil {
				return err
			}
			limits[f.field] = n
			return nil
		})
	}
	fs.Func("max-cpus", "max_cpus", func(v string) error {
		var n float64
		if _, err := fmt.Sscan(v, &n); err != nil {
			return err
		}
		limits["max_cpus"] = n
		return nil
	})
	fs.Func("allow-root", "allow_root", func(v string) error {
		limits["allow_root"] = v == "true"
		return nil
	})
	fs.Func("egress-allow", "egress_allow", func(v string) error {
		l, _ := limits["egress_allow"].([]string)
		limits["egress_allow"] = append(l, v)
		return nil
	})
}

// adminCall sends one admin request and prints the answer's JSON.
func adminCall(ctx context.Context, base, key, method, path string, in any) error {
	var body io.Reader
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(raw)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode >= 400 {
		var e struct {
			Error struct{ Code, Message string }
		}
		if json.Unmarshal(raw, &e) == nil && e.Error.Code != "" {
			return fmt.Errorf("%s (%d): %s", e.Error.Code, resp.StatusCode, e.Error.Message)
		}
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	if len(raw) == 0 {
		return nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Errorf("%s %s: the answer is not JSON", method, path)
	}
	return printJSON(v)
}
