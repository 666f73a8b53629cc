package gateway

import (
	"strings"
	"testing"
	"time"
)

func testClaims(exp time.Time) previewClaims {
	c := previewClaims{Session: "s-0123456789abcdef", Tenant: "t", Scope: ScopeCDP}
	c.ID = "p-0123456789abcdef"
	c.ExpiresAt = jwtTime(exp)
	return c
}

func TestTokenRoundTripAndRotation(t *testing.T) {
	now := time.Now()
	old, err := newSigner("k1", map[string]string{"k1": strings.Repeat("a", 32)})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := old.issue(testClaims(now.Add(time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	// Rotation: k2 signs, k1 still verifies.
	rotated, _ := newSigner("k2", map[string]string{"k1": strings.Repeat("a", 32), "k2": strings.Repeat("b", 32)})
	c, err := rotated.verify(tok, now)
	if err != nil || c.Session != "s-0123456789abcdef" || c.Scope != ScopeCDP {
		t.Fatalf("verify after rotation: %+v %v", c, err)
	}
	// k1 removed: its tokens stop working.
	retired, _ := newSigner("k2", map[string]string{"k2": strings.Repeat("b", 32)})
	if _, err := retired.verify(tok, now); err == nil {
		t.Fatal("a token of a removed key verified")
	}
}

func TestTokenRejects(t *testing.T) {
	now := time.Now()
	s, _ := newSigner("k1", map[string]string{"k1": strings.Repeat("a", 32)})
	good, _ := s.issue(testClaims(now.Add(time.Minute)))
	expired, _ := s.issue(testClaims(now.Add(-time.Second)))
	noExp := testClaims(now)
	noExp.ExpiresAt = nil
	unexpiring, _ := s.issue(noExp)
	other, _ := newSigner("k1", map[string]string{"k1": strings.Repeat("c", 32)})
	forged, _ := other.issue(testClaims(now.Add(time.Minute)))
	parts := strings.Split(good, ".")
	for name, tok := range map[string]string{
		"empty":       "",
		"garbage":     "not-a-token",
		"expired":     expired,
		"no-expiry":   unexpiring,
		"forged":      forged,
		"swapped-sig": parts[0] + "." + parts[1] + "." + strings.Split(forged, ".")[2],
		"too-long":    strings.Repeat("a", 5000),
	} {
		if _, err := s.verify(tok, now); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
	if _, err := s.verify(good, now); err != nil {
		t.Fatalf("good token: %v", err)
	}
}

func TestShortKeysRefused(t *testing.T) {
	if _, err := newSigner("k1", map[string]string{"k1": "short"}); err == nil {
		t.Fatal("a short signing key was accepted")
	}
	if _, err := newSigner("k9", map[string]string{"k1": strings.Repeat("a", 32)}); err == nil {
		t.Fatal("an active key that is not configured was accepted")
	}
}

// FuzzVerify: whatever the string, verify does not panic, and it accepts
// only what the key signed: the one set of claims issued below.
func FuzzVerify(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	s, _ := newSigner("k1", map[string]string{"k1": strings.Repeat("a", 32), "k2": strings.Repeat("b", 32)})
	signed := testClaims(now.Add(time.Hour))
	good, err := s.issue(signed)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	parts := strings.Split(good, ".")
	f.Add(parts[0] + "." + parts[1] + ".")
	f.Add(parts[0] + ".." + parts[2])
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := s.verify(tok, now)
		if err != nil {
			return
		}
		if c.Session != signed.Session || c.Tenant != signed.Tenant || c.Scope != signed.Scope || c.ID != signed.ID || c.ViewOnly != signed.ViewOnly {
			t.Fatalf("verified claims that were never signed: %+v", c)
		}
	})
}
