package test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sandgate/sandgate/desktop"
)

// gatewayReadTimeout is the test gateway's read_timeout (config): short,
// so that TestSlowUpload shows uploads outlive it.
const gatewayReadTimeout = 5 * time.Second

// TestForwardedHostIgnored: X-Forwarded-Host from a client that is not a
// configured proxy does not pass the Host check.
func TestForwardedHostIgnored(t *testing.T) {
	e := needE2E(t)
	get := func(host, xfh string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", e.gwURL+"/openapi.json", nil)
		req.Host = host
		if xfh != "" {
			req.Header.Set("X-Forwarded-Host", xfh)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name, host, xfh string
		status          int
	}{
		{"own host (control)", e.gwAddr, "", 200},
		{"foreign host", "evil.example", "", 403},
		{"foreign host naming the gateway in X-Forwarded-Host", "evil.example", e.gwAddr, 403},
		{"foreign host, X-Forwarded-Host list naming the gateway", "evil.example", e.gwAddr + ", evil.example", 403},
		{"own host, foreign X-Forwarded-Host ignored", e.gwAddr, "evil.example", 200},
	} {
		if got := get(tc.host, tc.xfh); got != tc.status {
			t.Errorf("%s: Host %q X-Forwarded-Host %q: %d, want %d", tc.name, tc.host, tc.xfh, got, tc.status)
		}
	}
}

// gatewayMemory reads the gateway's resident set and its peak, in bytes.
func (e *testEnv) gatewayMemory(t *testing.T) (rss, peak int64) {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", e.gw.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		var kb int64
		if n, _ := fmt.Sscanf(sc.Text(), "VmRSS: %d kB", &kb); n == 1 {
			rss = kb << 10
		}
		if n, _ := fmt.Sscanf(sc.Text(), "VmHWM: %d kB", &kb); n == 1 {
			peak = kb << 10
		}
	}
	if rss == 0 || peak == 0 {
		t.Fatalf("no VmRSS/VmHWM in /proc/%d/status", e.gw.Process.Pid)
	}
	return rss, peak
}

// sendHuge writes one binary message of size bytes in 1 MiB frames, and
// stops at the first write that fails (the gateway closed).
func sendHuge(c *websocket.Conn, size int) (sent int) {
	w, err := c.NextWriter(websocket.BinaryMessage)
	if err != nil {
		return 0
	}
	chunk := bytes.Repeat([]byte{0}, 1<<20)
	for sent < size {
		n, err := w.Write(chunk)
		sent += n
		if err != nil {
			return sent
		}
	}
	w.Close()
	return sent
}

// closeReason reads until the connection ends and returns its close
// frame, if one came.
func closeReason(t *testing.T, c *websocket.Conn) *websocket.CloseError {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return ce
		}
		t.Logf("connection ended without a close frame: %v", err)
		return nil
	}
}

