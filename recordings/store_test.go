package recordings

import (
	"testing"
	"time"
)

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"report data.bin": true, "Übersicht (2).pdf": true, "a": true,
		"": false, ".": false, "..": false, "a/b": false, `a\b`: false, "a\x00b": false, "a\nb": false,
		string([]byte{0xff, 0xfe}): false,
	} {
		if got := validName(name); got != want {
			t.Errorf("validName(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestSegmentStart(t *testing.T) {
	got := segmentStart("1796006583217-000003.ts", 2*time.Second)
	want := time.UnixMilli(1796006583217).UTC().Add(6 * time.Second)
	if !got.Equal(want) {
		t.Fatalf("segmentStart = %v, want %v", got, want)
	}
	if !segmentStart("junk.ts", time.Second).IsZero() {
		t.Fatal("a name without a part and number has no start")
	}
}

func TestSegmentIDStable(t *testing.T) {
	a, b := SegmentID("s-0123456789abcdef", "1-000001.ts"), SegmentID("s-0123456789abcdef", "1-000001.ts")
	if a != b || !idPattern.MatchString(a) {
		t.Fatalf("SegmentID: %q %q", a, b)
	}
	if a == SegmentID("s-0123456789abcdef", "1-000002.ts") {
		t.Fatal("two segments share an id")
	}
}
