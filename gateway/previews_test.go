package gateway

import (
	"testing"
	"time"

	"github.com/sandgate/sandgate/session"
)

// previewIssued reads a preview's expiry from the trail, whether the
// event came from memory (a time) or back from the file (a string); an
// id never issued has none, and a trail that dropped preview issues says
// so.
func TestPreviewIssued(t *testing.T) {
	exp := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	evs := []session.Event{
		{Type: "preview_issued", Fields: map[string]any{"preview": "p-0000000000000001", "expires_at": exp}},
		{Type: "preview_issued", Fields: map[string]any{"preview": "p-0000000000000002", "expires_at": exp.Format(time.RFC3339Nano)}},
		{Type: "audit_truncated", Fields: map[string]any{"type": "exec"}},
	}
	for _, pid := range []string{"p-0000000000000001", "p-0000000000000002"} {
		if got, truncated := previewIssued(evs, pid); !got.Equal(exp) || truncated {
			t.Errorf("%s: %v %v", pid, got, truncated)
		}
	}
	if got, truncated := previewIssued(evs, "p-0000000000000003"); !got.IsZero() || truncated {
		t.Errorf("never issued: %v %v", got, truncated)
	}
	evs = append(evs, session.Event{Type: "audit_truncated", Fields: map[string]any{"type": "preview_issued"}})
	if _, truncated := previewIssued(evs, "p-0000000000000003"); !truncated {
		t.Error("a trail that dropped preview issues does not say so")
	}
}
