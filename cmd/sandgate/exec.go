package main

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gorilla/websocket"
	"github.com/sandgate/sandgate/ids"
	"golang.org/x/term"
)

// cmdExec runs a command in a session like `docker exec`: output streams
// to stdout and stderr, stdin (when not a terminal) is sent along, and the
// command's exit status becomes ours.
func cmdExec(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	timeout := fs.Int("t", 0, "timeout in seconds (default: the gateway's)")
	cwd := fs.String("w", "", "working directory")
	user := fs.String("u", "", "user: sandgate (default) or root")
	env := kvFlags{}
	fs.Var(env, "e", "K=V environment variable, repeatable")
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	rest := fs.Args()
	if len(rest) < 2 {
		return usageError("usage: sandgate exec [flags] SESSION -- CMD [ARGS]")
	}
	id, cmd := rest[0], rest[1:]
	if cmd[0] == "--" {
		cmd = cmd[1:]
	}
	c, err := newAPIClient()
	if err != nil {
		return err
	}
	req := map[string]any{"cmd": cmd, "env": env, "cwd": *cwd, "user": *user}
	if *timeout > 0 {
		req["timeout_seconds"] = *timeout
	}
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		in, err := io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
		if err != nil {
			return err
		}
		if len(in) > 0 {
			req["stdin_base64"] = base64.StdEncoding.EncodeToString(in)
		}
	}
	resp, err := c.stream(ctx, "POST", "/v1/sessions/"+id+"/exec", req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var r struct {
			Stream   string `json:"stream"`
			Data     []byte `json:"data"`
			ExitCode *int   `json:"exit_code"`
			TimedOut bool   `json:"timed_out"`
			Error    string `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("bad record from the gateway: %w", err)
		}
		switch {
		case r.Stream == "stdout":
			os.Stdout.Write(r.Data)
		case r.Stream == "stderr":
			os.Stderr.Write(r.Data)
		case r.ExitCode != nil:
			if r.TimedOut {
				fmt.Fprintln(os.Stderr, "sandgate: the command timed out and was killed")
			}
			if r.Error != "" {
				fmt.Fprintln(os.Stderr, "sandgate:", r.Error)
			}
			if *r.ExitCode != 0 {
				return exitError(*r.ExitCode)
			}
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("the gateway ended the stream without an exit code")
}

// stream sends a request and returns the open response on success.
func (c *apiClient) stream(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		r = strings.NewReader(string(b))
	}
	return c.raw(ctx, method, path, r, "application/json")
}

func (c *apiClient) raw(ctx context.Context, method, path string, body io.Reader, ctype string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	if body != nil {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		var e struct {
			Error apiErr `json:"error"`
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(raw, &e) != nil || e.Error.Code == "" {
			return nil, fmt.Errorf("%s %s: %s", method, path, resp.Status)
		}
		e.Error.Status = resp.StatusCode
		return nil, &e.Error
	}
	return resp, nil
}

// cmdShell opens an interactive shell in a session, like `docker exec -it`.
func cmdShell(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return usageError("usage: sandgate shell SESSION")
	}
	c, err := newAPIClient()
	if err != nil {
		return err
	}
	fd := int(os.Stdin.Fd())
	cols, rows := 80, 24
	if term.IsTerminal(fd) {
		if w, h, err := term.GetSize(fd); err == nil {
			cols, rows = w, h
		}
	}
	u, err := url.Parse(c.base)
	if err != nil {
		return err
	}
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	u.Path = "/v1/sessions/" + args[0] + "/shell"
	u.RawQuery = fmt.Sprintf("cols=%d&rows=%d", cols, rows)
	ws, resp, err := websocket.DefaultDialer.DialContext(ctx, u.String(), http.Header{"Authorization": {"Bearer " + c.key}})
	if err != nil {
		if resp != nil {
			return fmt.Errorf("shell: %s", resp.Status)
		}
		return err
	}
	defer ws.Close()
	if term.IsTerminal(fd) {
		old, err := term.MakeRaw(fd)
		if err == nil {
			defer term.Restore(fd, old)
		}
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if w, h, err := term.GetSize(fd); err == nil {
					msg, _ := json.Marshal(map[string]any{"type": "resize", "cols": w, "rows": h})
					ws.WriteMessage(websocket.TextMessage, msg)
				}
			}
		}()
	}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := os.Stdin.Read(buf)
			if n > 0 {
				if ws.WriteMessage(websocket.BinaryMessage, buf[:n]) != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		mt, data, err := ws.ReadMessage()
		if err != nil {
			return nil
		}
		if mt == websocket.BinaryMessage {
			os.Stdout.Write(data)
			continue
		}
		var ctl struct {
			Type     string `json:"type"`
			ExitCode int    `json:"exit_code"`
		}
		if json.Unmarshal(data, &ctl) == nil && ctl.Type == "exit" && ctl.ExitCode != 0 {
			return exitError(ctl.ExitCode)
		}
	}
}

// cmdCp copies between the host and a session, like `docker cp`:
// SESSION:/path names the session's side; a directory travels as tar.
func cmdCp(ctx context.Context, args []string) error {
	if len(args) != 2 {
		return usageError("usage: sandgate cp SRC DST   (one of them SESSION:/path)")
	}
	c, err := newAPIClient()
	if err != nil {
		return err
	}
	remote := func(s string) (string, string, bool) {
		id, p, ok := strings.Cut(s, ":")
		return id, p, ok && ids.IsSession(id)
	}
	if id, p, ok := remote(args[0]); ok { // session -> host
		resp, err := c.raw(ctx, "GET", "/v1/sessions/"+id+"/files?path="+url.QueryEscape(p), nil, "")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.Header.Get("Content-Type") == "application/x-tar" {
			return untar(resp.Body, args[1])
		}
		dst := args[1]
		if st, err := os.Stat(dst); err == nil && st.IsDir() {
			dst = filepath.Join(dst, filepath.Base(p))
		}
		return saveTo(dst, resp.Body)
	}
	id, p, ok := remote(args[1])
	if !ok {
		return usageError("one side of cp must be SESSION:/path")
	}
	st, err := os.Stat(args[0])
	if err != nil {
		return err
	}
	if st.IsDir() {
		return errors.New("cp: copying a directory into a session is not supported yet; tar it and copy the file")
	}
	f, err := os.Open(args[0])
	if err != nil {
		return err
	}
	defer f.Close()
	if strings.HasSuffix(p, "/") {
		p += filepath.Base(args[0])
	}
	resp, err := c.raw(ctx, "PUT", "/v1/sessions/"+id+"/files?path="+url.QueryEscape(p), f, "application/octet-stream")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// untar unpacks a tar stream into dir, refusing entries that leave it.
func untar(r io.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if name == "." {
			continue
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if d := filepath.Dir(name); d != "." {
				root.MkdirAll(d, 0o755)
			}
			f, err := root.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode&0o777))
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			f.Close()
		}
	}
}
