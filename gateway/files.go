package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/session"
)

const defaultMaxFileBytes = session.DefaultMaxFileBytes

// maxPathBytes bounds a files request's path.
const maxPathBytes = 4096

// filePath checks the path query parameter: absolute, clean, no NUL.
// fileTarget reads the session id and the ?path= of a files request.
func (s *Server) fileTarget(c *fiber.Ctx) (id, p string, err error) {
	if id, err = s.sessionID(c); err != nil {
		return "", "", err
	}
	p = c.Query("path")
	switch {
	case p == "":
		return "", "", errInvalid("path is required, e.g. ?path=/home/sandgate/workspace/file.txt")
	case !noNUL(p):
		return "", "", errInvalid("path must not contain NUL bytes")
	case !strings.HasPrefix(p, "/"):
		return "", "", errInvalid("path must be absolute")
	case len(p) > maxPathBytes:
		return "", "", errInvalid("path is too long")
	}
	return id, path.Clean(p), nil
}

// Shell snippets run with the path as $1, never spliced into the script.
const (
	scriptKind = `if [ -d "$1" ]; then echo dir; elif [ -f "$1" ]; then echo file; elif [ -e "$1" ]; then echo other; else echo missing; fi`
	// scriptPut writes stdin to the path $1. A file it replaces is kept
	// whole until the new one is: stdin goes to the temporary name $2
	// beside it, renamed over $1 (with $1's mode), so an upload cut short
	// leaves the old file as it was. $3 is the declared size: a body of
	// another size is removed (exit 22). Without one (a chunked body)
	// only the gateway knows whether the body was whole: the file waits
	// at $2 (exit 24) for scriptPutDone or removal. A symbolic link (so
	// that it stays one, and its target keeps its inode) and a file in a
	// directory that takes no new file are written through, in place: the
	// body waits at $4, in the session's /tmp and readable by its owner
	// only, for scriptPutCopy (exit 27) once the gateway knows it whole.
	// Such a file the session may not write is refused before the body
	// is read (exit 29), as is one when /tmp takes no copy (exit 28). A
	// new path is written in place (exit 0), and the gateway removes what
	// a refused upload left there; a new path the session could not write
	// whole (its disk full) is removed (exit 25), and one in a directory
	// it may not write to is refused (exit 26).
	// Builtins where they serve, and one stat for the new file's size and
	// mode and the old one's: under gVisor each process costs tens of
	// milliseconds.
	scriptPut = `d=${1%/*}; [ -n "$d" ] || d=/
[ -d "$d" ] || { echo "no such directory" >&2; exit 20; }; [ ! -d "$1" ] || { echo "is a directory" >&2; exit 21; }
if [ ! -e "$1" ] && [ ! -L "$1" ]; then [ -w "$d" ] || exit 26; cat >"$1" || { rm -f -- "$1"; exit 25; }; exit 0; fi
if [ -L "$1" ] || ! true 2>/dev/null >"$2"; then
  [ -w "$1" ] || [ ! -e "$1" ] || exit 29
  umask 077; true 2>/dev/null >"$4" || exit 28
  cat >"$4" || { rm -f -- "$4"; exit 1; }
  [ -z "$3" ] || [ "$(stat -c %s -- "$4")" = "$3" ] || { rm -f -- "$4"; exit 22; }
  exit 27
fi
cat >"$2" || { rm -f -- "$2"; exit 1; }
[ -n "$3" ] || exit 24
set -- "$1" "$2" "$3" $(stat -c '%s %a' -- "$2" "$1" 2>/dev/null)
[ "$4" = "$3" ] || { rm -f -- "$2"; exit 22; }
[ "$5" = "$7" ] || chmod "$7" -- "$2" 2>/dev/null
mv -fT -- "$2" "$1" || { rm -f -- "$2"; exit 1; }`
	// scriptPutDone puts a whole chunked upload ($1) in its place ($2).
	scriptPutDone = `chmod --reference="$2" -- "$1" 2>/dev/null; mv -fT -- "$1" "$2" || { rm -f -- "$1"; exit 1; }`
	// scriptPutCopy copies a whole upload ($1) over $2, in place: a file
	// it cannot open is left as it was (exit 29); one whose copy fails
	// part way (a full disk) is cut short (exit 23).
	scriptPutCopy = `{ exec 3>"$2"; } 2>/dev/null || { rm -f -- "$1"; exit 29; }
cat -- "$1" >&3; r=$?; rm -f -- "$1"; [ $r = 0 ] || exit 23`
)

