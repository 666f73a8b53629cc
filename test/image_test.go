package test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	ctrimages "github.com/containerd/containerd/images"
	"github.com/containerd/containerd/oci"

	"github.com/sandgate/sandgate/images"
)

// TestOldImagesPruned: a gateway that starts removes the session images
// of earlier definitions that no container uses, and their archives.
// Beside the one removed, and checked as controls: an earlier image a
// container still uses, an image of another repository, the current
// image, the current archive and another archive of the cache stay.
func TestOldImagesPruned(t *testing.T) {
	e := needE2E(t)
	ctx := e.ctx()
	def := images.SessionDefinition()
	cur, err := e.client.ImageService().Get(ctx, def.Ref())
	if err != nil {
		t.Fatalf("the current session image: %v", err)
	}
	// Earlier images, as names of the current content: removing one
	// frees nothing, so the test costs no rebuild.
	unused, inUse, other := images.Repository+":0000000000000000", images.Repository+":1111111111111111", "sandgate.local/other:keep"
	for _, name := range []string{unused, inUse, other} {
		if _, err := e.client.ImageService().Create(ctx, ctrimages.Image{Name: name, Target: cur.Target}); err != nil && !errdefs.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	user := "prune-test-" + randHex(4)
	c, err := e.client.NewContainer(ctx, user, containerd.WithImageName(inUse), containerd.WithSpec(&oci.Spec{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Delete(ctx)
		for _, name := range []string{unused, inUse, other} {
			e.client.ImageService().Delete(ctx, name)
		}
	})
	// A cache of its own: the current archive (never read, the image is
	// in containerd), those of the earlier images, one of a definition
	// whose image is not in this namespace (another gateway's, sharing
	// the cache) and something else.
	cache := t.TempDir()
	archive := func(hash string) string { return filepath.Join(cache, "session-"+hash+".oci.tar") }
	old, oldInUse, elsewhere := archive(strings.Repeat("0", 64)), archive(strings.Repeat("1", 64)), archive(strings.Repeat("2", 64))
	for _, f := range []string{archive(def.Hash()), old, oldInUse, elsewhere, filepath.Join(cache, "kube-pause.oci.tar")} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e.withGatewayConfig(t, func(cfg map[string]any) { cfg["cache_dir"] = cache })
	has := func(name string) bool {
		_, err := e.client.ImageService().Get(ctx, name)
		return err == nil
	}
	if has(unused) {
		t.Errorf("the earlier image no container uses is still there")
	}
	for _, name := range []string{inUse, other, def.Ref()} {
		if !has(name) {
			t.Errorf("%s was removed", name)
		}
	}
	if fileExists(old) {
		t.Errorf("the earlier archive is still there")
	}
	for _, f := range []string{archive(def.Hash()), oldInUse, elsewhere, filepath.Join(cache, "kube-pause.oci.tar")} {
		if !fileExists(f) {
			t.Errorf("%s was removed", filepath.Base(f))
		}
	}
	// Once its container is gone, the next start removes that one too.
	if err := c.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	e.stopGateway(syscall.SIGTERM)
	if err := e.startGateway(); err != nil {
		t.Fatal(err)
	}
	if has(inUse) || fileExists(oldInUse) {
		t.Errorf("the earlier image or its archive is still there after its container went")
	}
	if !fileExists(elsewhere) {
		t.Errorf("the archive of an image this namespace does not hold was removed")
	}
	if !has(def.Ref()) || !has(other) {
		t.Errorf("the current image or another repository's was removed")
	}
}

// TestFontCacheFresh: the session image's font caches match their font
// directories, so neither Chromium nor anything else rescans the fonts
// at start (stale caches cost each Chromium start 100 ms). fontconfig's
// debug output names each cache it checks with the directory's time it
// holds and the directory's time now. The control is a directory whose
// cache goes stale: its time changes after its cache was written.
func TestFontCacheFresh(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	script := `set -e
export HOME=$(mktemp -d)
FC_DEBUG=16 fc-match sans 2>&1
echo "== control"
mkdir "$HOME/fonts"
cp /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf "$HOME/fonts/"
printf '<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig><include>/etc/fonts/fonts.conf</include><dir>%s/fonts</dir></fontconfig>\n' "$HOME" >"$HOME/fonts.conf"
export FONTCONFIG_FILE="$HOME/fonts.conf"
fc-match sans >/dev/null
touch -m -d @1000000000 "$HOME/fonts"
FC_DEBUG=16 fc-match sans 2>&1
`
	out := e.execIn(t, e.keyA, s.ID, map[string]any{"cmd": []string{"bash", "-c", script}, "timeout_seconds": 60})
	image, control, ok := strings.Cut(string(out.Stdout), "== control\n")
	if !ok {
		t.Fatalf("the script did not run through:\n%s%s", out.Stdout, out.Stderr)
	}
	if stale := staleFontCaches(control); len(stale) == 0 {
		t.Fatalf("the control: a cache made stale is not seen as stale; the check cannot fail:\n%s", control)
	}
	checked := len(fontCacheCheck.FindAllString(image, -1))
	if stale := staleFontCaches(image); checked == 0 || len(stale) > 0 {
		t.Fatalf("%d font caches checked; stale in the image: %v", checked, stale)
	}
}

var fontCacheCheck = regexp.MustCompile(`FcCacheTimeValid dir "([^"]*)" cache checksum (\S+) dir checksum (\S+)`)

// staleFontCaches names the directories whose cache holds another time
// than theirs.
func staleFontCaches(debug string) []string {
	var stale []string
	for _, m := range fontCacheCheck.FindAllStringSubmatch(debug, -1) {
		if m[2] != m[3] {
			stale = append(stale, m[1])
		}
	}
	return stale
}
