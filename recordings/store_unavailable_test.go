package recordings

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"testing"

	"github.com/minio/minio-go/v7"
)

// TestUnavailable: a store that does not answer, or answers that it
// cannot now, is worth another try; an answer about what was stored, or
// an error of the caller's, is not (the controls).
func TestUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close() // nothing listens there now
	_, dial := net.Dial("tcp", ln.Addr().String())
	if dial == nil {
		t.Fatal("a closed port answered")
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("store artifact: %w", dial), true},
		{context.DeadlineExceeded, true},
		{minio.ErrorResponse{StatusCode: 503, Code: "ServiceUnavailable"}, true},
		{minio.ErrorResponse{StatusCode: 500, Code: "InternalError"}, true},
		{fmt.Errorf("store artifact: %w: %s", errBusy, "ConditionalRequestConflict"), true},
		{&url.Error{Op: "Put", URL: "http://store/x", Err: dial}, true},
		{&url.Error{Op: "Put", URL: "http://store/x", Err: io.ErrUnexpectedEOF}, true},
		{nil, false},
		// What the HTTP client says of a body longer than declared (a
		// file that grew while it was stored).
		{&url.Error{Op: "Put", URL: "http://store/x", Err: errors.New("http: ContentLength=10 with Body length 20")}, false},
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