// copyRate is the slowest a session is expected to copy a file in place
// (bytes a second), for the copy's time bound.
const copyRate = 4 << 20

// Exit codes of scriptPut.
const (
	putNoDir      = 20
	putIsDir      = 21
	putShort      = 22
	putCopyFailed = 23
	putWaiting    = 24
	putNoSpace    = 25
	putNoWrite    = 26
	putCopyWaits  = 27
	putNoStaging  = 28
	putDenied     = 29
	uploadPrefix  = ".sandgate-upload-"
)

func (s *Server) fileKind(ctx context.Context, claims *previewClaims, p string) (string, error) {
	var out bytes.Buffer
	if _, err := s.runSpec(ctx, claims, session.ExecSpec{Args: []string{"sh", "-c", scriptKind, "sandgate", p}, Stdout: &limitWriter{w: &out, n: 64}}); err != nil {
		return "", err
	}
	return strings.TrimSpace(out.String()), nil
}

// runIn runs argv in the session to its end, its output dropped, and
// gives its exit code.
func (s *Server) runIn(ctx context.Context, claims *previewClaims, argv []string) (int, error) {
	return s.runSpec(ctx, claims, session.ExecSpec{Args: argv})
}

// runSpec runs a command in the session to its end and gives its exit
// code.
func (s *Server) runSpec(ctx context.Context, claims *previewClaims, spec session.ExecSpec) (int, error) {
	proc, err := s.shells.startShell(ctx, claims, spec)
	if err != nil {
		return 0, err
	}
	defer proc.Close()
	return proc.Wait(ctx)
}

// uploadFields and downloadFields are the fields of a file's events in
// the trail: the same whichever replica carried it.
func uploadFields(p string, n int64, sha256 string) map[string]any {
	return map[string]any{"path": p, "bytes": n, "sha256": sha256}
}

func downloadFields(p, kind string, n int64) map[string]any {
	return map[string]any{"path": p, "kind": kind, "bytes": n}
}

