package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/session"
)

const (
	defaultExecTimeout = 300
	maxExecTimeout     = 3600
	maxArgs            = 4096
)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

type execRequest struct {
	Cmd         []string          `json:"cmd"`
	Env         map[string]string `json:"env"`
	Cwd         string            `json:"cwd"`
	Timeout     *int64            `json:"timeout_seconds"`
	Stdin       string            `json:"stdin"`
	StdinBase64 string            `json:"stdin_base64"`
	User        string            `json:"user"`
}

// execRecord is one line of the NDJSON stream: output (base64, so any
// bytes pass), then one final record with the exit.
type execRecord struct {
	Stream     string `json:"stream,omitempty"`
	Data       []byte `json:"data,omitempty"`
	ExitCode   *int   `json:"exit_code,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	Error      string `json:"error,omitempty"`
}

func noNUL(ss ...string) bool {
	for _, s := range ss {
		if strings.IndexByte(s, 0) >= 0 {
			return false
		}
	}
	return true
}

// checkExec validates a request and returns the spec's parts; root
// asks for root, which the tenant may not allow.
func checkExec(req *execRequest) (env []string, stdin []byte, timeout time.Duration, root bool, err error) {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return nil, nil, 0, false, errInvalid("cmd must be a non-empty array, the program first")
	}
	if len(req.Cmd) > maxArgs || !noNUL(req.Cmd...) {
		return nil, nil, 0, false, errInvalid("cmd arguments must not contain NUL bytes")
	}
	for k, v := range req.Env {
		if !envName.MatchString(k) {
			return nil, nil, 0, false, errInvalid(fmt.Sprintf("env name %q is not a valid variable name", k))
		}
		if !noNUL(v) {
			return nil, nil, 0, false, errInvalid("env values must not contain NUL bytes")
		}
		env = append(env, k+"="+v)
	}
	if req.Cwd != "" && (!strings.HasPrefix(req.Cwd, "/") || !noNUL(req.Cwd)) {
		return nil, nil, 0, false, errInvalid("cwd must be an absolute path")
	}
	secs := int64(defaultExecTimeout)
	if req.Timeout != nil {
		secs = *req.Timeout
	}
	if secs < 1 || secs > maxExecTimeout {
		return nil, nil, 0, false, errInvalid(fmt.Sprintf("timeout_seconds must be between 1 and %d", maxExecTimeout))
	}
	stdin = []byte(req.Stdin)
	if req.StdinBase64 != "" {
		if req.Stdin != "" {
			return nil, nil, 0, false, errInvalid("give stdin or stdin_base64, not both")
		}
		if stdin, err = base64.StdEncoding.DecodeString(req.StdinBase64); err != nil {
			return nil, nil, 0, false, errInvalid("stdin_base64 is not valid base64")
		}
	}
	switch req.User {
	case "", "sandgate":
	case "root":
		root = true
	default:
		return nil, nil, 0, false, errInvalid(`user must be "sandgate" or "root"`)
	}
	return env, stdin, time.Duration(secs) * time.Second, root, nil
}

// exec runs a command and streams its output as NDJSON while it runs.
func (s *Server) exec(c *fiber.Ctx) error {
	id, err := s.sessionID(c)
	if err != nil {
		return err
	}
	var req execRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	env, stdin, timeout, root, err := checkExec(&req)
	if err != nil {
		return err
	}
	claims, err := s.shells.openShell(c, id)
	if err != nil {
		return err
	}
	if root && !claims.allowRoot {
		return errDenied("this tenant may not run commands as root")
	}
	records := make(chan execRecord, 256)
	out := &recordWriter{stream: "stdout", c: records}
	errw := &recordWriter{stream: "stderr", c: records}
	frames := &frameReader{streams: map[byte]*recordWriter{1: out, 2: errw}}
	// sandgate-exec (in the image) runs the command in its own process
	// group, kills the group at the timeout, and sends both streams down
	// one pipe in order; the gateway's own deadline is the backstop.
	args := append([]string{"/usr/local/bin/sandgate-exec", strconv.FormatInt(int64(timeout/time.Second), 10)}, req.Cmd...)
	ctx, cancel := context.WithTimeout(context.Background(), timeout+10*time.Second)
	spec := session.ExecSpec{Args: args, Env: env, Cwd: req.Cwd, Root: root, Stdout: frames, Stderr: errw}
	if len(stdin) > 0 {
		// (None at all otherwise: under Kubernetes, no stdin stream
		// whose end the command would wait for; see kube.Run.)
		spec.Stdin, spec.StdinSize = bytes.NewReader(stdin), int64(len(stdin))
	}
	proc, err := s.shells.startShell(ctx, claims, spec)
	if err != nil {
		cancel()
		return err
	}
	user := "sandgate"
	if root {
		user = "root"
	}
	start := time.Now()
	envNames := make([]string, 0, len(req.Env))
	for k := range req.Env {
		envNames = append(envNames, k)
	}
	s.live.touch(claims)

	go func() {
		defer cancel()
		defer proc.Close()
		code, werr := proc.Wait(ctx)
		took := time.Since(start)
		timedOut := frames.timedOut || ctx.Err() != nil
		if frames.ended {
			code = frames.code
		}
		final := execRecord{ExitCode: &code, DurationMS: took.Milliseconds(), TimedOut: timedOut}
		if werr != nil && !timedOut {
			final.Error = "the command's end could not be read"
		}
		out.close()
		errw.close()
		records <- final
		close(records)
		s.live.record(claims, "exec", execFields(req.Cmd, user, req.Cwd, envNames, code, took.Milliseconds(), timedOut, out.total(), errw.total()))
		s.log.Info("command ran", "session", id, "exit_code", code, "duration_ms", took.Milliseconds(), "timed_out", timedOut)
	}()

	c.Set(fiber.HeaderContentType, "application/x-ndjson")
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
		enc := json.NewEncoder(w)
		gone := false
		for r := range records {
			if gone {
				continue // drain; the process is being killed
			}
			if err := enc.Encode(r); err != nil || w.Flush() != nil {
				gone = true
				proc.Signal(syscall.SIGTERM)
				cancel()
			}
		}
	})
	return nil
}

// execFields are the fields of a command's exec event in the trail:
// the same whichever replica ran it.
func execFields(argv []string, user, cwd string, envNames []string, code int, durationMS int64, timedOut bool, stdout, stderr int64) map[string]any {
	return map[string]any{
		"argv": argv, "user": user, "cwd": cwd, "env_names": envNames,
		"exit_code": code, "duration_ms": durationMS, "timed_out": timedOut,
		"stdout_bytes": stdout, "stderr_bytes": stderr,
	}
}

// maxExecFrame bounds one sandgate-exec frame; sandgate-exec writes at
// most 64 KiB at a time. A larger length is refused before its bytes are
// held.
const maxExecFrame = 1 << 20

// frameReader decodes sandgate-exec's frames: stream id, big-endian
// length, bytes; stream 3 ends with "exit N" or "timeout N". The frames
// come from inside the session: it holds at most one frame.
type frameReader struct {
	streams  map[byte]*recordWriter
	buf      []byte
	ended    bool
	timedOut bool
	code     int
}

func (f *frameReader) Write(p []byte) (int, error) {
	f.buf = append(f.buf, p...)
	for len(f.buf) >= 5 {
		n := int(binary.BigEndian.Uint32(f.buf[1:5]))
		if n > maxExecFrame {
			return 0, fmt.Errorf("exec frame of %d bytes", n)
		}
		if len(f.buf) < 5+n {
			break
		}
		id, data := f.buf[0], f.buf[5:5+n]
		if w, ok := f.streams[id]; ok {
			w.Write(data)
		} else if id == 3 {
			word, num, _ := strings.Cut(string(data), " ")
			f.code, _ = strconv.Atoi(num)
			f.timedOut, f.ended = word == "timeout", true
		}
		f.buf = f.buf[5+n:]
	}
	if len(f.buf) == 0 {
		f.buf = nil
	}
	return len(p), nil
}

// recordWriter turns a process's output into stream records.
type recordWriter struct {
	stream string
	c      chan<- execRecord
	mu     sync.Mutex
	n      int64
	closed bool
}

func (w *recordWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return len(p), nil
	}
	w.n += int64(len(p))
	w.c <- execRecord{Stream: w.stream, Data: append([]byte(nil), p...)}
	return len(p), nil
}

func (w *recordWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

func (w *recordWriter) total() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}
