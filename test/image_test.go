package test

import (
	"regexp"
	"strings"
	"testing"
)

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
