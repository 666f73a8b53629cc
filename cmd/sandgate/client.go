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
	"os"
	"strings"
	"time"
)

// apiClient talks to a gateway's management API.
type apiClient struct {
	base string
	key  string
	http *http.Client
}

func newAPIClient() (*apiClient, error) {
	base := strings.TrimRight(os.Getenv("SANDGATE_URL"), "/")
	if base == "" {
		base = "http://127.0.0.1:8080"
	}
	key := os.Getenv("SANDGATE_API_KEY")
	if key == "" {
		return nil, errors.New("SANDGATE_API_KEY is not set")
	}
	// Redirects (artifact downloads) are followed only where asked.
	// No client timeout: exec and downloads stream for as long as they
	// run; ctx (SIGINT) ends them.
	return &apiClient{base: base, key: key, http: &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, nil
}

// apiErr is the contract's error body.
type apiErr struct {
	Status int
	Code   string `json:"code"`
	Msg    string `json:"message"`
}

func (e *apiErr) Error() string { return fmt.Sprintf("%s (%d): %s", e.Code, e.Status, e.Msg) }

func (c *apiClient) do(ctx context.Context, method, path string, body any, out any) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		r = bytes.NewReader(b)
	}
	resp, err := c.raw(ctx, method, path, r, "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, fmt.Errorf("%s %s: bad response: %w", method, path, err)
		}
	}
	return resp, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

const sessionUsage = `usage: sandgate session SUBCOMMAND
  create [-kind browser] [-runtime NAME] [-ttl SECONDS] [-idle SECONDS] [-width W -height H] [-label k=v]...
  list
  pools
  get ID
  extend ID -ttl SECONDS
  delete ID
  preview ID [-scope cdp] [-ttl SECONDS] [-view-only]
  screenshot ID [-o FILE]
  artifacts ID`

// kvFlags collects repeated k=v flags (labels, environment).
type kvFlags map[string]string

func (f kvFlags) String() string { return "" }
func (f kvFlags) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok {
		return errors.New("expected k=v")
	}
	f[k] = val
	return nil
}

