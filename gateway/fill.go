package gateway

import (
	"context"
	"errors"
	"net/url"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/vault"
)

type fillRequest struct {
	Action     string `json:"action"`
	Credential string `json:"credential"`
	Selector   string `json:"selector"`
	// Field is what to type: "secret" (default) or "username".
	Field string `json:"field"`
}

// fillCredential types a credential's username, or its placeholder or
// secret, into a page field through the gateway's own CDP connection. The
// credential must be bound to the session, and the page open in the
// session must be one of the binding's destinations (scheme, host, port,
// cleaned path prefix) when the gateway fills it. For the secret it types
// the session's placeholder, which the egress proxy swaps for the secret
// in requests to the bound destinations, unless the binding opts in to
// the real value (fill "value"). The audit trail gets the credential id,
// the selector, the field and the mode; the value goes nowhere else.
func (s *Server) fillCredential(c *fiber.Ctx, tenant, id string) error {
	req, err := fillAsked(c)
	if err != nil {
		return err
	}
	if err := s.needVault(); err != nil {
		return err
	}
	info, err := s.sessions.Get(tenant, id)
	if err != nil {
		return err
	}
	if info.Kind != session.KindBrowser {
		return errNeedsBrowser()
	}
	ep, err := s.sessions.Endpoint(tenant, id)
	if err != nil {
		return err
	}
	err = s.fill(c, req, fillTarget{vault: s.vault, tenant: tenant, info: info, ep: ep,
		record: func(typ string, fields map[string]any) { s.sessions.Record(id, typ, fields) }})
	if err == nil {
		s.sessions.Touch(id)
	}
	return err
}

// fillAsked is a fill_credential's request, checked.
func fillAsked(c *fiber.Ctx) (fillRequest, error) {
	var req fillRequest
	if err := decode(c, &req); err != nil {
		return req, err
	}
	if !egress.ValidCredentialID(req.Credential) {
		return req, errInvalid("credential must be a credential id")
	}
	if req.Selector == "" || len(req.Selector) > maxFillSelector {
		return req, errInvalid("selector must be a CSS selector of 1-1024 bytes")
	}
	if req.Field == "" {
		req.Field = "secret"
	}
	if req.Field != "secret" && req.Field != "username" {
		return req, errInvalid("field must be secret or username")
	}
	return req, nil
}

// maxFillSelector bounds a fill's CSS selector (bytes).
const maxFillSelector = 1024

// fillReasons are the reasons a fill is denied, or raced, for.
var fillReasons = map[string][]string{
	"fill_credential_denied": {denyNotBound, denyOrigin, denyDestination},
	"fill_credential_raced":  {raceUnchecked, raceOtherPage, raceLeft},
}

// Why a fill is denied.
const (
	denyNotBound    = "not_bound"
	denyOrigin      = "origin"
	denyDestination = "destination"
)

// Why a fill raced a navigation.
const (
	raceUnchecked = "the page could not be checked again after filling"
	raceOtherPage = "another page became the first while the gateway filled"
	raceLeft      = "the page left the bound destination while the gateway filled it"
)

func errNeedsBrowser() error {
	return &apiError{status: 409, code: "conflict", msg: "fill_credential needs a browser session"}
}

// fillTarget is what a fill needs of its session, whichever replica
// fills it: the vault, the session (its bindings) and where its browser
// serves, and where its events go.
type fillTarget struct {
	vault  *vault.Vault
	tenant string
	info   session.Info
	ep     session.Endpoint
	record func(typ string, fields map[string]any)
}

