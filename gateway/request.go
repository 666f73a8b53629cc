package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