// TestWebSocketReadLimits: a message over the limit on a view-only VNC
// socket (2 MiB) or a shell (1 MiB) closes that connection with 1009 and
// a reason, a 256 MiB one leaves the gateway's memory where it was, and
// messages of normal size pass.
func TestWebSocketReadLimits(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	const huge = 256 << 20
	// growth is what the gateway may gain from a huge message: far
	// below the message.
	const growth = 64 << 20

	dialVNC := func(t *testing.T) *websocket.Conn {
		t.Helper()
		p := e.vncPreview(t, e.keyA, s.ID, "vnc", true, 120)
		u := strings.Replace(p.URL, "http://", "ws://", 1)
		c, resp, err := websocket.DefaultDialer.Dial(u, nil)
		if err != nil {
			status := 0
			if resp != nil {
				status = resp.StatusCode
			}
			t.Fatalf("dial vnc: %v (%d)", err, status)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dialShell := func(t *testing.T) *websocket.Conn {
		t.Helper()
		u := "ws://" + e.gwAddr + "/v1/sessions/" + s.ID + "/shell"
		c, resp, err := websocket.DefaultDialer.Dial(u, http.Header{"Authorization": {"Bearer " + e.keyA}})
		if err != nil {
			status := 0
			if resp != nil {
				status = resp.StatusCode
			}
			t.Fatalf("dial shell: %v (%d)", err, status)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for _, tc := range []struct {
		name  string
		limit int
		dial  func(*testing.T) *websocket.Conn
		// normal sends a message of normal size and checks its effect.
		normal func(*testing.T, *websocket.Conn)
	}{
		{"vnc-view-only", 2 << 20, dialVNC, func(t *testing.T, c *websocket.Conn) {
			// A whole RFB handshake: the viewer's messages pass.
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			if _, err := desktop.Handshake(&wsStream{c: c}, 3840, 2160); err != nil {
				t.Fatalf("rfb handshake through the gateway: %v", err)
			}
		}},
		{"shell", 1 << 20, dialShell, func(t *testing.T, c *websocket.Conn) {
			if err := c.WriteMessage(websocket.BinaryMessage, []byte("echo $((6*7))x\n")); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			var out strings.Builder
			for !strings.Contains(out.String(), "42x") {
				_, data, err := c.ReadMessage()
				if err != nil {
					t.Fatalf("shell output %q: %v", out.String(), err)
				}
				out.Write(data)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Run("normal message (control)", func(t *testing.T) {
				tc.normal(t, tc.dial(t))
			})
			t.Run("just over the limit", func(t *testing.T) {
				c := tc.dial(t)
				if err := c.WriteMessage(websocket.BinaryMessage, make([]byte, tc.limit+1)); err != nil {
					t.Fatal(err)
				}
				ce := closeReason(t, c)
				if ce == nil || ce.Code != websocket.CloseMessageTooBig || !strings.Contains(ce.Text, fmt.Sprint(tc.limit)) {
					t.Fatalf("want close 1009 naming the limit, got %v", ce)
				}
			})
			t.Run("256 MiB", func(t *testing.T) {
				c := tc.dial(t)
				rss0, peak0 := e.gatewayMemory(t)
				sent := sendHuge(c, huge)
				closeReason(t, c)
				rss1, peak1 := e.gatewayMemory(t)
				t.Logf("sent %d MiB before the gateway closed; gateway RSS %d -> %d MiB, peak %d -> %d MiB",
					sent>>20, rss0>>20, rss1>>20, peak0>>20, peak1>>20)
				if sent >= huge {
					t.Errorf("the gateway took the whole %d MiB message", huge>>20)
				}
				if peak1-peak0 > growth || rss1-rss0 > growth {
					t.Fatalf("the gateway grew by %d MiB (peak by %d MiB) on one message", (rss1-rss0)>>20, (peak1-peak0)>>20)
				}
			})
			t.Run("after", func(t *testing.T) {
				// The refusals ended only their own connections.
				tc.normal(t, tc.dial(t))
			})
		})
	}
	st, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID+"/events", nil)
	if st != 200 || !strings.Contains(string(body), `"message_too_big"`) {
		t.Fatalf("the trail does not record the refused messages: %d", st)
	}
}

// TestRevokeByOtherTenant: another tenant's revoke of a preview answers
// 404 and writes nothing into the session's trail; the owner's works.
func TestRevokeByOtherTenant(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	p := e.preview(t, e.keyA, s.ID, 300)
	path := "/v1/sessions/" + s.ID + "/previews/" + p.ID
	revoked := func() int {
		t.Helper()
		st, body := e.api(t, e.keyA, "GET", "/v1/sessions/"+s.ID+"/events", nil)
		if st != 200 {
			t.Fatalf("events: %d", st)
		}
		return strings.Count(string(body), `"preview_revoked"`)
	}
	if st, body := e.api(t, e.keyB, "DELETE", path, nil); st != 404 {
		t.Fatalf("tenant-b revoking tenant-a's preview: %d %s, want 404", st, body)
	}
	if n := revoked(); n != 0 {
		t.Fatalf("another tenant's revoke wrote %d preview_revoked events into the trail", n)
	}
	if _, err := browserWSErr(p.URL); err != nil {
		t.Fatalf("the preview stopped working after another tenant's revoke: %v", err)
	}
	if st, body := e.api(t, e.keyA, "DELETE", path, nil); st != 204 {
		t.Fatalf("owner revoking: %d %s", st, body)
	}
	if n := revoked(); n != 1 {
		t.Fatalf("the owner's revoke wrote %d preview_revoked events, want 1", n)
	}
	if _, err := browserWSErr(p.URL); err == nil {
		t.Fatal("the revoked preview still works")
	}
}

// slowBody hands out left bytes in pieces, pausing before each piece.
type slowBody struct {
	left, piece, inPiece int
	pause                time.Duration
	h                    io.Writer
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	if b.inPiece == 0 {
		time.Sleep(b.pause)
	}
	n := min(len(p), b.piece-b.inPiece, b.left)
	for i := range p[:n] {
		p[i] = byte(b.left - i)
	}
	b.h.Write(p[:n])
	b.left -= n
	b.inPiece = (b.inPiece + n) % b.piece
	return n, nil
}

// TestSlowUpload: an upload that takes longer than the gateway's read
// timeout arrives whole; a request body as slow on another route is cut
// at the read timeout (the control that shows the timeout is short).
func TestSlowUpload(t *testing.T) {
	e := needE2E(t)
	s := e.createSession(t, e.keyA, nil)
	const size, pieces = 4 << 20, 40
	pause := 2 * gatewayReadTimeout / pieces // two read timeouts in all
	send := func(method, path string, size int, h io.Writer) (int, []byte, time.Duration, error) {
		req, _ := http.NewRequest(method, e.gwURL+path, &slowBody{left: size, piece: size / pieces, pause: pause, h: h})
		req.ContentLength = int64(size)
		req.Header.Set("Authorization", "Bearer "+e.keyA)
		start := time.Now()
		resp, err := (&http.Client{Timeout: 5 * time.Minute}).Do(req)
		if err != nil {
			return 0, nil, time.Since(start), err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b, time.Since(start), nil
	}
	sum := sha256.New()
	st, body, took, err := send("PUT", "/v1/sessions/"+s.ID+"/files?path=/home/sandgate/workspace/slow.bin", size, sum)
	if err != nil || st != 201 {
		t.Fatalf("slow upload: %d %s %v after %s", st, body, err, took)
	}
	var got struct {
		Size   int64  `json:"size"`
		SHA256 string `json:"sha256"`
	}
	json.Unmarshal(body, &got)
	if got.Size != int64(size) || got.SHA256 != hex.EncodeToString(sum.Sum(nil)) {
		t.Fatalf("the upload arrived as %+v", got)
	}
	if took <= gatewayReadTimeout {
		t.Fatalf("the upload took %s, not longer than the read timeout %s: the test proves nothing", took, gatewayReadTimeout)
	}
	t.Logf("uploaded %d MiB in %s with a read timeout of %s", size>>20, took.Round(time.Millisecond), gatewayReadTimeout)
	// A small file as slow: it streams too, and is not read in full
	// under the read timeout before the handler.
	st, body, took, err = send("PUT", "/v1/sessions/"+s.ID+"/files?path=/home/sandgate/workspace/slow-small.bin", 64<<10, io.Discard)
	if err != nil || st != 201 || took <= gatewayReadTimeout {
		t.Fatalf("slow small upload: %d %s %v after %s", st, body, err, took)
	}
	// Control: as slow a body (under the body limit) to another route is
	// cut at the read timeout, long before all of it could be sent.
	st, body, took, err = send("POST", "/v1/sessions/"+s.ID+"/extend", 512<<10, io.Discard)
	if err == nil && (st < 400 || took > gatewayReadTimeout*3/2) {
		t.Fatalf("control: a slow body on another route got %d %s after %s: the read timeout does not apply", st, body, took)
	}
	t.Logf("control: slow body elsewhere: %d %v after %s", st, err, took.Round(time.Millisecond))
}