// putFile writes the request body to a path in the session, streaming it
// through the command's standard input.
func (s *Server) putFile(c *fiber.Ctx) error {
	id, p, err := s.fileTarget(c)
	if err != nil {
		return err
	}
	claims, err := s.shells.openShell(c, id)
	if err != nil {
		return err
	}
	max := claims.maxFileBytes
	if max <= 0 {
		max = defaultMaxFileBytes
	}
	declared := int64(c.Request().Header.ContentLength()) // -1: chunked
	if declared > max {
		return tooLarge(c, fmt.Sprintf("the file is larger than the tenant's limit of %d bytes", max))
	}
	body := s.uploadBody(c, declared)
	defer body.detach()
	sha := sha256.New()
	counted := &countingReader{r: io.LimitReader(body, max+1), h: sha}
	// Past the body's own deadline (uploadBody), so that a body that
	// times out is refused as one cut short (400, nothing kept), not
	// ended with the command.
	ctx, cancel := reqCtx(c, s.cfg.UploadTimeout+30*time.Second)
	defer cancel()
	tmp := path.Join(path.Dir(p), uploadPrefix+randomHex(8))
	staged := "/tmp/" + uploadPrefix + randomHex(8) // for a file written in place
	size := ""
	if declared >= 0 {
		size = strconv.FormatInt(declared, 10)
	}
	// Run apart from the request's context: what is left of a refused
	// upload goes even once the request has ended.
	run := func(args ...string) (int, error) {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer ccancel()
		return s.runIn(cctx, claims, args)
	}
	spec := session.ExecSpec{Args: []string{"sh", "-c", scriptPut, "sandgate", p, tmp, size, staged}, Stdin: counted}
	switch {
	case declared > 0:
		spec.StdinSize = declared // read to its last byte, not to its end (kube.Run)
	case declared == 0:
		spec.Stdin = nil // no stream at all
	}
	proc, err := s.shells.startShell(ctx, claims, spec)
	if err != nil {
		return err
	}
	defer proc.Close()
	code, err := proc.Wait(ctx)
	if err != nil {
		run("rm", "-f", "--", tmp, staged)
		return &apiError{status: 503, code: "unavailable", msg: "the upload did not finish", err: err}
	}
	// Where the bytes are while the gateway decides: a temporary name,
	// or the path: a new one, written in place (exit 0 of cat). A file
	// renamed or copied into place also exits 0, but only with its
	// declared size, which the checks below never refuse.
	written := ""
	switch code {
	case 0:
		written = p
	case putWaiting:
		written = tmp
	case putCopyWaits:
		written = staged
	case putDenied:
		return errDenied("the session may not write to path")
	case putNoStaging:
		return &apiError{status: 413, code: "invalid_argument", msg: "path is written in place (a symbolic link, or a directory that takes no new file), and the session's /tmp could not take the upload first; nothing was written"}
	case putNoDir:
		return errNotFound("the directory of path does not exist in the session")
	case putIsDir:
		return &apiError{status: 409, code: "conflict", msg: "path is a directory"}
	case putShort:
	case putNoSpace:
		return &apiError{status: 413, code: "invalid_argument", msg: "the session could not write the whole file (is its disk full?); nothing was kept"}
	case putNoWrite:
		return errDenied("the session may not write to the path's directory")
	default:
		return errDenied("the session refused to write path (permissions?)")
	}
	if counted.n > max {
		if written != "" {
			run("rm", "-f", "--", written)
		}
		return &apiError{status: 413, code: "invalid_argument", msg: fmt.Sprintf("the file is larger than the tenant's limit of %d bytes", max)}
	}
	// The copy into the session ends a body that failed or was cut short
	// as it ends a whole one: what arrived of it must not become the file.
	// A declared size is checked in the session too (exit 22), where the
	// temporary file is removed and the file it was to replace stays.
	if short := declared >= 0 && counted.n < declared; short || code == putShort || (declared < 0 && counted.err != nil) {
		if written != "" {
			run("rm", "-f", "--", written)
		}
		c.Set(fiber.HeaderConnection, "close")
		msg := fmt.Sprintf("the upload ended after %d bytes", counted.n)
		if declared >= 0 {
			msg = fmt.Sprintf("the upload ended after %d of its %d bytes", counted.n, declared)
		}
		return &apiError{status: 400, code: "invalid_argument", msg: msg + "; it was not kept", err: counted.err}
	}
	switch written {
	case tmp:
		code, err := run("sh", "-c", scriptPutDone, "sandgate", tmp, p)
		if err != nil || code != 0 {
			run("rm", "-f", "--", tmp)
			return errDenied("the session refused to write path (permissions?)")
		}
	case staged:
		// The copy gets its own time, by the file's size: one cut by a
		// deadline would leave the file it writes over cut short.
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second+time.Duration(counted.n/copyRate)*time.Second)
		code, err := s.runIn(cctx, claims, []string{"sh", "-c", scriptPutCopy, "sandgate", staged, p})
		ccancel()
		switch {
		case err != nil:
			run("rm", "-f", "--", staged)
			return &apiError{status: 503, code: "unavailable", msg: "the copy over the file at path did not finish; that file may be cut short", err: err}
		case code == putDenied:
			return errDenied("the session may not write to path")
		case code == putCopyFailed:
			return &apiError{status: 413, code: "invalid_argument", msg: "the session could not write the whole file over the one at path (is its disk full?); that file is cut short"}
		case code != 0:
			run("rm", "-f", "--", staged)
			return errDenied("the session refused to write path (permissions?)")
		}
	}
	sum := hex.EncodeToString(sha.Sum(nil))
	s.live.record(claims, "file_upload", uploadFields(p, counted.n, sum))
	s.live.changed(claims)
	s.log.Info("file written", "session", id, "bytes", counted.n)
	return c.Status(fiber.StatusCreated).JSON(fiber.Map{"path": p, "size": counted.n, "sha256": sum})
}

// uploadBody is the body of an authenticated upload as a stream, never
// read into memory. The server's read timeout covers the headers and
// every other route; an upload gets UploadTimeout from now, so a large
// file on a slow link is not cut at ReadTimeout. The handler must call
// its detach before it returns. declared is the body's declared length
// (-1: chunked).
func (s *Server) uploadBody(c *fiber.Ctx, declared int64) *requestBody {
	conn := c.Context().Conn()
	if conn != nil {
		conn.SetReadDeadline(time.Now().Add(s.cfg.UploadTimeout))
	}
	if st := c.Context().RequestBodyStream(); st != nil {
		return &requestBody{r: st, conn: conn, c: c, chunked: declared == -1, declared: declared}
	}
	// Not streamed (an empty body): already read.
	return &requestBody{r: bytes.NewReader(c.Body()), c: c}
}

