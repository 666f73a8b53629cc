package session

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Revocations hold after a restart (a reload of the file) and drop out
// once their preview would have expired.
func TestRevocationsDurable(t *testing.T) {
	p := filepath.Join(t.TempDir(), "revocations.jsonl")
	now := time.Now()
	r, err := loadRevocations(p, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.add("s-0000000000000001", "p-0000000000000001", now.Add(time.Hour), now); err != nil {
		t.Fatal(err)
	}
	if err := r.add("s-0000000000000001", "p-0000000000000002", now.Add(time.Minute), now); err != nil {
		t.Fatal(err)
	}
	again, err := loadRevocations(p, now)
	if err != nil {
		t.Fatal(err)
	}
	if !again.has("s-0000000000000001", "p-0000000000000001", now) {
		t.Error("revocation lost over a reload")
	}
	if again.has("s-0000000000000001", "p-0000000000000003", now) {
		t.Error("a preview never revoked reads as revoked")
	}
	// Past the expiry the entry is pruned from the file on load.
	later, err := loadRevocations(p, now.Add(30*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !later.has("s-0000000000000001", "p-0000000000000001", now.Add(30*time.Minute)) || later.has("s-0000000000000001", "p-0000000000000002", now.Add(30*time.Minute)) {
		t.Error("pruning kept the expired or dropped the live revocation")
	}
	b, _ := os.ReadFile(p)
	if n := len(splitLines(b)); n != 1 {
		t.Errorf("compacted file has %d lines, want 1", n)
	}
}

func splitLines(b []byte) []string {
	var out []string
	start := 0
	for i, c := range b {
		if c == '\n' {
			out = append(out, string(b[start:i]))
			start = i + 1
		}
	}
	return out
}
