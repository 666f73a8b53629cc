package gateway

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// TestReviewNotes: a review link's page, and each of its artifacts, is
// recorded once in reviewNoteEvery; requests that come while it is
// being recorded wait for it; a failure is not remembered; what is kept
// stays within its bound.
func TestReviewNotes(t *testing.T) {
	var r reviewNotes
	now := time.Now()
	page, rec := reviewKey{"p-1", ""}, reviewKey{"p-1", "a"}
	n, mine := r.begin(page, now)
	if n == nil || !mine {
		t.Fatal("a first view is not recorded")
	}
	// A second request while the first records waits for that one.
	w, wmine := r.begin(page, now)
	if w != n || wmine {
		t.Fatalf("a view while the first is recorded: %v %v, want the first's note to wait on", w, wmine)
	}
	select {
	case <-w.done:
		t.Fatal("the note is done before it was ended")
	default:
	}
	r.end(page, n, now, nil)
	<-w.done
	if w.err != nil {
		t.Fatalf("a waiter sees %v", w.err)
	}
	if n, _ := r.begin(page, now.Add(reviewNoteEvery-time.Second)); n != nil {
		t.Error("a second view within the window is recorded")
	}
	for _, k := range []reviewKey{rec, {"p-2", ""}} {
		if n, mine := r.begin(k, now); n == nil || !mine {
			t.Errorf("%v: another artifact, or another link, is not recorded", k)
		} else {
			r.end(k, n, now, nil)
		}
	}
	if n, mine := r.begin(page, now.Add(reviewNoteEvery)); n == nil || !mine {
		t.Error("a view after the window is not recorded")
	} else {
		r.end(page, n, now.Add(reviewNoteEvery), nil)
	}

	// A failure reaches its waiters and is not remembered.
	k := reviewKey{"p-3", ""}
	n, _ = r.begin(k, now)
	w, _ = r.begin(k, now)
	r.end(k, n, now, errors.New("store down"))
	<-w.done
	if w.err == nil {
		t.Error("a waiter does not see the failure")
	}
	if n, mine := r.begin(k, now); n == nil || !mine {
		t.Error("a view after a failure is not recorded again")
	} else {
		r.end(k, n, now, nil)
	}

	// Many requests at once: one records, the rest wait for it.
	var wg sync.WaitGroup
	var mu sync.Mutex
	recorders := 0
	k = reviewKey{"p-4", ""}
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, mine := r.begin(k, now)
			switch {
			case mine:
				mu.Lock()
				recorders++
				mu.Unlock()
				time.Sleep(time.Millisecond)
				r.end(k, n, now, nil)
			case n != nil:
				<-n.done
			}
		}()
	}
	wg.Wait()
	if recorders != 1 {
		t.Errorf("%d of 40 requests at once recorded the view, want 1", recorders)
	}

	// Bounded: the oldest go.
	for i := 0; i < maxReviewNotes+10; i++ {
		k := reviewKey{fmt.Sprint("q-", i), ""}
		at := now.Add(time.Duration(i) * time.Millisecond)
		n, _ := r.begin(k, at)
		r.end(k, n, at, nil)
	}
	if len(r.notes) != maxReviewNotes {
		t.Fatalf("%d kept, want %d", len(r.notes), maxReviewNotes)
	}
	if _, ok := r.notes[reviewKey{fmt.Sprint("q-", maxReviewNotes+9), ""}]; !ok {
		t.Error("the newest was not kept")
	}
	if _, ok := r.notes[reviewKey{"q-0", ""}]; ok {
		t.Error("the oldest was kept past the bound")
	}
	if _, ok := r.notes[page]; ok {
		t.Error("an earlier link's note was kept past the bound")
	}
	// The same key recorded again and again leaves no growing order.
	for i := 0; i < 3*maxReviewNotes; i++ {
		at := now.Add(time.Duration(i) * reviewNoteEvery)
		n, _ := r.begin(page, at)
		r.end(page, n, at, nil)
	}
	if len(r.order) > 2*maxReviewNotes+1 {
		t.Errorf("the order holds %d stamps for %d notes", len(r.order), len(r.notes))
	}
}

// TestReviewViewer: a viewer's digest is stable for one address in one
// session, and differs between addresses, sessions, tenants and keys
// (it is keyed: without the key, nobody can try every address).
func TestReviewViewer(t *testing.T) {
	signer := func(k string) *signer {
		s, err := newSigner("k1", map[string]string{"k1": k})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := signer("0123456789abcdef0123456789abcdef")
	a := s.viewer("acme", "s-1", "203.0.113.7")
	if a != s.viewer("acme", "s-1", "203.0.113.7") || len(a) != 16 {
		t.Fatalf("the same viewer's digests: %q %q", a, s.viewer("acme", "s-1", "203.0.113.7"))
	}
	for name, b := range map[string]string{
		"another address": s.viewer("acme", "s-1", "203.0.113.8"),
		"another session": s.viewer("acme", "s-2", "203.0.113.7"),
		"another tenant":  s.viewer("beta", "s-1", "203.0.113.7"),
		"another key":     signer("fedcba9876543210fedcba9876543210").viewer("acme", "s-1", "203.0.113.7"),
	} {
		if b == a {
			t.Errorf("%s gives the same digest %q", name, a)
		}
	}
}

// TestClientAddr: the connection's address, unless it is a trusted
// proxy; then the nearest forwarded address that is not one, so that a
// client cannot name itself by writing X-Forwarded-For.
func TestClientAddr(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.1/32")}
	for _, c := range []struct {
		remote    string
		forwarded []string
		want      string
	}{
		{"203.0.113.7", nil, "203.0.113.7"},
		{"203.0.113.7", []string{"198.51.100.1"}, "203.0.113.7"}, // not from a proxy: ignored
		{"10.1.2.3", nil, "10.1.2.3"},
		{"10.1.2.3", []string{"198.51.100.1"}, "198.51.100.1"},
		{"10.1.2.3", []string{"1.2.3.4, 198.51.100.1"}, "198.51.100.1"}, // the client wrote 1.2.3.4
		{"10.1.2.3", []string{"1.2.3.4, 198.51.100.1, 192.0.2.1"}, "198.51.100.1"},
		{"10.1.2.3", []string{"1.2.3.4", "198.51.100.1 , 10.9.9.9"}, "198.51.100.1"},
		{"10.1.2.3", []string{"1.2.3.4, unknown"}, "10.1.2.3"},
		{"10.1.2.3", []string{"10.4.4.4"}, "10.4.4.4"},
		{"::ffff:10.1.2.3", []string{"2001:db8::1"}, "2001:db8::1"},
	} {
		if got := clientAddr(netip.MustParseAddr(c.remote), c.forwarded, trusted); got != c.want {
			t.Errorf("from %s with %q: %s, want %s", c.remote, c.forwarded, got, c.want)
		}
	}
}
