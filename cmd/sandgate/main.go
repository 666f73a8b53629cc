// Command sandgate is the Sandgate binary: the gateway (`sandgate serve`),
// the session image builder and the API client subcommands.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage: sandgate COMMAND [ARGS]

  serve -config FILE          run the gateway
  image build|ref             build the session image into containerd, or print its ref
  hash-key [KEY]              print the SHA-256 of an API key (a new key when none is given)
  session create|list|get|extend|delete|preview|screenshot|artifacts|events|snapshot|snapshots
                              talk to a gateway: SANDGATE_URL and SANDGATE_API_KEY
  profile create|list|get|rollback|delete
                              browser profiles kept between sessions
  exec [-t SECONDS] [-e K=V] [-w DIR] [-u root] SESSION -- CMD [ARGS]
                              run a command; stdin is forwarded, the exit status passed through
  shell SESSION               an interactive shell
  cp SRC DST                  copy files: one side is SESSION:/path; directories as tar
  mcp                         an MCP server over stdio (tools: sessions, computer, exec, files, snapshots, preview)
  admin tenants|keys ...      tenants and API keys at runtime: SANDGATE_URL and SANDGATE_ADMIN_KEY
  seccomp-profile RUNTIME     the session seccomp profile (JSON) of gvisor, runc or kata, for a
                              cluster's nodes (deploy/kubernetes/README.md)
`

type usageError string

func (e usageError) Error() string { return string(e) }

// exitError passes a remote command's exit status through.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = cmdServe(ctx, log, os.Args[2:])
	case "image":
		err = cmdImage(ctx, log, os.Args[2:])
	case "hash-key":
		err = cmdHashKey(os.Args[2:])
	case "seccomp-profile":
		err = cmdSeccompProfile(os.Args[2:])
	case "session", "sessions":
		err = cmdSession(ctx, os.Args[2:])
	case "exec":
		err = cmdExec(ctx, os.Args[2:])
	case "shell":
		err = cmdShell(ctx, os.Args[2:])
	case "cp":
		err = cmdCp(ctx, os.Args[2:])
	case "mcp":
		err = cmdMCP(ctx, os.Args[2:])
	case "admin":
		err = cmdAdmin(ctx, os.Args[2:])
	case "profile", "profiles":
		err = cmdProfile(ctx, os.Args[2:])
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		err = usageError(usage)
	}
	var ue usageError
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		os.Exit(int(ee))
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "sandgate:", err)
		os.Exit(1)
	}
}
