package gateway

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/ids"
)

// TestUploadOutlivesReadTimeout: an upload's body streams past the
// server's read timeout (uploadBody gives it UploadTimeout), while the
// same slow body on a route that keeps the read timeout is cut: the
// control that shows the timeout is short enough to matter.
func TestUploadOutlivesReadTimeout(t *testing.T) {
	const readTimeout = 300 * time.Millisecond
	u, _ := url.Parse("http://gw.test")
	s, err := New(Config{
		PublicURL: u, APIKeys: map[string]string{}, ReadTimeout: readTimeout, UploadTimeout: time.Minute,
		TokenKeys: map[string]string{"k1": strings.Repeat("a", 32)}, ActiveKey: "k1",
	}, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	count := func(c *fiber.Ctx, body io.Reader) error {
		n, err := io.Copy(io.Discard, body)
		if err != nil {
			return fiber.NewError(500, "read body")
		}
		return c.SendString(fmt.Sprint(n))
	}
	s.app.Put("/test/upload/files", func(c *fiber.Ctx) error { return count(c, s.uploadBody(c, int64(c.Request().Header.ContentLength()))) })
	s.app.Put("/test/plain/files", func(c *fiber.Ctx) error { return count(c, c.Context().RequestBodyStream()) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.app.Listener(l)
	t.Cleanup(func() { s.app.Shutdown() })

	// The body comes in chunks over about four read timeouts.
	const chunks, chunk = 12, 64 << 10
	put := func(path string) (int, string, error) {
		pr, pw := io.Pipe()
		go func() {
			buf := make([]byte, chunk)
			for i := 0; i < chunks; i++ {
				if _, err := pw.Write(buf); err != nil {
					return
				}
				time.Sleep(readTimeout / 3)
			}
			pw.Close()
		}()
		req, _ := http.NewRequest("PUT", "http://"+l.Addr().String()+path, pr)
		req.Host = "gw.test"
		req.ContentLength = chunks * chunk
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	start := time.Now()
	st, body, err := put("/test/upload/files")
	took := time.Since(start)
	if err != nil || st != 200 || body != fmt.Sprint(chunks*chunk) {
		t.Fatalf("slow upload: %d %q %v", st, body, err)
	}
	if took < 2*readTimeout {
		t.Fatalf("the upload took %s, not longer than the read timeout %s: the test proves nothing", took, readTimeout)
	}
	if st, body, err := put("/test/plain/files"); err == nil && st == 200 && body == fmt.Sprint(chunks*chunk) {
		t.Fatalf("control: the slow body on a route without the upload deadline was read whole (%d %q): the read timeout does not apply", st, body)
	}
}

// TestRefusedUploadEndsConnection: an upload refused before its body
// was read (no key; a bad path) ends its connection, so that the body's
// bytes are never read as the next request; the control: two requests
// sent at once on one connection are both answered.
func TestRefusedUploadEndsConnection(t *testing.T) {
	s := newTestServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.App().Listener(eofListener{ln}) // as Serve serves it
	defer s.App().Shutdown()
	answers := func(raw string) int {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		// The server closes the connection after its last answer, or
		// the client stops waiting at the deadline.
		c.(*net.TCPConn).CloseWrite()
		got, _ := io.ReadAll(c)
		return strings.Count(string(got), "HTTP/1.1 ")
	}
	health := "GET /healthz HTTP/1.1\r\nHost: gw.test:8080\r\n\r\n"
	if n := answers(health + health); n != 2 {
		t.Fatalf("two requests on one connection: %d answers, want 2", n)
	}
	put := func(auth, query string) string {
		return fmt.Sprintf("PUT /v1/sessions/%s/files?path=%s HTTP/1.1\r\nHost: gw.test:8080\r\n%sContent-Length: %d\r\n\r\n%s",
			ids.NewSession(), query, auth, len(health), health)
	}
	key := "Authorization: Bearer good-key\r\n"
	for name, raw := range map[string]string{"no key": put("", "/tmp/x"), "a relative path": put(key, "tmp/x")} {
		if n := answers(raw + health); n != 1 {
			t.Errorf("an upload refused for %s, its body a request, then a request: %d answers, want 1", name, n)
		}
	}
}
