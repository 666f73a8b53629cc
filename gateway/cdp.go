package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/contrib/websocket"
	"github.com/gofiber/fiber/v2"
	"github.com/golang-jwt/jwt/v5"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/session"
)

const (
	localClaims   = "claims"
	localEndpoint = "endpoint"
	localUpstream = "upstream"
	localInfo     = "info"
	// localReviewKeep: a review's use is kept for the next leader
	// (reviewOrAlone), not recorded here (noteReview).
	localReviewKeep = "review_keep"
)

func jwtTime(t time.Time) *jwt.NumericDate { return jwt.NewNumericDate(t) }

// previewAuth checks the token in the path: signature, expiry, scope, that
// its session is running and that it was not revoked. Every failure is the
// same 401, so a client learns nothing about other sessions.
//
// Where a route has no token in its path (CDP tools that take an
// endpoint and headers, such as Playwright MCP's --cdp-header), the token
// comes as "Authorization: Bearer <token>".
func (s *Server) previewAuth(scopes ...string) fiber.Handler {
	return func(c *fiber.Ctx) error {
		token := c.Params("token")
		if t, ok := strings.CutPrefix(c.Get(fiber.HeaderAuthorization), "Bearer "); ok && token == "" {
			token = t
		}
		claims, ep, info, err := s.live.admit(token)
		if err != nil {
			if ae, ok := err.(*apiError); ok && ae.status == fiber.StatusServiceUnavailable {
				c.Set(fiber.HeaderRetryAfter, "2")
			}
			return err
		}
		if !slices.Contains(scopes, claims.Scope) {
			return errUnauthenticated("the preview token is missing, invalid or expired")
		}
		c.Locals(localClaims, claims)
		c.Locals(localEndpoint, ep)
		c.Locals(localInfo, info)
		return c.Next()
	}
}

// cdpDiscovery serves /json/version, /json, /json/list and /json/protocol
// with the WebSocket URLs pointing back at the gateway.
func (s *Server) cdpDiscovery(c *fiber.Ctx) error {
	path := strings.Trim("json/"+c.Params("*"), "/")
	if !browser.DiscoveryPaths[path] {
		return errNotFound("no such CDP endpoint")
	}
	ep := c.Locals(localEndpoint).(session.Endpoint)
	claims := c.Locals(localClaims).(*previewClaims)
	// The WebSocket URLs keep the form the client used: the token in the
	// path, or none (the client sends its header again).
	prefix := s.wsScheme + "://" + c.Hostname() + "/cdp/" + c.Params("token")
	if c.Params("token") == "" {
		prefix = s.wsScheme + "://" + c.Hostname() + "/cdp"
	}
	ctx, cancel := reqCtx(c, 15*time.Second)
	defer cancel()
	var body []byte
	var err error
	if path == "json/version" {
		body, err = s.browserVersion(ctx, claims.Tenant, claims.Session, ep)
		if err == nil {
			body, err = browser.RewriteVersion(body, prefix)
		}
	} else {
		body, err = browser.Discover(ctx, ep.CDP, path, prefix)
	}
	if err != nil {
		s.staleVersion(claims.Tenant, claims.Session)
		return proxyError(ctx, err)
	}
	s.live.touch(claims)
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSONCharsetUTF8)
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Send(body)
}

// proxyError maps an upstream failure: timeout 504, anything else 502.
func proxyError(ctx context.Context, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() == context.DeadlineExceeded {
		return &apiError{status: 504, code: "unavailable", msg: "the session's browser did not answer in time", err: err}
	}
	return &apiError{status: 502, code: "unavailable", msg: "the session's browser is not reachable", err: err}
}

var devtoolsPath = regexp.MustCompile(`^(browser|page)/([A-Za-z0-9._-]{1,128})$`)

// cdpUpgrade checks a CDP WebSocket request before the upgrade: the target
// must belong to the token's session, and the session's browser must
// accept the connection. Failures are plain HTTP errors.
func (s *Server) cdpUpgrade(c *fiber.Ctx) error {
	if !websocket.IsWebSocketUpgrade(c) {
		return errInvalid("this endpoint needs a WebSocket upgrade")
	}
	ep := c.Locals(localEndpoint).(session.Endpoint)
	claims := c.Locals(localClaims).(*previewClaims)
	ctx, cancel := reqCtx(c, 15*time.Second)
	defer cancel()
	// browserID is the session's browser target, from its kept
	// /json/version unless fresh is set.
	browserID := func(fresh bool) (string, error) {
		var body []byte
		var err error
		if fresh {
			body, err = s.fetchVersion(ctx, claims.Tenant, claims.Session, ep)
		} else {
			body, err = s.browserVersion(ctx, claims.Tenant, claims.Session, ep)
		}
		if err != nil {
			return "", err
		}
		return browser.VersionID(body)
	}
	m := devtoolsPath.FindStringSubmatch(c.Params("*"))
	if strings.Trim(c.Params("*"), "/") == "" && !strings.Contains(c.Path(), "/devtools") {
		id, err := browserID(false)
		if err != nil {
			s.staleVersion(claims.Tenant, claims.Session)
			return proxyError(ctx, err)
		}
		m = []string{"", "browser", id}
	}
	if m == nil {
		return errNotFound("no such CDP target")
	}
	// A target id of another session (or of nothing) is refused like a
	// bad token: this token does not grant it.
	if m[1] == "browser" {
		id, err := browserID(false)
		if err == nil && id != m[2] {
			// Chromium may have restarted since the answer was kept.
			id, err = browserID(true)
		}
		if err != nil {
			s.staleVersion(claims.Tenant, claims.Session)
			return proxyError(ctx, err)
		}
		if id != m[2] {
			return errUnauthenticated("the preview token does not grant this target")
		}
	} else {
		ts, err := browser.Targets(ctx, ep.CDP)
		if err != nil {
			return proxyError(ctx, err)
		}
		found := false
		for _, t := range ts {
			found = found || t.ID == m[2]
		}
		if !found {
			return errUnauthenticated("the preview token does not grant this target")
		}
	}
	c.Locals(localUpstream, devtoolsTarget(ep, m[1], m[2]))
	return c.Next()
}

// devtoolsTarget is the WebSocket address of a CDP target (kind browser
// or page) in the session's Chromium: the upstream of a client's
// connection, and of the spare that may stand in for its dial (the two
// must be spelt the same).
func devtoolsTarget(ep session.Endpoint, kind, id string) string {
	return "ws://" + ep.CDP.String() + "/devtools/" + kind + "/" + id
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// CDPLimits bound one CDP connection through the proxy. A client's
// message is held whole on its way (the gateway reads every command), so
// ClientMessage bounds the gateway's memory per connection. The browser's
// frames are relayed as Chromium framed them (one frame a message, which
// clients such as rod rely on), through buffers of a fixed size.
type CDPLimits struct {
	// ClientMessage bounds one message from a client (32 MiB).
	ClientMessage int64
	// BrowserMessage bounds one message from the session's Chromium, the
	// sum of its frames (128 MiB; Chromium's own largest are about
	// 100 MiB).
	BrowserMessage int64
}

// DefaultCDPLimits are the limits when the configuration sets none.
var DefaultCDPLimits = CDPLimits{ClientMessage: 32 << 20, BrowserMessage: 128 << 20}

// cdpLimits are this gateway's CDP limits: the config's (limits.cdp_*),
// the defaults where it sets none.
func (s *Server) cdpLimits() CDPLimits {
	l := s.cfg.CDP
	if l.ClientMessage <= 0 {
		l.ClientMessage = DefaultCDPLimits.ClientMessage
	}
	if l.BrowserMessage <= 0 {
		l.BrowserMessage = DefaultCDPLimits.BrowserMessage
	}
	return l
}

// cdpProxy pumps CDP messages both ways until either side closes, the
// token expires, the preview is revoked or the session ends.
func (s *Server) cdpProxy() fiber.Handler {
	return websocket.New(func(client *websocket.Conn) {
		target := client.Locals(localUpstream).(string)
		claims := client.Locals(localClaims).(*previewClaims)
		live := func() bool { return s.live.running(claims.Tenant, claims.Session) }
		var up net.Conn
		var upr *bufio.Reader
		ok := false
		if s.live.spares() {
			up, upr, ok = s.takeSpare(claims.Session, target, live)
		}
		var err error
		if !ok {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			up, upr, err = dialBrowser(ctx, target)
			cancel()
		}
		if err != nil {
			// A kept browser id may be stale: the next client fetches.
			s.staleVersion(claims.Tenant, claims.Session)
			s.log.Warn("cdp upstream unreachable", "session", claims.Session, "err", err)
			client.Close()
			return
		}
		s.pump(client, up, upr, claims, s.cdpLimits())
	}, websocket.Config{
		// The library only upgrades: after it, the proxy reads and writes
		// the frames itself, so the library's buffers are the smallest it
		// takes. No compression is negotiated (the default), so the
		// browser's frames go to the client as they are, and a frame with
		// RSV1 set is refused.
		ReadBufferSize:  maxControl,
		WriteBufferSize: maxControl,
	})
}

// pump moves CDP both ways. From the client it reads whole messages,
// because each goes through browser.RewriteCommand; from the browser,
// which carries screenshots and events, it relays frames as they come,
// checked but neither held nor re-encoded.
func (s *Server) pump(client *websocket.Conn, up net.Conn, upr *bufio.Reader, claims *previewClaims, limits CDPLimits) {
	log := s.log.With("session", claims.Session, "tenant", claims.Tenant, "preview", claims.ID)
	// The library's connection is left alone after the upgrade, so it
	// never writes (no pong, no close echo) between the proxy's frames.
	// Reads go through fasthttp's wrapper, which may hold bytes read past
	// the upgrade request; writes and closing go to the connection under
	// it (whose Close is real, and which can splice).
	cc := client.NetConn()
	raw := cc
	if u, ok := cc.(interface{ UnsafeConn() net.Conn }); ok {
		raw = underEOF(u.UnsafeConn())
	}
	// A message over a limit fails on the frame header that announces it,
	// before its payload is read.
	fromClient := &wsReader{r: bufio.NewReaderSize(cc, 64<<10), masked: true, limit: limits.ClientMessage}
	fromBrowser := &wsReader{r: upr, raw: up, limit: limits.BrowserMessage}
	// The client connection has two writers: the browser's frames and the
	// gateway's own frames (answers to refused commands, pongs, close).
	toClient := &wsWriter{conn: raw}
	// So has the browser's: the client's messages and pongs.
	toBrowser := newMaskedWriter(up)
	var once sync.Once
	var reason string
	// Closing drops both TCP connections without a close frame, as
	// Chromium itself does: some CDP clients (rod) read every frame as a
	// JSON message and crash on a close frame.
	shut := func(why string) {
		once.Do(func() {
			reason = why
			// End blocked reads and writes now, whichever connection the
			// client side is.
			raw.SetDeadline(time.Unix(1, 0))
			raw.Close()
			up.Close()
			log.Info("cdp connection closing", "reason", why)
		})
	}
	failed := func(side string, err error, limit int64) string {
		switch {
		case errors.Is(err, errMessageTooBig):
			return fmt.Sprintf("the %s sent a message over the limit of %d bytes", side, limit)
		case errors.Is(err, errProtocol):
			return fmt.Sprintf("the %s sent %v", side, err)
		case errors.Is(err, errWriteFailed):
			// Only writes to the client report this; a failed write to
			// the browser ends as the browser closing.
			return "client write failed"
		case errors.Is(err, errRelayBroken):
			return "a browser frame was cut short on its way"
		}
		return side + " closed the connection"
	}
	release, err := s.live.track(claims, closerFunc(func() error {
		shut("preview revoked or session ended")
		return nil
	}))
	if err != nil {
		shut("preview revoked or session ended")
		return
	}
	defer release()
	expiry := time.AfterFunc(time.Until(claims.ExpiresAt.Time), func() {
		shut("preview expired")
	})
	defer expiry.Stop()
	log.Info("cdp connection opened")
	s.live.record(claims, "preview_connected", map[string]any{"preview": claims.ID, "scope": claims.Scope})
	start := time.Now()

	done := make(chan struct{})
	go func() {
		defer close(done)
		err := fromBrowser.relayTo(toClient, func(op byte, p []byte) error {
			switch op {
			case opPing:
				if err := toBrowser.writeFrame(opPong, p); err != nil {
					return fmt.Errorf("pong: %v", err)
				}
			case opClose:
				return errPeerClosed
			}
			return nil
		})
		shut(failed("browser", err, limits.BrowserMessage))
	}()
	var buf []byte
	var lastTouch time.Time
	for {
		op, msg, err := fromClient.readMessage(buf[:0], func(op byte, p []byte) error {
			switch op {
			case opPing:
				return toClient.writeFrame(opPong, p)
			case opClose:
				return errPeerClosed
			}
			return nil
		})
		if err != nil {
			raw.SetWriteDeadline(time.Now().Add(time.Second))
			switch {
			case errors.Is(err, errMessageTooBig):
				toClient.closeFrame(1009, tooBigReason(limits.ClientMessage))
			case errors.Is(err, errProtocol):
				toClient.closeFrame(1002, "invalid frame")
			}
			shut(failed("client", err, limits.ClientMessage))
			break
		}
		// The buffer serves the next message, unless a large one grew it.
		buf = msg
		if cap(buf) > 1<<20 {
			buf = nil
		}
		if now := time.Now(); now.Sub(lastTouch) > time.Second {
			s.live.touch(claims)
			lastTouch = now
		}
		// Downloads stay where the gateway stores them from, whatever
		// download behaviour the client sets.
		fwd, reply, err := browser.RewriteCommand(msg, session.DownloadDir)
		if err != nil {
			shut("the client sent a message the gateway cannot read")
			log.Info("cdp message refused", "err", err)
			break
		}
		if reply != nil {
			if err := toClient.writeFrame(opText, reply); err != nil {
				shut("client write failed")
				break
			}
			continue
		}
		if err := toBrowser.writeFrame(op, fwd); err != nil {
			shut("browser closed the connection")
			break
		}
	}
	<-done
	s.live.left(claims, reason == "browser closed the connection")
	log.Info("cdp connection closed", "duration", time.Since(start).Round(time.Millisecond))
	s.live.record(claims, "preview_closed", map[string]any{"preview": claims.ID, "scope": claims.Scope, "duration_ms": time.Since(start).Milliseconds(), "reason": reason})
}
