package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/sandgate/sandgate/images"
)

// cmdImage builds the session image and imports it into containerd.
func cmdImage(ctx context.Context, log *slog.Logger, args []string) error {
	if len(args) == 0 || (args[0] != "build" && args[0] != "ref") {
		return usageError("usage: sandgate image build|ref [-config FILE]")
	}
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "config file (defaults apply without one)")
	if err := fs.Parse(args[1:]); err != nil {
		return usageError(err.Error())
	}
	def := images.SessionDefinition()
	if args[0] == "ref" {
		fmt.Println(def.Ref())
		return nil
	}
	cfg := defaultConfig()
	if *cfgPath != "" {
		c, err := LoadConfig(*cfgPath)
		if err != nil {
			return err
		}
		cfg = c
	}
	client, err := containerd.New(cfg.Containerd.Address)
	if err != nil {
		return fmt.Errorf("connect to containerd at %s: %w", cfg.Containerd.Address, err)
	}
	defer client.Close()
	ctx = namespaces.WithNamespace(ctx, cfg.Containerd.Namespace)
	b := &images.Builder{Client: client, CacheDir: cfg.CacheDir, Snapshotter: cfg.Containerd.Snapshotter, Log: log}
	ref, err := b.Ensure(ctx, def)
	if err != nil {
		return err
	}
	fmt.Println(ref)
	return nil
}