// cmdSession runs the session subcommands against SANDGATE_URL.
func cmdSession(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageError(sessionUsage)
	}
	c, err := newAPIClient()
	if err != nil {
		return err
	}
	sub, args := args[0], flagsFirst(args[1:])
	fs := flag.NewFlagSet("session "+sub, flag.ContinueOnError)
	var out map[string]any
	idArg := func() (string, error) {
		if fs.NArg() != 1 {
			return "", usageError(sessionUsage)
		}
		return fs.Arg(0), nil
	}
	switch sub {
	case "create":
		kind := fs.String("kind", "browser", "browser or desktop")
		rt := fs.String("runtime", "", "kata, gvisor or runc (default: the gateway's)")
		ttl := fs.Int("ttl", 0, "seconds to live (default: the tenant's)")
		idle := fs.Int("idle", 0, "idle timeout in seconds (0: none)")
		w := fs.Int("width", 0, "screen width")
		h := fs.Int("height", 0, "screen height")
		record := fs.Bool("record", false, "record the screen")
		var allow listFlag
		fs.Var(&allow, "allow", "egress host:port (or *.domain:port) the session may reach, repeatable")
		labels := kvFlags{}
		fs.Var(labels, "label", "k=v label, repeatable")
		if err := fs.Parse(args); err != nil {
			return usageError(err.Error())
		}
		req := map[string]any{"kind": *kind, "labels": labels, "record": *record}
		if len(allow) > 0 {
			req["egress"] = map[string]any{"allow": []string(allow)}
		}
		if *rt != "" {
			req["runtime"] = *rt
		}
		if *ttl != 0 {
			req["ttl_seconds"] = *ttl
		}
		if *idle != 0 {
			req["idle_timeout_seconds"] = *idle
		}
		if *w != 0 || *h != 0 {
			req["screen"] = map[string]int{"width": *w, "height": *h}
		}
		start := time.Now()
		if _, err := c.do(ctx, "POST", "/v1/sessions?wait=false", req, &out); err != nil {
			return err
		}
		id, _ := out["id"].(string)
		// A warm start comes out of a pool already running.
		fmt.Fprintf(os.Stderr, "session %s: %s (runtime %v, %v start) after %s\n", id, out["state"], out["runtime"], out["start"], time.Since(start).Round(time.Millisecond))
		last := out["state"]
		for out["state"] == "starting" {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
			if _, err := c.do(ctx, "GET", "/v1/sessions/"+id, nil, &out); err != nil {
				return err
			}
			if out["state"] != last {
				fmt.Fprintf(os.Stderr, "session %s: %s after %s\n", id, out["state"], time.Since(start).Round(10*time.Millisecond))
				last = out["state"]
			} else if time.Since(start)/time.Second != (time.Since(start)-200*time.Millisecond)/time.Second {
				fmt.Fprintf(os.Stderr, "session %s: waiting for Chromium and VNC (%s)\n", id, time.Since(start).Round(time.Second))
			}
		}
		if out["state"] == "failed" {
			printJSON(out)
			return fmt.Errorf("session %s failed: %v", id, out["failure"])
		}
	case "list":
		if _, err := c.do(ctx, "GET", "/v1/sessions", nil, &out); err != nil {
			return err
		}
	case "pools":
		if _, err := c.do(ctx, "GET", "/v1/pools", nil, &out); err != nil {
			return err
		}
	case "get", "delete", "artifacts", "events":
		if err := fs.Parse(args); err != nil {
			return usageError(err.Error())
		}
		id, err := idArg()
		if err != nil {
			return err
		}
		method, path := "GET", "/v1/sessions/"+id
		if sub == "delete" {
			method = "DELETE"
		} else if sub == "artifacts" || sub == "events" {
			path += "/" + sub
		}
		if _, err := c.do(ctx, method, path, nil, &out); err != nil {
			return err
		}
	case "extend":
		ttl := fs.Int("ttl", 0, "new time to live, seconds from now")
		if err := fs.Parse(args); err != nil {
			return usageError(err.Error())
		}
		id, err := idArg()
		if err != nil {
			return err
		}
		if _, err := c.do(ctx, "POST", "/v1/sessions/"+id+"/extend", map[string]int{"ttl_seconds": *ttl}, &out); err != nil {
			return err
		}
	case "preview":
		scope := fs.String("scope", "cdp", "cdp, vnc, view or review")
		ttl := fs.Int("ttl", 300, "seconds the preview URL is valid")
		vo := fs.Bool("view-only", false, "drop input (vnc, view)")
		if err := fs.Parse(args); err != nil {
			return usageError(err.Error())
		}
		id, err := idArg()
		if err != nil {
			return err
		}
		req := map[string]any{"scope": *scope, "ttl_seconds": *ttl, "view_only": *vo}
		if _, err := c.do(ctx, "POST", "/v1/sessions/"+id+"/previews", req, &out); err != nil {
			return err
		}
	case "screenshot":
		file := fs.String("o", "", "also download the PNG to FILE")
		if err := fs.Parse(args); err != nil {
			return usageError(err.Error())
		}
		id, err := idArg()
		if err != nil {
			return err
		}
		if _, err := c.do(ctx, "POST", "/v1/sessions/"+id+"/screenshot", nil, &out); err != nil {
			return err
		}
		if *file != "" {
			if err := c.download(ctx, out["id"].(string), *file); err != nil {
				return err
			}
		}
	default:
		return usageError(sessionUsage)
	}
	return printJSON(out)
}

// download fetches an artifact through its presigned URL.
func (c *apiClient) download(ctx context.Context, id, file string) error {
	resp, err := c.do(ctx, "GET", "/v1/artifacts/"+id, nil, nil)
	if err != nil {
		return err
	}
	loc := resp.Header.Get("Location")
	req, err := http.NewRequestWithContext(ctx, "GET", loc, nil)
	if err != nil {
		return err
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer r.Body.Close()
	if r.StatusCode != 200 {
		return fmt.Errorf("download: %s", r.Status)
	}
	return saveTo(file, r.Body)
}

// saveTo writes r to the file at path.
func saveTo(path string, r io.Reader) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// flagsFirst moves positional arguments after the flags, so that
// "screenshot ID -o FILE" parses like "screenshot -o FILE ID".
func flagsFirst(args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			pos = append(pos, args[i+1:]...)
			i = len(args)
		case strings.HasPrefix(a, "-"):
			flags = append(flags, a)
			if !strings.Contains(a, "=") && i+1 < len(args) && !boolFlags[strings.TrimLeft(a, "-")] {
				flags = append(flags, args[i+1])
				i++
			}
		default:
			pos = append(pos, a)
		}
	}
	return append(flags, pos...)
}

var boolFlags = map[string]bool{"view-only": true}

// listFlag collects a repeated string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }
