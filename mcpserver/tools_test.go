package mcpserver

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCutText(t *testing.T) {
	for _, tc := range []struct {
		in      string
		n       int
		want    string
		cutWant bool
	}{
		{"short", 10, "short", false},
		{"exactly10!", 10, "exactly10!", false},
		{"longer than ten", 10, "longer tha\n[cut]", true},
		{"héllo", 2, "h\uFFFD\n[cut]", true}, // é split at the cut
		{"a\xffb", 10, "a\uFFFDb", false},    // not UTF-8: replaced
		{strings.Repeat("x", 100), 0, "\n[cut]", true},
	} {
		got, cut := cutText([]byte(tc.in), tc.n)
		if got != tc.want || cut != tc.cutWant || !utf8.ValidString(got) {
			t.Errorf("cutText(%q, %d) = %q, %t; want %q, %t", tc.in, tc.n, got, cut, tc.want, tc.cutWant)
		}
	}
}
