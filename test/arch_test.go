package test

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

type pkgInfo struct {
	ImportPath string
	Doc        string
	Imports    []string
	Name       string
}

func listPackages(t *testing.T) []pkgInfo {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", "-deps=false", "github.com/sandgate/sandgate/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkgInfo
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkgInfo
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestArchitecture keeps the rooms of ARCHITECTURE.md apart: session knows
// nothing of HTTP or Fiber, gateway never talks to containerd.
func TestArchitecture(t *testing.T) {
	forbidden := map[string][]string{
		"github.com/sandgate/sandgate/session":    {"github.com/gofiber/", "github.com/sandgate/sandgate/gateway", "github.com/sandgate/sandgate/browser", "github.com/sandgate/sandgate/recordings"},
		"github.com/sandgate/sandgate/gateway":    {"github.com/containerd/containerd"},
		"github.com/sandgate/sandgate/browser":    {"github.com/gofiber/", "github.com/containerd/containerd"},
		"github.com/sandgate/sandgate/recordings": {"github.com/gofiber/", "github.com/containerd/containerd", "github.com/sandgate/sandgate/session"},
		"github.com/sandgate/sandgate/images":     {"github.com/gofiber/", "github.com/sandgate/sandgate/"},
		"github.com/sandgate/sandgate/desktop":    {"github.com/gofiber/", "github.com/containerd/containerd", "github.com/sandgate/sandgate/gateway"},
		"github.com/sandgate/sandgate/egress":     {"github.com/gofiber/", "github.com/containerd/containerd", "github.com/sandgate/sandgate/"},
		"github.com/sandgate/sandgate/vault":      {"github.com/gofiber/", "github.com/containerd/containerd", "github.com/sandgate/sandgate/"},
		"github.com/sandgate/sandgate/ids":        {"github.com/sandgate/sandgate/"},
		// The stores' bucket: a leaf each of them may import.
		"github.com/sandgate/sandgate/bucket": {"github.com/gofiber/", "github.com/containerd/containerd", "github.com/sandgate/sandgate/"},
		// Tenants and keys: imported by the gateway and the composition root.
		"github.com/sandgate/sandgate/tenant": {"github.com/gofiber/", "github.com/containerd/containerd", "github.com/sandgate/sandgate/"},
		// Profiles (and the cleaning of session tars): imported by the
		// gateway and the composition root.
		"github.com/sandgate/sandgate/profile": {"github.com/gofiber/", "github.com/containerd/containerd", "github.com/sandgate/sandgate/"},
		// The Go SDK is what users import: nothing of the server.
		"github.com/sandgate/sandgate/sdk/go": {"github.com/sandgate/sandgate/", "github.com/gofiber/", "github.com/containerd/"},
	}
	// Every room of the server may import these; the SDK not even them.
	allowed := map[string]bool{"github.com/sandgate/sandgate/ids": true, "github.com/sandgate/sandgate/bucket": true}
	for _, p := range listPackages(t) {
		for _, dep := range p.Imports {
			if allowed[dep] && !strings.HasPrefix(p.ImportPath, "github.com/sandgate/sandgate/sdk/") {
				continue
			}
			for _, bad := range forbidden[p.ImportPath] {
				if strings.HasPrefix(dep, bad) {
					t.Errorf("%s depends on %s", p.ImportPath, dep)
				}
			}
		}
	}
}

// TestSessionBackendBoundary keeps containerd behind session's Backend
// interface: of the manager's files, only the containerd backend and the
// few that say how containerd is driven (runtime handlers, seccomp, the
// client New is given) import containerd, so that another backend
// (Kubernetes) can run sessions without the manager knowing.
func TestSessionBackendBoundary(t *testing.T) {
	allowed := map[string]bool{"containerd.go": true, "runtime.go": true, "seccomp.go": true, "manager.go": true}
	files, err := filepath.Glob("../session/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("session sources: %v (%d files)", err, len(files))
	}
	importers := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		ast, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range ast.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(path, "github.com/containerd/containerd") {
				importers[filepath.Base(f)] = true
			}
		}
	}
	// Control: the containerd backend itself is seen importing it.
	if !importers["containerd.go"] {
		t.Fatalf("session/containerd.go is not seen importing containerd (importers: %v): the check reads nothing", importers)
	}
	for f := range importers {
		if !allowed[f] {
			t.Errorf("session/%s imports containerd: go through the Backend interface (session/backend.go)", f)
		}
	}
}

// TestPackageDocs: every package says what it owns.
func TestPackageDocs(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("%s has no package doc comment", p.ImportPath)
		}
	}
}
