package session

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
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

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// A shared link's holders cannot open connections without bound: a
// preview gets MaxPreviewConns, a session MaxSessionConns; a released one
// frees its place (the control).
func TestTrackBounded(t *testing.T) {
	m := testManager(t)
	m.byAddr = map[netip.Addr]*sess{}
	rv, err := loadRevocations(filepath.Join(t.TempDir(), "revocations.jsonl"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m.revocations = rv
	s := addSess(m, "s-0000000000000001", netip.MustParseAddr("10.231.0.5"))
	var release []func()
	for i := 0; i < MaxPreviewConns; i++ {
		r, err := m.Track("acme", s.info.ID, "p1", nopCloser{})
		if err != nil {
			t.Fatalf("connection %d of a preview refused: %v", i, err)
		}
		release = append(release, r)
	}
	if _, err := m.Track("acme", s.info.ID, "p1", nopCloser{}); !errors.Is(err, ErrQuota) {
		t.Fatalf("preview connection %d: %v, want %v", MaxPreviewConns+1, err, ErrQuota)
	}
	release[0]()
	if _, err := m.Track("acme", s.info.ID, "p1", nopCloser{}); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	for i := MaxPreviewConns; i < MaxSessionConns; i++ {
		if _, err := m.Track("acme", s.info.ID, "p2-"+string(rune('a'+i%8)), nopCloser{}); err != nil {
			t.Fatalf("session connection %d refused: %v", i, err)
		}
	}
	if _, err := m.Track("acme", s.info.ID, "p3", nopCloser{}); !errors.Is(err, ErrQuota) {
		t.Fatalf("session connection %d: %v, want %v", MaxSessionConns+1, err, ErrQuota)
	}
}

// A session holds at most MaxRevocationsPerSession revocations: the next
// is refused as over quota (and not made), one already held may be made
// again, and another session is not held back.
func TestRevocationCap(t *testing.T) {
	m := testManager(t)
	r, err := loadRevocations(filepath.Join(t.TempDir(), "revocations.jsonl"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m.revocations = r
	const id, other = "s-0000000000000001", "s-0000000000000002"
	for _, sid := range []string{id, other} {
		s := newSess(Info{ID: sid, Tenant: "acme", State: StateRunning})
		m.sessions[sid] = s
	}
	until := time.Now().Add(time.Hour)
	for i := range MaxRevocationsPerSession {
		r.m[revocation{id, fmt.Sprintf("p-%016x", i)}] = until
	}
	err = m.RevokePreview(context.Background(), "acme", id, "p-ffffffffffffffff", until)
	if !errors.Is(err, ErrQuota) || m.Revoked(id, "p-ffffffffffffffff") {
		t.Fatalf("one past the cap: %v, revoked %v", err, m.Revoked(id, "p-ffffffffffffffff"))
	}
	if err := m.RevokePreview(context.Background(), "acme", id, "p-0000000000000000", until); err != nil {
		t.Fatalf("again, one it holds: %v", err)
	}
	if err := m.RevokePreview(context.Background(), "acme", other, "p-ffffffffffffffff", until); err != nil || !m.Revoked(other, "p-ffffffffffffffff") {
		t.Fatalf("another session's: %v", err)
	}
}

// HoldRevocation holds a revocation another replica stored: for a
// session of the tenant's it holds (its connections end), and for one
// it does not hold at all (a review link's); not for another tenant's
// session; and past MaxRevocationsPerSession too (the store has it).
func TestHoldRevocation(t *testing.T) {
	m := testManager(t)
	m.byAddr = map[netip.Addr]*sess{}
	r, err := loadRevocations(filepath.Join(t.TempDir(), "revocations.jsonl"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m.revocations = r
	s := addSess(m, "s-0000000000000001", netip.MustParseAddr("10.231.0.5"))
	closed := make(chan struct{}, 1)
	if _, err := m.Track("acme", s.info.ID, "p-0000000000000001", closerFunc(func() error { closed <- struct{}{}; return nil })); err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Hour)
	if err := m.HoldRevocation("other", s.info.ID, "p-0000000000000001", until); !errors.Is(err, ErrNotFound) || m.Revoked(s.info.ID, "p-0000000000000001") {
		t.Fatalf("another tenant's session: %v, revoked %v", err, m.Revoked(s.info.ID, "p-0000000000000001"))
	}
	if err := m.HoldRevocation("acme", s.info.ID, "p-0000000000000001", until); err != nil || !m.Revoked(s.info.ID, "p-0000000000000001") {
		t.Fatalf("the tenant's session: %v", err)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Error("the revoked preview's connection goes on")
	}
	const gone = "s-00000000000000ff"
	if err := m.HoldRevocation("acme", gone, "p-0000000000000002", until); err != nil || !m.Revoked(gone, "p-0000000000000002") {
		t.Fatalf("a session not held: %v", err)
	}
	for i := range MaxRevocationsPerSession {
		r.m[revocation{s.info.ID, fmt.Sprintf("p-1%015x", i)}] = until
	}
	if err := m.HoldRevocation("acme", s.info.ID, "p-0000000000000003", until); err != nil || !m.Revoked(s.info.ID, "p-0000000000000003") {
		t.Fatalf("past the cap: %v", err)
	}
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }
