package gateway

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	fws "github.com/fasthttp/websocket"
	"github.com/gofiber/contrib/websocket"
	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/desktop"
	"github.com/sandgate/sandgate/session"
)

// vncKeepalive is how often an idle VNC WebSocket is pinged, so that
// proxies keep viewers that only watch.
const vncKeepalive = 25 * time.Second

// vncUpgrade refuses plain HTTP before the upgrade.
func (s *Server) vncUpgrade(c *fiber.Ctx) error {
	if !websocket.IsWebSocketUpgrade(c) {
		return errInvalid("this endpoint needs a WebSocket upgrade")
	}
	return c.Next()
}

// vncProxy carries RFB over a binary WebSocket (what noVNC speaks) to the
// session's VNC server. Everything the viewer sends passes through a
// desktop.Filter: malformed streams are cut, and a view-only preview's
// input never reaches the session.
func (s *Server) vncProxy() fiber.Handler {
	return websocket.New(func(client *websocket.Conn) {
		claims := client.Locals(localClaims).(*previewClaims)
		ep := client.Locals(localEndpoint).(session.Endpoint)
		log := s.log.With("session", claims.Session, "tenant", claims.Tenant, "preview", claims.ID, "view_only", claims.ViewOnly)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var d net.Dialer
		up, err := d.DialContext(ctx, "tcp", ep.VNC.String())
		cancel()
		if err != nil {
			log.Warn("vnc upstream unreachable", "err", err)
			closeWS(client, fws.CloseTryAgainLater, "the session's display is not reachable")
			drainWS(client)
			return
		}
		s.pumpVNC(client, up, claims, client.Locals(localInfo).(session.Info), log)
	}, websocket.Config{
		Subprotocols:    []string{"binary"},
		ReadBufferSize:  64 << 10,
		WriteBufferSize: 64 << 10,
	})
}

func (s *Server) pumpVNC(client *websocket.Conn, up net.Conn, claims *previewClaims, info session.Info, log interface {
	Info(string, ...any)
	Warn(string, ...any)
}) {
	var once sync.Once
	var wmu sync.Mutex // one writer at a time on the client socket
	var closing atomic.Bool
	// end closes the connection: with the closing handshake, or (abort)
	// at once, for a viewer that broke the protocol.
	end := func(code int, why string, abort bool) {
		once.Do(func() {
			closing.Store(true)
			up.Close() // first: nothing the viewer still sends reaches the session
			unblockWrites(client)
			wmu.Lock()
			endWS(client, code, why, abort)
			wmu.Unlock()
			log.Info("vnc connection closing", "reason", why)
		})
	}
	shut := func(code int, why string) { end(code, why, false) }
	release, err := s.live.track(claims, closerFunc(func() error {
		shut(fws.ClosePolicyViolation, "preview revoked or session ended")
		return nil
	}))
	if err != nil {
		shut(fws.ClosePolicyViolation, "preview revoked or session ended")
		drainWS(client)
		return
	}
	defer release()
	expiry := time.AfterFunc(time.Until(claims.ExpiresAt.Time), func() {
		shut(fws.ClosePolicyViolation, "preview expired")
	})
	defer expiry.Stop()
	log.Info("vnc connection opened")
	s.live.record(claims, "preview_connected", map[string]any{"preview": claims.ID, "scope": claims.Scope, "view_only": claims.ViewOnly})
	opened := time.Now()
	defer func() {
		s.live.record(claims, "preview_closed", map[string]any{"preview": claims.ID, "scope": claims.Scope, "duration_ms": time.Since(opened).Milliseconds()})
	}()

	done := make(chan struct{})
	// The filter checks both ways; the server may announce at most the
	// session's configured screen.
	filter := &desktop.Filter{ViewOnly: claims.ViewOnly, MaxWidth: info.Screen.Width, MaxHeight: info.Screen.Height}
	go func() { // session -> viewer
		defer close(done)
		buf := make([]byte, 256<<10)
		for {
			n, err := up.Read(buf)
			if n > 0 {
				if err := filter.FromServer(buf[:n]); err != nil {
					log.Warn("the session's vnc server sent a bad RFB stream", "err", err)
					shut(fws.ClosePolicyViolation, rfbReason(err))
					return
				}
				wmu.Lock()
				client.SetWriteDeadline(time.Now().Add(wsWriteTimeout))
				werr := client.WriteMessage(fws.BinaryMessage, buf[:n])
				wmu.Unlock()
				if werr != nil {
					shut(fws.CloseGoingAway, "viewer write failed")
					return
				}
			}
			if err != nil {
				shut(fws.CloseGoingAway, "the session's display closed the connection")
				return
			}
		}
	}()
	go func() { // keepalive and activity while connected
		t := time.NewTicker(vncKeepalive)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				s.live.touch(claims)
				wmu.Lock()
				err := client.WriteControl(fws.PingMessage, nil, time.Now().Add(5*time.Second))
				wmu.Unlock()
				if err != nil {
					shut(fws.CloseGoingAway, "viewer gone")
					return
				}
			}
		}
	}()

	// The viewer's messages, until an error or the end of the closing
	// handshake (closeWS); after a close the rest is dropped (drainWS).
	var lastTouch time.Time
	for {
		mt, data, err := readMessage(client, maxVNCMessage)
		if errors.Is(err, errMessageTooBig) {
			log.Warn("vnc viewer sent a message over the limit", "limit", maxVNCMessage)
			s.live.record(claims, "message_too_big", map[string]any{"preview": claims.ID, "scope": claims.Scope, "limit": maxVNCMessage})
			end(fws.CloseMessageTooBig, tooBigReason(maxVNCMessage), true)
			client.SetReadDeadline(time.Unix(1, 0)) // also when closing already: not a byte more
			break
		}
		if err != nil {
			shut(fws.CloseNormalClosure, "viewer closed the connection")
			break
		}
		if closing.Load() {
			continue // closed from elsewhere: dropped until the viewer answers
		}
		if mt != fws.BinaryMessage {
			end(fws.CloseUnsupportedData, "RFB must be sent as binary WebSocket messages", true)
			break
		}
		out, err := filter.Feed(data)
		if err != nil {
			log.Warn("vnc viewer sent a bad RFB stream", "err", err)
			end(fws.ClosePolicyViolation, rfbReason(err), true)
			break
		}
		if now := time.Now(); !claims.ViewOnly && now.Sub(lastTouch) > time.Second {
			s.live.touch(claims)
			lastTouch = now
		}
		if len(out) > 0 {
			if _, err := up.Write(out); err != nil {
				shut(fws.CloseGoingAway, "the session's display closed the connection")
				break
			}
		}
	}
	drainWS(client)
	<-done
}

// rfbReason is the close reason shown to the viewer; WebSocket close
// reasons are limited to 123 bytes.
func rfbReason(err error) string {
	msg := err.Error()
	if !errors.Is(err, desktop.ErrProtocol) {
		msg = "bad RFB stream"
	}
	if len(msg) > 120 {
		msg = msg[:120]
	}
	return msg
}
