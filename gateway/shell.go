package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"sync"
	"syscall"
	"time"

	fws "github.com/fasthttp/websocket"
	"github.com/gofiber/contrib/websocket"
	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/session"
)

// shellUpgrade checks the session before the WebSocket upgrade.
func (s *Server) shellUpgrade(c *fiber.Ctx) error {
	if !websocket.IsWebSocketUpgrade(c) {
		return errInvalid("the shell needs a WebSocket upgrade")
	}
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	claims, err := s.shells.openShell(c, id)
	if err != nil {
		if ae, ok := err.(*apiError); ok && ae.status == fiber.StatusServiceUnavailable {
			c.Set(fiber.HeaderRetryAfter, "2")
		}
		return err
	}
	c.Locals(localClaims, claims)
	return c.Next()
}

// shellControl is a text message from the client.
type shellControl struct {
	Type string `json:"type"` // "resize"
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// shell runs an interactive bash on a PTY. Binary messages carry the
// terminal's bytes both ways; text messages are JSON control: resize from
// the client, {"type":"exit","exit_code":N} from the server at the end.
func (s *Server) shell() fiber.Handler {
	return websocket.New(func(ws *websocket.Conn) {
		claims := ws.Locals(localClaims).(*previewClaims)
		tenant, id := claims.Tenant, claims.Session
		cols, _ := strconv.Atoi(ws.Query("cols", "80"))
		rows, _ := strconv.Atoi(ws.Query("rows", "24"))
		log := s.log.With("session", id, "tenant", tenant)

		var wmu sync.Mutex
		send := func(mt int, data []byte) error {
			wmu.Lock()
			defer wmu.Unlock()
			ws.SetWriteDeadline(time.Now().Add(wsWriteTimeout))
			return ws.WriteMessage(mt, data)
		}
		stdinR, stdinW := io.Pipe()
		out := writerFunc(func(p []byte) (int, error) {
			return len(p), send(fws.BinaryMessage, p)
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		proc, err := s.shells.startShell(ctx, claims, session.ExecSpec{
			Args: []string{"bash", "-l"}, Terminal: true, Stdin: stdinR, Stdout: out,
			Cols: uint16(clamp(cols, 1, 1000)), Rows: uint16(clamp(rows, 1, 1000)),
		})
		if err != nil {
			log.Warn("shell start", "err", err)
			closeWS(ws, fws.CloseInternalServerErr, "the shell could not start")
			drainWS(ws)
			return
		}
		defer proc.Close()
		sizer := newTermSizer(proc)
		sizeCtx, endSizer := context.WithCancel(ctx)
		defer endSizer()
		go sizer.run(sizeCtx)
		// The size given at start is not applied by every runtime
		// (under gVisor the terminal starts at 0x0): set it again now.
		if err := sizer.resize(ctx, uint16(clamp(cols, 1, 1000)), uint16(clamp(rows, 1, 1000))); err != nil {
			log.Warn("shell resize at start", "err", err)
		}
		var once sync.Once
		// end closes the connection: with the closing handshake, or
		// (abort) at once, for a client that broke the protocol.
		end := func(code int, why string, abort bool) {
			once.Do(func() {
				stdinW.Close()
				proc.Signal(syscall.SIGKILL)
				unblockWrites(ws)
				wmu.Lock()
				endWS(ws, code, why, abort)
				wmu.Unlock()
			})
		}
		shut := func(code int, why string) { end(code, why, false) }
		release, err := s.live.track(claims, closerFunc(func() error {
			shut(fws.CloseGoingAway, "the session ended")
			return nil
		}))
		if err != nil {
			shut(fws.CloseGoingAway, "the session ended")
			drainWS(ws)
			return
		}
		defer release()
		start := time.Now()
		s.live.record(claims, "shell_opened", nil)
		log.Info("shell opened")

		// The reader runs until the client's close frame or an error: after
		// the shell exits it drops what still arrives, until the client
		// answers the close (closeWS).
		readerDone := make(chan struct{})
		go func() {
			defer close(readerDone)
			for {
				mt, data, err := readMessage(ws, maxShellMessage)
				if errors.Is(err, errMessageTooBig) {
					log.Warn("shell client sent a message over the limit", "limit", maxShellMessage)
					s.live.record(claims, "message_too_big", map[string]any{"scope": scopeShell, "limit": maxShellMessage})
					end(fws.CloseMessageTooBig, tooBigReason(maxShellMessage), true)
					return
				}
				if err != nil {
					stdinW.Close()
					return
				}
				s.live.touch(claims)
				if mt == fws.BinaryMessage {
					stdinW.Write(data) // fails once the shell is gone; the reader goes on draining
					continue
				}
				var ctl shellControl
				if json.Unmarshal(data, &ctl) == nil && ctl.Type == "resize" && ctl.Cols > 0 && ctl.Rows > 0 {
					sizer.resize(ctx, min(ctl.Cols, 1000), min(ctl.Rows, 1000))
				}
			}
		}()
		code, _ := proc.Wait(ctx)
		endSizer() // no resize of a process that is gone
		msg, _ := json.Marshal(map[string]any{"type": "exit", "exit_code": code})
		send(fws.TextMessage, msg)
		shut(fws.CloseNormalClosure, "the shell exited")
		s.live.record(claims, "shell_closed", map[string]any{"exit_code": code, "duration_ms": time.Since(start).Milliseconds()})
		log.Info("shell closed", "exit_code", code)
		select { // the client's answer to the close, within closeLinger
		case <-readerDone:
		case <-time.After(closeLinger + time.Second):
			// The reader is held elsewhere (a resize, at most seconds):
			// its connection goes now, and the reader with it, before
			// the connection is handed back for another client.
			ws.NetConn().Close()
			<-readerDone
		}
	})
}

// resizeAgain is when, after the last resize, the terminal's size is set
// again. A program in the session can put an older size back: readline
// reads the size and writes it again as it readies each prompt
// (set_winsize in rltty.c), and a resize that lands between the two is
// lost. Resizes sent as each prompt appeared: under runc none of 60 was
// lost, under gVisor one to three of 60 (and one in a CI run). Setting a
// size that holds changes nothing (Linux's pty sends no SIGWINCH); a size
// put back is restored. A size the session sets itself (stty cols) within
// 3 s of the client's resize is overridden: the client's window is the
// terminal's size.
var resizeAgain = []time.Duration{20 * time.Millisecond, 250 * time.Millisecond, time.Second, 3 * time.Second}

// termSizer sets a shell's terminal size: at once, in the order of the
// client's messages, then again at resizeAgain's times with the newest.
type termSizer struct {
	proc  resizer
	newer chan [2]uint16 // the newest size, for run; holds one
}

type resizer interface {
	Resize(ctx context.Context, cols, rows uint16) error
}

func newTermSizer(p resizer) *termSizer {
	return &termSizer{proc: p, newer: make(chan [2]uint16, 1)}
}

// resize sets the size now, within 5 s, and has run set it again later.
// One goroutine at a time calls it.
func (z *termSizer) resize(ctx context.Context, cols, rows uint16) error {
	err := z.set(ctx, [2]uint16{cols, rows})
	select { // a size run has not taken yet is older
	case <-z.newer:
	default:
	}
	z.newer <- [2]uint16{cols, rows}
	return err
}

func (z *termSizer) set(ctx context.Context, size [2]uint16) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return z.proc.Resize(ctx, size[0], size[1])
}

// run sets the newest size again on resizeAgain's schedule, until ctx
// ends. Its failures are dropped: the size set at once reported its own.
func (z *termSizer) run(ctx context.Context) {
	var size [2]uint16
	var step int
	timer := time.NewTimer(resizeAgain[0])
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case size = <-z.newer:
			step = 0
			timer.Reset(resizeAgain[0])
		case <-timer.C:
			z.set(ctx, size)
			if step++; step < len(resizeAgain) {
				timer.Reset(resizeAgain[step] - resizeAgain[step-1])
			}
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func clamp(v, lo, hi int) int { return max(lo, min(v, hi)) }
