package session

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/containerd/containerd/runtime/v2/runc/options"
)

// Runtime is one runtime handler a session can run under.
type Runtime struct {
	Name      string `json:"name"`      // kata, gvisor, runc
	Isolation string `json:"isolation"` // vm, kernel, container
	Usable    bool   `json:"usable"`
	Reason    string `json:"reason,omitempty"` // why not usable
	Version   string `json:"version,omitempty"`

	shim    string // containerd runtime handler
	options any    // runtime options for the shim
}

// Strength order: the default runtime is the first usable one.
var runtimeOrder = []string{"kata", "gvisor", "runc"}

// Offered is what a backend found of every runtime (named backend: one
// it did not report reads as not offered) and the default runtime: the
// configured one, an error when it is not usable, else the strongest
// usable isolating one ("" when none is).
func Offered(backend string, found map[string]*Runtime, configured string) (map[string]*Runtime, string, error) {
	out := make(map[string]*Runtime, len(runtimeOrder))
	for _, name := range runtimeOrder {
		if rt := found[name]; rt != nil {
			out[name] = rt
		} else {
			out[name] = &Runtime{Name: name, Reason: backend + " does not offer it"}
		}
	}
	if configured != "" {
		if rt := out[configured]; rt == nil || !rt.Usable {
			return nil, "", fmt.Errorf("default runtime %q is not usable here", configured)
		}
		return out, configured, nil
	}
	for _, name := range runtimeOrder[:2] {
		if out[name].Usable {
			return out, name, nil
		}
	}
	return out, "", nil
}

// InOrder lists runtimes (as Offered gives them) strongest first.
func InOrder(runtimes map[string]*Runtime) []Runtime {
	out := make([]Runtime, 0, len(runtimeOrder))
	for _, name := range runtimeOrder {
		out = append(out, *runtimes[name])
	}
	return out
}

// RuntimeConfig says where the runtimes' binaries are.
type RuntimeConfig struct {
	// Runsc is the runsc wrapper the runc shim runs for gvisor. Empty: no
	// gvisor handler.
	Runsc string
}

// probeRuntimes finds which handlers can run here. It runs their binaries'
// version commands; it does not start a container.
func probeRuntimes(ctx context.Context, cfg RuntimeConfig) map[string]*Runtime {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rts := map[string]*Runtime{}

	runc := &Runtime{Name: "runc", Isolation: "container", shim: "io.containerd.runc.v2"}
	if v, err := version(ctx, "runc", "--version"); err != nil {
		runc.Reason = "runc not found: " + err.Error()
	} else if _, err := exec.LookPath("containerd-shim-runc-v2"); err != nil {
		runc.Reason = "containerd-shim-runc-v2 not found"
	} else {
		runc.Usable, runc.Version = true, v
	}
	rts["runc"] = runc

	gv := &Runtime{Name: "gvisor", Isolation: "kernel", shim: "io.containerd.runc.v2"}
	switch {
	case cfg.Runsc == "":
		gv.Reason = "no runsc configured (runtimes.gvisor.runsc)"
	default:
		if v, err := version(ctx, cfg.Runsc, "--version"); err != nil {
			gv.Reason = fmt.Sprintf("runsc at %s does not run: %v", cfg.Runsc, err)
		} else {
			gv.Usable, gv.Version = true, v
			gv.options = &options.Options{BinaryName: cfg.Runsc}
		}
	}
	rts["gvisor"] = gv

	kata := &Runtime{Name: "kata", Isolation: "vm", shim: "io.containerd.kata.v2"}
	if v, err := version(ctx, "containerd-shim-kata-v2", "--version"); err != nil {
		kata.Reason = "Kata Containers is not installed (containerd-shim-kata-v2 not found); see deploy/kata"
	} else {
		kata.Usable, kata.Version = true, v
	}
	rts["kata"] = kata
	return rts
}

func version(ctx context.Context, bin string, args ...string) (string, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil {
		return "", err
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return first, nil
}
