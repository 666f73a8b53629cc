package sandgate

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// ExecRequest runs a command in a session.
type ExecRequest struct {
	Cmd            []string          `json:"cmd"`
	Env            map[string]string `json:"env,omitempty"`
	Cwd            string            `json:"cwd,omitempty"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty"`
	Stdin          []byte            `json:"stdin_base64,omitempty"` // sent as base64
	User           string            `json:"user,omitempty"`         // sandgate (default) or root
}

// ExecFrame is one record of a command's output stream: a chunk of
// stdout or stderr, or the last record with the exit code.
type ExecFrame struct {
	Stream     string `json:"stream,omitempty"` // stdout or stderr
	Data       []byte `json:"data,omitempty"`
	ExitCode   *int   `json:"exit_code,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	Error      string `json:"error,omitempty"`
}

// maxExecRecord bounds one record of the exec stream.
const maxExecRecord = 4 << 20

// ExecStream is a running command's output as it comes.
type ExecStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
	done bool
}

// Exec starts a command and returns its output stream; read it with
// Next until io.EOF, and Close it.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest) (*ExecStream, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(ctx, "POST", "/v1/sessions/"+url.PathEscape(id)+"/exec", strings.NewReader(string(b)), "application/json")
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxExecRecord)
	return &ExecStream{body: resp.Body, sc: sc}, nil
}

// Next returns the next record; after the one with the exit code it
// returns io.EOF.
func (s *ExecStream) Next() (ExecFrame, error) {
	var f ExecFrame
	if s.done {
		return f, io.EOF
	}
	if !s.sc.Scan() {
		if err := s.sc.Err(); err != nil {
			return f, err
		}
		return f, errors.New("the gateway ended the stream without an exit code")
	}
	if err := json.Unmarshal(s.sc.Bytes(), &f); err != nil {
		return f, fmt.Errorf("bad exec record: %w", err)
	}
	if f.ExitCode != nil {
		s.done = true
	}
	return f, nil
}

// Close ends the stream (and, if it still runs, the command's output to
// this client).
func (s *ExecStream) Close() error { return s.body.Close() }

// ExecResult is a finished command.
type ExecResult struct {
	Stdout, Stderr []byte
	ExitCode       int
	TimedOut       bool
	Duration       time.Duration
	// Truncated is set when output past MaxOutput was dropped.
	Truncated bool
}

// MaxOutput bounds what Run keeps of each of stdout and stderr.
const MaxOutput = 16 << 20

// Run runs a command to its end and returns its output (each stream up
// to MaxOutput) and exit code.
func (c *Client) Run(ctx context.Context, id string, req ExecRequest) (*ExecResult, error) {
	return c.RunUpTo(ctx, id, req, MaxOutput)
}

// RunUpTo is Run keeping at most limit bytes of each stream (the rest is
// read and dropped, and Truncated set).
func (c *Client) RunUpTo(ctx context.Context, id string, req ExecRequest, limit int) (*ExecResult, error) {
	st, err := c.Exec(ctx, id, req)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	var res ExecResult
	for {
		f, err := st.Next()
		if err == io.EOF {
			return &res, nil
		}
		if err != nil {
			return nil, err
		}
		dst := &res.Stdout
		if f.Stream == "stderr" {
			dst = &res.Stderr
		}
		if n := limit - len(*dst); n < len(f.Data) {
			f.Data, res.Truncated = f.Data[:n], true
		}
		*dst = append(*dst, f.Data...)
		if f.ExitCode != nil {
			res.ExitCode, res.TimedOut = *f.ExitCode, f.TimedOut
			res.Duration = time.Duration(f.DurationMS) * time.Millisecond
			if f.Error != "" && res.ExitCode == 0 {
				return &res, errors.New(f.Error)
			}
		}
	}
}

// Shell is an interactive bash on a terminal in a session. Read and
// Write carry the terminal's bytes; Read returns io.EOF when the shell
// exits, and ExitCode then tells how.
type Shell struct {
	ws      *websocket.Conn
	wmu     sync.Mutex
	pending []byte
	exit    *int
}

// maxShellMessage bounds one message from the shell.
const maxShellMessage = 1 << 20

// Shell opens an interactive shell of cols x rows.
func (c *Client) Shell(ctx context.Context, id string, cols, rows int) (*Shell, error) {
	u, err := url.Parse(c.base)
	if err != nil {
		return nil, err
	}
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	u.Path = "/v1/sessions/" + url.PathEscape(id) + "/shell"
	u.RawQuery = fmt.Sprintf("cols=%d&rows=%d", cols, rows)
	h := http.Header{"Authorization": {"Bearer " + c.key}}
	if c.host != "" {
		h.Set("Host", c.host)
	}
	ws, resp, err := websocket.DefaultDialer.DialContext(ctx, u.String(), h)
	if err != nil {
		if resp != nil {
			defer resp.Body.Close()
			var e struct {
				Error *Error `json:"error"`
			}
			raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
			if json.Unmarshal(raw, &e) == nil && e.Error != nil {
				e.Error.Status = resp.StatusCode
				return nil, e.Error
			}
			return nil, fmt.Errorf("shell: %s", resp.Status)
		}
		return nil, err
	}
	ws.SetReadLimit(maxShellMessage)
	sh := &Shell{ws: ws}
	// The size in the query does not reach the terminal under gVisor (it
	// stays 0x0); a resize message does.
	if err := sh.Resize(cols, rows); err != nil {
		ws.Close()
		return nil, err
	}
	return sh, nil
}

// Write sends keystrokes.
func (s *Shell) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Read reads the terminal's output.
func (s *Shell) Read(p []byte) (int, error) {
	for len(s.pending) == 0 {
		if s.exit != nil {
			return 0, io.EOF
		}
		mt, data, err := s.ws.ReadMessage()
		if err != nil {
			if websocket.IsCloseError(err, websocket.CloseNormalClosure) {
				return 0, io.EOF
			}
			return 0, err
		}
		if mt == websocket.BinaryMessage {
			s.pending = data
			continue
		}
		var ctl struct {
			Type     string `json:"type"`
			ExitCode int    `json:"exit_code"`
		}
		if json.Unmarshal(data, &ctl) == nil && ctl.Type == "exit" {
			s.exit = &ctl.ExitCode
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

// Resize tells the terminal its new size.
func (s *Shell) Resize(cols, rows int) error {
	msg, _ := json.Marshal(map[string]any{"type": "resize", "cols": cols, "rows": rows})
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.ws.WriteMessage(websocket.TextMessage, msg)
}

// ExitCode is the shell's exit status once Read returned io.EOF.
func (s *Shell) ExitCode() (int, bool) {
	if s.exit == nil {
		return 0, false
	}
	return *s.exit, true
}

// Close ends the shell.
func (s *Shell) Close() error { return s.ws.Close() }
