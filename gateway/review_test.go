package gateway

import (
	"fmt"
	"testing"
	"time"
)

// TestReviewNotes: a review link's page, and each of its artifacts, is
// due once in reviewNoteEvery; what is kept stays within its bound.
func TestReviewNotes(t *testing.T) {
	var r reviewNotes
	now := time.Now()
	page, rec := reviewKey{"p-1", ""}, reviewKey{"p-1", "a"}
	if !r.due(page, now) {
		t.Fatal("a first view is not due")
	}
	r.noted(page, now)
	if r.due(page, now.Add(reviewNoteEvery-time.Second)) {
		t.Error("a second view within the window is due")
	}
	if !r.due(rec, now) || !r.due(reviewKey{"p-2", ""}, now) {
		t.Error("another artifact, or another link, is not due")
	}
	if !r.due(page, now.Add(reviewNoteEvery)) {
		t.Error("a view after the window is not due")
	}
	// Bounded: expired ones go first, then the oldest.
	for i := 0; i < maxReviewNotes+10; i++ {
		r.noted(reviewKey{fmt.Sprint("p-", i), ""}, now.Add(time.Duration(i)*time.Millisecond))
	}
	if len(r.last) != maxReviewNotes {
		t.Fatalf("%d kept, want %d", len(r.last), maxReviewNotes)
	}
	if _, ok := r.last[reviewKey{fmt.Sprint("p-", maxReviewNotes+9), ""}]; !ok {
		t.Error("the newest was not kept")
	}
	if _, ok := r.last[reviewKey{"p-0", ""}]; ok {
		t.Error("the oldest was kept past the bound")
	}
}
