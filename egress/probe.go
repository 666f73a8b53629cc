package egress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"
)

// Probe says whether a Sandgate egress proxy answers at addr, as a
// session's connection would reach it: it connects from an address
// that is no session's, and the proxy refuses it at once (refused403),
// having accepted it and asked whose it is. A port that accepts and
// says nothing (a process that hangs, a node whose kernel still
// answers) does not pass.
func Probe(ctx context.Context, addr netip.AddrPort) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return err
	}
	defer c.Close()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(5 * time.Second)
	}
	c.SetReadDeadline(deadline)
	want := []byte(refused403)
	got := make([]byte, len(want))
	n, err := io.ReadFull(c, got)
	if bytes.Equal(got[:n], want) {
		return nil
	}
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return err
	}
	return fmt.Errorf("%s answered %q, not as a Sandgate egress proxy refusing a source that is no session", addr, got[:min(n, 64)])
}
