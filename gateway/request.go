package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
)

// maxSeconds bounds every *_seconds field before it becomes a Duration.
const maxSeconds = 10 * 365 * 24 * 3600

// decode reads a JSON body strictly: unknown fields and trailing data are
// errors, and the message says what was wrong without echoing input.
func decode(c *fiber.Ctx, v any) error {
	body := c.Body()
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return errInvalid(fmt.Sprintf("malformed JSON at byte %d", se.Offset))
		case errors.As(err, &te):
			return errInvalid(fmt.Sprintf("field %q must be of type %s", te.Field, te.Type))
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return errInvalid("unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field "))
		default:
			return errInvalid("malformed JSON body")
		}
	}
	if _, err := dec.Token(); err != io.EOF {
		return errInvalid("unexpected data after the JSON body")
	}
	return nil
}

func seconds(name string, v *int64) (time.Duration, error) {
	if v == nil {
		return 0, nil
	}
	if *v <= 0 || *v > maxSeconds {
		return 0, errInvalid(name + " must be a positive number of seconds")
	}
	return time.Duration(*v) * time.Second, nil
}

// clientAddr is the address a request came from: its connection's, or,
// when that is a trusted proxy, the nearest address in X-Forwarded-For
// that is not one. Each proxy appends the address it was reached from,
// so the entries left of the last trusted one are the client's own to
// write; an entry that is not an address ends the walk at the proxy
// that passed it.
func (s *Server) clientAddr(c *fiber.Ctx) string {
	remote, _ := netip.AddrFromSlice(c.Context().RemoteIP())
	var forwarded []string
	for _, v := range c.Request().Header.PeekAll(fiber.HeaderXForwardedFor) {
		forwarded = append(forwarded, string(v))
	}
	return clientAddr(remote, forwarded, s.trusted)
}

func clientAddr(remote netip.Addr, forwarded []string, trusted []netip.Prefix) string {
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	a := remote.Unmap()
	for i := len(forwarded) - 1; i >= 0 && isTrusted(a); i-- {
		parts := strings.Split(forwarded[i], ",")
		for j := len(parts) - 1; j >= 0 && isTrusted(a); j-- {
			f, err := netip.ParseAddr(strings.TrimSpace(parts[j]))
			if err != nil {
				return a.String()
			}
			a = f.Unmap()
		}
	}
	return a.String()
}
