package gateway

import (
	"errors"
	"log/slog"
	"strconv"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
)

// apiError is an error with a contract code and a message safe to show.
type apiError struct {
	status int
	code   string
	msg    string
	err    error // internal, logged, never sent
}

func (e *apiError) Error() string {
	if e.err != nil {
		return e.code + ": " + e.msg + ": " + e.err.Error()
	}
	return e.code + ": " + e.msg
}

func (e *apiError) Unwrap() error { return e.err }

func errInvalid(msg string) error { return &apiError{status: 400, code: "invalid_argument", msg: msg} }
func errUnauthenticated(msg string) error {
	return &apiError{status: 401, code: "unauthenticated", msg: msg}
}
func errDenied(msg string) error   { return &apiError{status: 403, code: "permission_denied", msg: msg} }
func errNotFound(msg string) error { return &apiError{status: 404, code: "not_found", msg: msg} }

// classes maps the session and recordings error classes to the contract.
var classes = []struct {
	class  error
	status int
	code   string
}{
	{session.ErrInvalid, 400, "invalid_argument"},
	{session.ErrNotFound, 404, "not_found"},
	{session.ErrConflict, 409, "conflict"},
	{session.ErrUnavailableRuntime, 422, "unavailable_runtime"},
	{session.ErrQuota, 429, "quota_exceeded"},
	{session.ErrUnavailable, 503, "unavailable"},
	{session.ErrDenied, 403, "permission_denied"},
	{recordings.ErrNotFound, 404, "not_found"},
}

// errorHandler is the one place errors become HTTP responses.
func errorHandler(log *slog.Logger) fiber.ErrorHandler {
	return func(c *fiber.Ctx, err error) error {
		var ae *apiError
		var pe *session.PublicError
		if !errors.As(err, &ae) && errors.As(err, &pe) && pe.RetryAfter > 0 {
			c.Set(fiber.HeaderRetryAfter, strconv.Itoa(pe.RetryAfter))
		}
		status, code, msg := publicOf(err)
		if status >= 500 {
			log.Error("request failed", "method", c.Method(), "route", c.Route().Path, "status", status, "err", err)
		}
		return c.Status(status).JSON(fiber.Map{"error": fiber.Map{"code": code, "message": msg}})
	}
}

// publicOf is what a client is told of err: the status, the contract's
// code and a message safe to show.
func publicOf(err error) (status int, code, msg string) {
	status, code, msg = 500, "internal", "internal error"
	var ae *apiError
	var pe *session.PublicError
	var fe *fiber.Error
	switch {
	case errors.As(err, &ae):
		status, code, msg = ae.status, ae.code, ae.msg
	case errors.As(err, &pe):
		msg = pe.Msg
		for _, k := range classes {
			if errors.Is(pe.Class, k.class) {
				status, code = k.status, k.code
				break
			}
		}
	case errors.As(err, &fe):
		status, msg = fe.Code, fe.Message
		switch {
		case fe.Code == fiber.StatusRequestEntityTooLarge:
			code = "invalid_argument"
		case fe.Code == fiber.StatusNotFound:
			code, msg = "not_found", "no such route"
		case fe.Code == fiber.StatusMethodNotAllowed:
			code, msg = "invalid_argument", "method not allowed"
		case fe.Code == fiber.StatusBadRequest:
			// The server's parser's: its message quotes the request,
			// an API key with it.
			code, msg = "invalid_argument", "the request is not valid HTTP"
		case fe.Code < 500:
			code = "invalid_argument"
		default:
			status, code, msg = 503, "unavailable", "the gateway cannot serve this now"
		}
	default:
		for _, k := range classes {
			if errors.Is(err, k.class) {
				status, code, msg = k.status, k.code, k.code
				break
			}
		}
	}
	return status, code, msg
}