// requestBody is a request's body stream read by something that may
// outlive the handler: containerd's copy into an exec's stdin is not
// waited for, and goes on reading after a command that exited early.
// Once the handler has returned, fasthttp releases the stream and its
// reader (to be reused by other connections): a read then would panic
// or read another request. detach ends that: a read under way is cut
// (the connection's read deadline) and waited for, later ones get
// errBodyDetached, and a connection whose body was not read to its end
// is closed after the answer (what is left of the body is not taken
// for the next request).
type requestBody struct {
	mu   sync.Mutex // held while r is read
	r    io.Reader
	conn net.Conn
	c    *fiber.Ctx
	end  atomic.Bool // r returned io.EOF
	gone bool        // detached
	// chunked: the body's length is not declared; its end is its last
	// chunk.
	chunked bool
	// declared is the body's declared length (-1: chunked); read, what
	// was read of it. Its last byte is its end: a command that reads no
	// further (head, under Kubernetes) leaves the connection usable.
	declared, read int64
}

var errBodyDetached = errors.New("the request was answered")

func (b *requestBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gone {
		return 0, errBodyDetached
	}
	if b.end.Load() {
		return 0, io.EOF // past the body: the stream would read on
	}
	n, err := b.r.Read(p)
	if err == io.EOF && b.chunked && clientEnded(b.conn) {
		// A chunked body ends with its last chunk, after which the
		// client may stay or go: one whose client went first was cut
		// short at a chunk's end.
		return n, io.ErrUnexpectedEOF
	}
	b.read += int64(n)
	if err == io.EOF || b.declared > 0 && b.read >= b.declared {
		b.end.Store(true)
	}
	return n, err
}

func (b *requestBody) detach() {
	// A body read to its end is not read again: the connection serves
	// the next request as it is.
	end := b.end.Load()
	if b.conn != nil && !end {
		b.conn.SetReadDeadline(time.Now())
	}
	b.mu.Lock()
	b.gone = true
	b.mu.Unlock()
	if !end && b.conn != nil { // (a body not streamed was read whole)
		b.c.Set(fiber.HeaderConnection, "close")
		b.c.Context().SetConnectionClose()
	}
}

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

type countingReader struct {
	r   interface{ Read([]byte) (int, error) }
	h   interface{ Write([]byte) (int, error) }
	n   int64
	err error // how the body failed, if it did (not io.EOF)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.h.Write(p[:n])
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}

// getFile streams a file, or a directory as a tar archive, out of the
// session.
func (s *Server) getFile(c *fiber.Ctx) error {
	id, p, err := s.fileTarget(c)
	if err != nil {
		return err
	}
	claims, err := s.shells.openShell(c, id)
	if err != nil {
		return err
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	kind, err := s.fileKind(ctx, claims, p)
	cancel()
	if err != nil {
		return err
	}
	var args []string
	switch kind {
	case "file":
		args = []string{"cat", "--", p}
		c.Set(fiber.HeaderContentType, "application/octet-stream")
		c.Set(fiber.HeaderContentDisposition, fmt.Sprintf("attachment; filename=%q", path.Base(p)))
	case "dir":
		args = []string{"tar", "-C", p, "-cf", "-", "."}
		c.Set(fiber.HeaderContentType, "application/x-tar")
		c.Set(fiber.HeaderContentDisposition, fmt.Sprintf("attachment; filename=%q", path.Base(p)+".tar"))
	case "missing":
		return errNotFound("no such file or directory in the session")
	default:
		return errInvalid("path is neither a regular file nor a directory")
	}
	pr, pw := io.Pipe()
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Minute)
	// tar's complaints (a file per line) are not kept: a session could
	// make millions.
	proc, err := s.shells.startShell(sctx, claims, session.ExecSpec{Args: args, Stdout: pw})
	if err != nil {
		scancel()
		return err
	}
	counter := &countingReader{r: pr, h: io.Discard}
	go func() {
		code, err := proc.Wait(sctx)
		proc.Close()
		if err == nil && code != 0 {
			err = fmt.Errorf("%s exited %d", args[0], code)
		}
		pw.CloseWithError(err)
	}()
	s.live.touch(claims)
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
		defer scancel()
		if _, err := io.Copy(w, counter); err != nil {
			proc.Signal(syscall.SIGKILL)
			pr.CloseWithError(err)
		}
		w.Flush()
		s.live.record(claims, "file_download", downloadFields(p, kind, counter.n))
		s.log.Info("file read", "session", id, "kind", kind, "bytes", counter.n)
	})
	return nil
}
