package test

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// TestMountsUnder: the leak check finds a tmpfs left mounted below the
// suite's directory, a name with a space included, deepest first; the
// control, a directory beside it with nothing mounted, lists nothing.
func TestMountsUnder(t *testing.T) {
	dir := t.TempDir()
	outer := filepath.Join(dir, "sessions", "s-1 a", "workspace")
	inner := filepath.Join(outer, "nested")
	if err := os.MkdirAll(outer, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", outer, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mounting a tmpfs needs root: %v", err)
	}
	defer syscall.Unmount(outer, syscall.MNT_DETACH)
	if err := os.Mkdir(inner, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", inner, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(inner, syscall.MNT_DETACH)
	if got := mountsUnder(dir); !slices.Equal(got, []string{inner, outer}) {
		t.Errorf("mounts under %s: %q, want %q", dir, got, []string{inner, outer})
	}
	if got := mountsUnder(filepath.Join(dir, "sessions", "s-1")); len(got) != 0 {
		t.Errorf("mounts under a directory beside them: %q, want none", got)
	}
}
