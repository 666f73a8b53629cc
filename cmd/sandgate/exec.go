package main

import (
	"archive/tar"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/term"

	"github.com/sandgate/sandgate/ids"
	sandgate "github.com/sandgate/sandgate/sdk/go"
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
	req := sandgate.ExecRequest{Cmd: cmd, Env: env, Cwd: *cwd, User: *user, TimeoutSeconds: *timeout}
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		in, err := io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
		if err != nil {
			return err
		}
		req.Stdin = in
	}
	st, err := c.Exec(ctx, id, req)
	if err != nil {
		return err
	}
	defer st.Close()
	for {
		f, err := st.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case f.Stream == "stdout":
			os.Stdout.Write(f.Data)
		case f.Stream == "stderr":
			os.Stderr.Write(f.Data)
		case f.ExitCode != nil:
			if f.TimedOut {
				fmt.Fprintln(os.Stderr, "sandgate: the command timed out and was killed")
			}
			if f.Error != "" {
				fmt.Fprintln(os.Stderr, "sandgate:", f.Error)
			}
			if *f.ExitCode != 0 {
				return exitError(*f.ExitCode)
			}
		}
	}
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
	sh, err := c.Shell(ctx, args[0], cols, rows)
	if err != nil {
		return err
	}
	defer sh.Close()
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
					sh.Resize(w, h)
				}
			}
		}()
	}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := os.Stdin.Read(buf)
			if n > 0 {
				if _, werr := sh.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	if _, err := io.Copy(os.Stdout, sh); err != nil {
		return nil
	}
	if code, ok := sh.ExitCode(); ok && code != 0 {
		return exitError(code)
	}
	return nil
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
		body, ctype, err := c.GetFile(ctx, id, p)
		if err != nil {
			return err
		}
		defer body.Close()
		if ctype == "application/x-tar" {
			return untar(body, args[1])
		}
		dst := args[1]
		if st, err := os.Stat(dst); err == nil && st.IsDir() {
			dst = filepath.Join(dst, filepath.Base(p))
		}
		return saveTo(dst, body)
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
	_, err = c.PutFile(ctx, id, p, f)
	return err
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
