package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	sandgate "github.com/sandgate/sandgate/sdk/go"
)

func newAPIClient() (*sandgate.Client, error) {
	return sandgate.FromEnv()
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
  artifacts ID
  snapshot ID                       save its home and workspace (files, not processes)
  snapshots ID
  (create also takes -profile ID [-persist] and -snapshot ID)`

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
	var out any
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
		prof := fs.String("profile", "", "start with this browser profile")
		persist := fs.Bool("persist", false, "write the profile back when the session ends cleanly")
		snap := fs.String("snapshot", "", "start from this workspace snapshot")
		wait := fs.Int("wait", 0, "seconds to wait for quota, capacity or the profile")
		if err := fs.Parse(args); err != nil {
			return usageError(err.Error())
		}
		req := sandgate.SessionRequest{Kind: *kind, Runtime: *rt, TTLSeconds: *ttl, IdleSeconds: *idle, Labels: labels, Record: *record, NoWait: true,
			Snapshot: *snap, WaitSeconds: *wait}
		if *prof != "" {
			req.Profile = &sandgate.ProfileUse{ID: *prof, Persist: *persist}
		}
		if len(allow) > 0 {
			req.Egress = &sandgate.EgressRequest{Allow: allow}
		}
		if *w != 0 || *h != 0 {
			req.Screen = &sandgate.Screen{Width: *w, Height: *h}
		}
		start := time.Now()
		s, err := c.CreateSession(ctx, req)
		if err != nil {
			return err
		}
		// A warm start comes out of a pool already running.
		fmt.Fprintf(os.Stderr, "session %s: %s (runtime %s, %s start) after %s\n", s.ID, s.State, s.Runtime, s.Start, time.Since(start).Round(time.Millisecond))
		last := s.State
		for s.State == "starting" {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
			if s, err = c.GetSession(ctx, s.ID); err != nil {
				return err
			}
			if s.State != last {
				fmt.Fprintf(os.Stderr, "session %s: %s after %s\n", s.ID, s.State, time.Since(start).Round(10*time.Millisecond))
				last = s.State
			} else if time.Since(start)/time.Second != (time.Since(start)-200*time.Millisecond)/time.Second {
				fmt.Fprintf(os.Stderr, "session %s: waiting for Chromium and VNC (%s)\n", s.ID, time.Since(start).Round(time.Second))
			}
		}
		if s.State == "failed" {
			printJSON(s)
			return fmt.Errorf("session %s failed: %s", s.ID, s.Failure)
		}
		out = s
	case "list":
		ss, err := c.ListSessions(ctx)
		if err != nil {
			return err
		}
		out = map[string]any{"sessions": ss}
	case "pools":
		ps, err := c.Pools(ctx)
		if err != nil {
			return err
		}
		out = map[string]any{"pools": ps}
	case "get", "delete", "artifacts", "events", "snapshot", "snapshots":
		if err := fs.Parse(args); err != nil {
			return usageError(err.Error())
		}
		id, err := idArg()
		if err != nil {
			return err
		}
		switch sub {
		case "get":
			out, err = c.GetSession(ctx, id)
		case "delete":
			out, err = c.DeleteSession(ctx, id)
		case "artifacts":
			var as []sandgate.Artifact
			as, err = c.Artifacts(ctx, id)
			out = map[string]any{"artifacts": as}
		case "events":
			var evs []sandgate.Event
			evs, err = c.Events(ctx, id)
			out = map[string]any{"events": evs}
		case "snapshot":
			out, err = c.CreateSnapshot(ctx, id)
		case "snapshots":
			var ss []sandgate.Snapshot
			ss, err = c.Snapshots(ctx, id)
			out = map[string]any{"snapshots": ss}
		}
		if err != nil {
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
		if out, err = c.ExtendSession(ctx, id, time.Duration(*ttl)*time.Second); err != nil {
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
		if out, err = c.CreatePreview(ctx, id, sandgate.PreviewRequest{Scope: *scope, TTLSeconds: *ttl, ViewOnly: *vo}); err != nil {
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
		a, err := c.Screenshot(ctx, id)
		if err != nil {
			return err
		}
		if *file != "" {
			if err := download(ctx, c, a.ID, *file); err != nil {
				return err
			}
		}
		out = a
	default:
		return usageError(sessionUsage)
	}
	return printJSON(out)
}

// download fetches an artifact through its presigned URL.
func download(ctx context.Context, c *sandgate.Client, id, file string) error {
	r, err := c.OpenArtifact(ctx, id)
	if err != nil {
		return err
	}
	defer r.Close()
	return saveTo(file, r)
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

const profileUsage = `usage: sandgate profile SUBCOMMAND
  create NAME
  list
  get ID
  rollback ID VERSION     (0: a fresh profile)
  delete ID`

// cmdProfile runs the browser profile subcommands against SANDGATE_URL.
func cmdProfile(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageError(profileUsage)
	}
	c, err := newAPIClient()
	if err != nil {
		return err
	}
	sub, rest := args[0], args[1:]
	need := map[string]int{"create": 1, "list": 0, "get": 1, "rollback": 2, "delete": 1}
	n, ok := need[sub]
	if !ok || len(rest) != n {
		return usageError(profileUsage)
	}
	var out any
	switch sub {
	case "create":
		out, err = c.CreateProfile(ctx, rest[0])
	case "list":
		var ps []sandgate.Profile
		ps, err = c.Profiles(ctx)
		out = map[string]any{"profiles": ps}
	case "get":
		out, err = c.GetProfile(ctx, rest[0])
	case "rollback":
		v, perr := strconv.Atoi(rest[1])
		if perr != nil {
			return usageError("VERSION must be a number\n" + profileUsage)
		}
		out, err = c.RollbackProfile(ctx, rest[0], v)
	case "delete":
		if err = c.DeleteProfile(ctx, rest[0]); err == nil {
			fmt.Fprintf(os.Stderr, "profile %s deleted\n", rest[0])
			return nil
		}
	}
	if err != nil {
		return err
	}
	return printJSON(out)
}