// fill carries out fillCredential's request in t's session.
func (s *Server) fill(c *fiber.Ctx, req fillRequest, t fillTarget) error {
	id, tenant := t.info.ID, t.tenant
	fields := map[string]any{"credential": req.Credential, "selector": req.Selector, "field": req.Field}
	deny := func(reason, msg string) error {
		fields["reason"] = reason
		t.record("fill_credential_denied", fields)
		s.log.Warn("fill_credential denied", "session", id, "tenant", tenant, "credential", req.Credential, "reason", reason)
		return errDenied(msg)
	}
	var bound []egress.Binding
	for _, b := range t.info.Egress.Credentials {
		if b.Credential == req.Credential {
			bound = append(bound, b)
		}
	}
	if len(bound) == 0 {
		return deny(denyNotBound, "the credential is not bound to this session; bind it when creating the session (\"credentials\")")
	}
	ctx, cancel := reqCtx(c, 30*time.Second)
	defer cancel()
	page, err := firstPage(ctx, t.ep)
	if err != nil {
		return &apiError{status: 409, code: "conflict", msg: "the session's browser has no page open", err: err}
	}
	fields["page"] = pageForAudit(page.URL)
	mode, ok := fillMode(bound, page.URL)
	if !ok {
		return deny(denyOrigin, "the page open in the session is not on a destination the credential is bound to (scheme, host, port and path prefix)")
	}
	cred, err := t.vault.Open(ctx, tenant, req.Credential)
	if err != nil {
		return vaultError(err)
	}
	// Only bindings its owner allows (the create refuses the others; a
	// session bound before credentials had destinations may hold some).
	allowed := bound[:0:0]
	for _, b := range bound {
		if bindingAllowed(cred.Meta, b) == "" {
			allowed = append(allowed, b)
		}
	}
	if mode, ok = fillMode(allowed, page.URL); !ok {
		return deny(denyDestination, "the page open in the session is not within the credential's own destinations")
	}
	var text string
	switch {
	case req.Field == "username":
		if cred.Username == "" {
			return errInvalid("the credential has no username")
		}
		text, mode = cred.Username, egress.FillValue
	case mode == egress.FillValue:
		text = cred.Secret
	default:
		text = t.vault.Placeholder(id, req.Credential)
	}
	fields["mode"] = mode
	start := time.Now()
	fctx, cancel2 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel2()
	if err := browser.Fill(fctx, t.ep.CDP, req.Selector, text); err != nil {
		t.record("fill_credential_failed", fields)
		s.log.Warn("fill_credential failed", "session", id, "tenant", tenant, "credential", req.Credential, "err", err)
		return &apiError{status: 409, code: "conflict", msg: "no visible field matched the selector on the session's page in time", err: err}
	}
	// The page may have changed while the gateway typed (browser.Fill
	// looks the first page up again): say so loudly. A placeholder is
	// worthless elsewhere; a value is not.
	after, err := firstPage(ctx, t.ep)
	raced := ""
	switch {
	case err != nil:
		raced = raceUnchecked
	case after.ID != page.ID:
		raced = raceOtherPage
	default:
		if _, ok := fillMode(allowed, after.URL); !ok {
			raced = raceLeft
			fields["page_after"] = pageForAudit(after.URL)
		}
	}
	if raced != "" {
		fields["reason"] = raced
		t.record("fill_credential_raced", fields)
		s.log.Warn("fill_credential raced a navigation", "session", id, "tenant", tenant, "credential", req.Credential, "mode", mode)
		return &apiError{status: 409, code: "conflict", msg: "the page changed while it was being filled; the fill is not confirmed"}
	}
	t.record("fill_credential", fields)
	return c.JSON(actionResponse{Action: "fill_credential", TookMS: time.Since(start).Milliseconds()})
}

// firstPage is the page target browser.Fill types into: the first page
// of the session's target list, read from the gateway's own connection to
// the session's browser.
func firstPage(ctx context.Context, ep session.Endpoint) (browser.Target, error) {
	ts, err := browser.Targets(ctx, ep.CDP)
	if err != nil {
		return browser.Target{}, err
	}
	for _, t := range ts {
		if t.Type == "page" {
			return t, nil
		}
	}
	return browser.Target{}, errors.New("no page target")
}

// fillMode says whether pageURL is a destination of one of the bindings
// and what to type for the secret there: the placeholder unless every
// binding that covers the page opts in to the value.
func fillMode(bound []egress.Binding, pageURL string) (string, bool) {
	u, err := url.Parse(pageURL)
	if err != nil {
		return "", false
	}
	mode, ok := "", false
	for _, b := range bound {
		if !b.MatchesURL(u) {
			continue
		}
		ok = true
		if b.Fill == egress.FillValue && mode == "" {
			mode = egress.FillValue
		} else if b.Fill != egress.FillValue {
			mode = egress.FillPlaceholder
		}
	}
	return mode, ok
}

// pageForAudit is the page's scheme, host and path, without query,
// fragment or user info (they may carry tokens), bounded.
func pageForAudit(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	out := (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, Opaque: u.Opaque}).String()
	if len(out) > 512 {
		out = out[:512]
	}
	return out
}
