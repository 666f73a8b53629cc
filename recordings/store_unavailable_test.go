package recordings

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/minio/minio-go/v7"
)

// TestUnavailable: a store that does not answer, or answers that it
// cannot now, is worth another try; an answer about what was stored, or
// an error of the caller's, is not (the controls).
func TestUnavailable(t *testing.T) {
	_, dial := net.Dial("tcp", "127.0.0.1:1") // nothing listens there
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("store artifact: %w", dial), true},
		{context.DeadlineExceeded, true},
		{minio.ErrorResponse{StatusCode: 503, Code: "ServiceUnavailable"}, true},
		{minio.ErrorResponse{StatusCode: 500, Code: "InternalError"}, true},
		{fmt.Errorf("store artifact: %w: %s", errBusy, "ConditionalRequestConflict"), true},
		{nil, false},
		{ErrExists, false},
		{minio.ErrorResponse{StatusCode: 400, Code: "InvalidArgument"}, false},
		{minio.ErrorResponse{StatusCode: 403, Code: "AccessDenied"}, false},
		{errors.New("recordings: bad tenant, session, id or name"), false},
	} {
		if got := Unavailable(c.err); got != c.want {
			t.Errorf("Unavailable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
