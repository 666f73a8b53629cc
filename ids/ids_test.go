package ids

import (
	"regexp"
	"testing"
)

var (
	sessionRE    = regexp.MustCompile(`^` + SessionPattern + `$`)
	previewRE    = regexp.MustCompile(`^p-[0-9a-f]{16}$`)
	credentialRE = regexp.MustCompile(`^cred_[0-9a-f]{16}$`)
)

func TestNewIsValid(t *testing.T) {
	for range 100 {
		if s := NewSession(); !IsSession(s) || IsPreview(s) || IsCredential(s) {
			t.Fatalf("session id %q", s)
		}
		if p := NewPreview(); !IsPreview(p) || IsSession(p) {
			t.Fatalf("preview id %q", p)
		}
		if c := NewCredential(); !IsCredential(c) || IsSession(c) {
			t.Fatalf("credential id %q", c)
		}
	}
	if NewSession() == NewSession() {
		t.Fatal("two session ids alike")
	}
}

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		s    string
		want bool
	}{
		{"s-0123456789abcdef", true},
		{"s-0123456789ABCDEF", false},
		{"s-0123456789abcde", false},
		{"s-0123456789abcdef0", false},
		{"s-0123456789abcdeg", false},
		{"p-0123456789abcdef", false},
		{"s-../../etc/passwd", false},
		{"", false},
	} {
		if got := IsSession(c.s); got != c.want {
			t.Errorf("IsSession(%q) = %v", c.s, got)
		}
	}
}

// FuzzIDs: the hand-written checks agree with the regular expressions
// the rooms used before.
func FuzzIDs(f *testing.F) {
	for _, s := range []string{"s-0123456789abcdef", "p-0123456789abcdef", "cred_0123456789abcdef", "s-", "cred_0123456789abcdeF", "s-0123456789abcdef\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if IsSession(s) != sessionRE.MatchString(s) || IsPreview(s) != previewRE.MatchString(s) || IsCredential(s) != credentialRE.MatchString(s) {
			t.Fatalf("%q: checks disagree with the patterns", s)
		}
	})
}
