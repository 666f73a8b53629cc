package test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/gorilla/websocket"
)

// contract drives the gateway over HTTP and checks every request and
// response against the OpenAPI document the gateway serves, noting which
// documented operations were driven.
type contract struct {
	e       *testEnv
	doc     *openapi3.T
	router  routers.Router
	covered map[string]bool // "METHOD /template"
}

// call is one request of the contract test.
type call struct {
	method, path string // path with its query
	key          string // API key (Authorization: Bearer)
	header       http.Header
	body         []byte
	contentType  string
	status       int // the status the test expects
	// invalid: the request is meant to break the document (a missing key,
	// bad JSON); its validation must fail, its answer must still match.
	invalid bool
}

func init() {
	// The body types the document uses beyond kin-openapi's own.
	openapi3filter.RegisterBodyDecoder("application/x-ndjson", ndjsonDecoder)
	for _, ct := range []string{"text/html", "text/javascript", "text/css"} {
		openapi3filter.RegisterBodyDecoder(ct, openapi3filter.PlainBodyDecoder)
	}
}

// ndjsonDecoder checks every line of an NDJSON body against the schema of
// one record (the document's schema of application/x-ndjson), and gives
// the last line to the caller's own check.
func ndjsonDecoder(body io.Reader, _ http.Header, schema *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(nil, 4<<20)
	var last any
	n := 0
	for sc.Scan() {
		var v any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			return nil, fmt.Errorf("line %d: %w", n+1, err)
		}
		if schema != nil && schema.Value != nil {
			if err := schema.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
				return nil, fmt.Errorf("line %d: %w", n+1, err)
			}
		}
		last, n = v, n+1
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("no records")
	}
	return last, nil
}

// authenticate stands for the gateway's own checks: the validator only
// asks that a bearer credential is there.
func authenticate(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	h := in.RequestValidationInput.Request.Header.Get("Authorization")
	if t, ok := strings.CutPrefix(h, "Bearer "); !ok || t == "" {
		return in.NewError(fmt.Errorf("no bearer credential"))
	}
	return nil
}

func newContract(t *testing.T, e *testEnv) *contract {
	t.Helper()
	st, raw := e.api(t, "", "GET", "/openapi.yaml", nil)
	if st != 200 {
		t.Fatalf("GET /openapi.yaml: %d", st)
	}
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	r, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &contract{e: e, doc: doc, router: r, covered: map[string]bool{}}
}

// route finds the documented operation of a request. A {path} that spans
// segments (/devtools/browser/<id>) is sent with its slash as is, which
// OpenAPI has no template for: the lookup escapes it, as the document's
// {path} parameter would be written.
func (c *contract) route(t *testing.T, req *http.Request) (*routers.Route, map[string]string) {
	t.Helper()
	look := req.Clone(req.Context())
	if before, rest, ok := strings.Cut(req.URL.Path, "/devtools/"); ok {
		u := *req.URL
		u.Path = before + "/devtools/" + rest
		u.RawPath = before + "/devtools/" + strings.ReplaceAll(rest, "/", "%2F")
		look.URL = &u
	}
	route, params, err := c.router.FindRoute(look)
	if err != nil {
		t.Fatalf("%s %s: not in the document: %v", req.Method, req.URL.Path, err)
	}
	for k, v := range params {
		if u, err := url.PathUnescape(v); err == nil {
			params[k] = u
		}
	}
	return route, params
}

// check validates a request and its answer against the document.
func (c *contract) check(t *testing.T, cl call, req *http.Request, status int, header http.Header, body []byte) {
	t.Helper()
	route, params := c.route(t, req)
	c.covered[route.Method+" "+route.Path] = true
	opts := &openapi3filter.Options{AuthenticationFunc: authenticate, IncludeResponseStatus: true}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	if cl.body != nil {
		req.Body = io.NopCloser(bytes.NewReader(cl.body))
	}
	err := openapi3filter.ValidateRequest(context.Background(), in)
	switch {
	case err != nil && !cl.invalid:
		t.Errorf("%s %s: the request does not match the document: %s", cl.method, cl.path, short(err))
	case err == nil && cl.invalid:
		t.Errorf("%s %s: the request was meant to break the document and did not", cl.method, cl.path)
	}
	if status != cl.status {
		t.Errorf("%s %s: %d, want %d: %s", cl.method, cl.path, status, cl.status, trim(body))
	}
	rin := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: status, Header: header, Options: opts}
	rin.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), rin); err != nil {
		t.Errorf("%s %s: the answer %d does not match the document: %s", cl.method, cl.path, status, short(err))
	}
}

// short keeps the first lines of a validation error; kin-openapi appends
// the whole schema and value.
func short(err error) string {
	lines := strings.SplitN(err.Error(), "\n", 4)
	return strings.Join(lines[:min(len(lines), 3)], "\n")
}

func trim(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}

func (cl call) request(t *testing.T, base string) *http.Request {
	t.Helper()
	var r io.Reader
	if cl.body != nil {
		r = bytes.NewReader(cl.body)
	}
	req, err := http.NewRequest(cl.method, base+cl.path, r)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range cl.header {
		req.Header[k] = vs
	}
	if cl.key != "" {
		req.Header.Set("Authorization", "Bearer "+cl.key)
	}
	if cl.contentType != "" {
		req.Header.Set("Content-Type", cl.contentType)
	} else if cl.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// do sends a call and checks it; it returns the answer's body.
func (c *contract) do(t *testing.T, cl call) []byte {
	t.Helper()
	req := cl.request(t, c.e.gwURL)
	client := &http.Client{Timeout: 3 * time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", cl.method, cl.path, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	c.check(t, cl, cl.request(t, c.e.gwURL), resp.StatusCode, resp.Header, body)
	return body
}

// json sends a call with a JSON body (nil: none) and decodes the answer
// into out (nil: not).
func (c *contract) json(t *testing.T, key, method, path string, in any, status int, out any) {
	t.Helper()
	cl := call{method: method, path: path, key: key, status: status}
	if in != nil {
		cl.body, _ = json.Marshal(in)
	}
	body := c.do(t, cl)
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, trim(body))
		}
	}
}

// ws opens a WebSocket (the upgrade is the documented answer, 101) or
// sees it refused, and checks the handshake against the document.
func (c *contract) ws(t *testing.T, cl call) {
	t.Helper()
	req := cl.request(t, c.e.gwURL)
	u := "ws://" + c.e.gwAddr + cl.path
	conn, resp, err := websocket.DefaultDialer.Dial(u, req.Header)
	if resp == nil {
		t.Fatalf("WebSocket %s: %v", cl.path, err)
	}
	if conn != nil {
		conn.Close()
	}
	body, _ := io.ReadAll(resp.Body)
	for _, h := range []string{"Upgrade", "Connection", "Sec-WebSocket-Version", "Sec-WebSocket-Key"} {
		req.Header.Set(h, "x")
	}
	c.check(t, cl, req, resp.StatusCode, resp.Header, body)
}

// TestOpenAPIContract drives every documented operation through the real
// gateway and holds requests and answers to the document it serves.
func TestOpenAPIContract(t *testing.T) {
	e := needE2E(t)
	c := newContract(t, e)
	keep := func(p previewInfo) previewInfo {
		e.mu.Lock()
		e.tokens = append(e.tokens, p.URL[strings.LastIndex(p.URL, "/")+1:])
		e.mu.Unlock()
		return p
	}
	token := func(p previewInfo) string { return p.URL[strings.LastIndex(p.URL, "/")+1:] }

	// Health, metrics, the document.
	for _, p := range []string{"/healthz", "/readyz", "/metrics", "/openapi.yaml", "/openapi.json"} {
		c.do(t, call{method: "GET", path: p, status: 200})
	}
	c.do(t, call{method: "GET", path: "/v1/runtimes", key: e.keyA, status: 200})

	// The MCP server: a request, a notification, and its refusals.
	mcpAccept := http.Header{"Accept": {"application/json, text/event-stream"}}
	initMsg := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"contract","version":"1"}}}`)
	if out := c.do(t, call{method: "POST", path: "/mcp", key: e.keyA, header: mcpAccept, body: initMsg, status: 200}); !bytes.Contains(out, []byte(`"serverInfo"`)) {
		t.Fatalf("MCP initialize: %s", trim(out))
	}
	c.do(t, call{method: "POST", path: "/mcp", key: e.keyA, header: mcpAccept, body: []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), status: 202})
	c.do(t, call{method: "POST", path: "/mcp", header: mcpAccept, body: initMsg, status: 401, invalid: true})
	c.do(t, call{method: "POST", path: "/mcp", key: e.keyA, header: http.Header{"Accept": {"application/json"}}, body: initMsg, status: 400})
	c.do(t, call{method: "POST", path: "/mcp", key: e.keyA, header: mcpAccept, body: initMsg, contentType: "text/plain", status: 415, invalid: true})
	c.do(t, call{method: "GET", path: "/mcp", key: e.keyA, header: mcpAccept, status: 405})
	c.do(t, call{method: "DELETE", path: "/mcp", key: e.keyA, status: 405})
	c.do(t, call{method: "GET", path: "/v1/pools", key: e.keyA, status: 200})
	c.do(t, call{method: "GET", path: "/v1/usage", key: e.keyA, status: 200})

	// The admin API.
	tn := "contract-" + randHex(4)
	c.json(t, e.adminKey, "GET", "/admin/v1/tenants", nil, 200, nil)
	c.do(t, call{method: "GET", path: "/admin/v1/tenants", key: e.keyA, status: 401})
	c.json(t, e.adminKey, "POST", "/admin/v1/tenants", map[string]any{"name": tn, "max_sessions": 2, "egress_allow": []string{"example.com:443"}}, 201, nil)
	c.json(t, e.adminKey, "POST", "/admin/v1/tenants", map[string]any{"name": tn}, 409, nil)
	c.do(t, call{method: "POST", path: "/admin/v1/tenants", key: e.adminKey, body: []byte(`{"name":"x","max_cpus":-1}`), status: 400, invalid: true})
	c.json(t, e.adminKey, "GET", "/admin/v1/tenants/"+tn, nil, 200, nil)
	c.json(t, e.adminKey, "GET", "/admin/v1/tenants/nobody", nil, 404, nil)
	c.json(t, e.adminKey, "PATCH", "/admin/v1/tenants/"+tn, map[string]any{"max_memory_mb": 8192}, 200, nil)
	c.json(t, e.adminKey, "PATCH", "/admin/v1/tenants/tenant-a", map[string]any{"max_sessions": 1}, 409, nil)
	var issued struct {
		ID     string `json:"id"`
		APIKey string `json:"api_key"`
	}
	c.json(t, e.adminKey, "POST", "/admin/v1/tenants/"+tn+"/keys", map[string]any{"name": "contract"}, 201, &issued)
	c.do(t, call{method: "GET", path: "/v1/usage", key: issued.APIKey, status: 200})
	c.json(t, e.adminKey, "GET", "/admin/v1/tenants/"+tn+"/keys", nil, 200, nil)
	c.do(t, call{method: "DELETE", path: "/admin/v1/tenants/" + tn + "/keys/" + issued.ID, key: e.adminKey, status: 204})
	c.do(t, call{method: "DELETE", path: "/admin/v1/tenants/" + tn + "/keys/" + issued.ID, key: e.adminKey, status: 404})
	c.json(t, e.adminKey, "PATCH", "/admin/v1/tenants/"+tn, map[string]any{"disabled": true}, 200, nil)

	// Errors of the contract.
	c.do(t, call{method: "GET", path: "/v1/sessions", status: 401, invalid: true})
	c.do(t, call{method: "POST", path: "/v1/sessions", key: e.keyA, body: []byte(`{"kind":`), status: 400, invalid: true})
	c.do(t, call{method: "POST", path: "/v1/sessions", key: e.keyA, body: []byte(`{"kind":"browser","nope":1}`), status: 400, invalid: true})
	c.do(t, call{method: "GET", path: "/v1/sessions/s-0000000000000000", key: e.keyA, status: 404})
	c.do(t, call{method: "GET", path: "/v1/artifacts/s-0000000000000000.0000000000000000", key: e.keyA, status: 404})

	// A session and what it does.
	var s sessionInfo
	c.json(t, e.keyA, "POST", "/v1/sessions?wait=true", map[string]any{"kind": "browser", "labels": map[string]string{"test": t.Name()}}, 201, &s)
	if s.State != "running" {
		t.Fatalf("session %s is %s", s.ID, s.State)
	}
	t.Cleanup(func() { e.api(t, e.keyA, "DELETE", "/v1/sessions/"+s.ID, nil) })
	sp := "/v1/sessions/" + s.ID
	c.json(t, e.keyA, "GET", "/v1/sessions", nil, 200, nil)
	c.json(t, e.keyA, "GET", sp, nil, 200, nil)
	c.json(t, e.keyB, "GET", sp, nil, 404, nil)
	c.json(t, e.keyA, "POST", sp+"/extend", map[string]any{"ttl_seconds": 900}, 200, nil)
	c.do(t, call{method: "POST", path: sp + "/extend", key: e.keyA, body: []byte(`{"ttl_seconds":0}`), status: 400, invalid: true})

	var pc, pv, pw, pr, gone previewInfo
	c.json(t, e.keyA, "POST", sp+"/previews", map[string]any{"scope": "cdp", "ttl_seconds": 600}, 201, &pc)
	c.json(t, e.keyA, "POST", sp+"/previews", map[string]any{"scope": "vnc", "view_only": true}, 201, &pv)
	c.json(t, e.keyA, "POST", sp+"/previews", map[string]any{"scope": "view"}, 201, &pw)
	c.json(t, e.keyA, "POST", sp+"/previews", map[string]any{"scope": "review"}, 201, &pr)
	c.json(t, e.keyA, "POST", sp+"/previews", map[string]any{"scope": "cdp"}, 201, &gone)
	for _, p := range []previewInfo{pc, pv, pw, pr, gone} {
		keep(p)
	}
	c.do(t, call{method: "POST", path: sp + "/previews", key: e.keyA, body: []byte(`{"scope":"everything"}`), status: 400, invalid: true})

	// The replicas' internal routes (the relay of backend kubernetes),
	// signed as a replica signs them: with the token key, over the
	// time, a nonce, the path and the body.
	relay := func(path string, body []byte, status int, invalid bool) []byte {
		t.Helper()
		ts, nonce := strconv.FormatInt(time.Now().Unix(), 10), randHex(16)
		m := hmac.New(sha256.New, []byte(e.tokenKey))
		m.Write([]byte("sandgate relay\x00" + ts + "\x00" + nonce + "\x00" + path + "\x00"))
		m.Write(body)
		h := http.Header{"X-Sandgate-Relay": {"k1 " + ts + " " + nonce + " " + hex.EncodeToString(m.Sum(nil))}}
		return c.do(t, call{method: "POST", path: path, header: h, body: body, status: status, invalid: invalid})
	}
	admitBody, _ := json.Marshal(map[string]string{"token": token(pc)})
	if out := relay("/internal/v1/relay/admit", admitBody, 200, false); jsonField(out, "session") != s.ID || jsonField(out, "preview") != pc.ID {
		t.Errorf("a relay's admission: %s", trim(out))
	}
	relay("/internal/v1/relay/admit", []byte(`{"token":"x"}`), 401, false)
	relay("/internal/v1/relay/admit", []byte(`{`), 400, true)
	c.do(t, call{method: "POST", path: "/internal/v1/relay/admit", body: admitBody, status: 404}) // unsigned
	// A shell: admitted by the tenant's API key, with a ticket that no
	// preview admission takes; another tenant's key or a bad one is
	// refused, in the answer.
	shellBody := func(key string) []byte {
		b, _ := json.Marshal(map[string]any{"shell": map[string]string{"session": s.ID, "key": key}})
		return b
	}
	shellAns := relay("/internal/v1/relay/admit", shellBody(e.keyA), 200, false)
	ticket := jsonField(shellAns, "ticket")
	if jsonField(shellAns, "session") != s.ID || jsonField(shellAns, "scope") != "shell" || ticket == "" || bytes.Contains(shellAns, []byte("refused")) {
		t.Errorf("a relay's shell admission: %s", trim(shellAns))
	}
	for key, want := range map[string]string{e.keyB: `"status":404`, "sk-bad": `"status":401`} {
		if out := relay("/internal/v1/relay/admit", shellBody(key), 200, false); !bytes.Contains(out, []byte(want)) || jsonField(out, "ticket") != "" {
			t.Errorf("a shell admission with another tenant's key or a bad one: %s, want %s", trim(out), want)
		}
	}
	ticketBody, _ := json.Marshal(map[string]string{"token": ticket})
	relay("/internal/v1/relay/admit", ticketBody, 401, false)
	shellReport, _ := json.Marshal(map[string]any{"relay": "contract", "conns": []map[string]any{{"id": "sh1", "token": ticket, "active": true}},
		"events": []map[string]any{{"token": ticket, "type": "shell_opened"}, {"token": ticket, "type": "shell_closed", "exit_code": 4, "duration_ms": 10},
			{"token": ticket, "type": "exec", "argv": []string{"true"}, "user": "sandgate", "exit_code": 0, "duration_ms": 3, "stdout_bytes": 0}}})
	relay("/internal/v1/relay/sync", shellReport, 200, false)
	report, _ := json.Marshal(map[string]any{"relay": "contract", "conns": []map[string]any{{"id": "c1", "token": token(pc), "active": true}}})
	relay("/internal/v1/relay/sync", report, 200, false)
	relay("/internal/v1/relay/sync", []byte(`{"relay":"contract","conns":[]}`), 200, false) // c1 closed
	relay("/internal/v1/relay/sync", []byte(`{"conns":[]}`), 400, true)
	c.do(t, call{method: "DELETE", path: sp + "/previews/" + gone.ID, key: e.keyA, status: 204})
	c.do(t, call{method: "DELETE", path: sp + "/previews/p-0000000000000000", key: e.keyB, status: 404})

	var shot struct{ ID string }
	c.json(t, e.keyA, "POST", sp+"/screenshot", nil, 201, &shot)
	c.json(t, e.keyA, "POST", sp+"/actions", map[string]any{"action": "mouse_move", "coordinate": []int{100, 100}}, 200, nil)
	c.json(t, e.keyA, "POST", sp+"/actions", map[string]any{"action": "cursor_position"}, 200, nil)
	c.do(t, call{method: "POST", path: sp + "/actions", key: e.keyA, body: []byte(`{"action":"fly"}`), status: 400, invalid: true})

	out := c.do(t, call{method: "POST", path: sp + "/exec", key: e.keyA, status: 200,
		body: []byte(`{"cmd":["sh","-c","echo out; echo err >&2; exit 3"],"timeout_seconds":30}`)})
	if !bytes.Contains(out, []byte(`"exit_code":3`)) {
		t.Errorf("exec: %s", out)
	}
	c.do(t, call{method: "POST", path: sp + "/exec", key: e.keyA, body: []byte(`{"cmd":[]}`), status: 400, invalid: true})
	c.ws(t, call{method: "GET", path: sp + "/shell?cols=100&rows=30", key: e.keyA, status: 101})
	c.do(t, call{method: "GET", path: sp + "/shell", key: e.keyA, status: 400})

	file := "/home/sandgate/workspace/contract.txt"
	c.do(t, call{method: "PUT", path: sp + "/files?path=" + url.QueryEscape(file), key: e.keyA, body: []byte("hello\n"), contentType: "application/octet-stream", status: 201})
	if got := c.do(t, call{method: "GET", path: sp + "/files?path=" + url.QueryEscape(file), key: e.keyA, status: 200}); string(got) != "hello\n" {
		t.Errorf("file read back %q", got)
	}
	c.do(t, call{method: "GET", path: sp + "/files?path=/home/sandgate/workspace", key: e.keyA, status: 200})
	c.do(t, call{method: "GET", path: sp + "/files?path=/no/such/file", key: e.keyA, status: 404})
	c.do(t, call{method: "GET", path: sp + "/files?path=relative", key: e.keyA, status: 400, invalid: true})

	c.json(t, e.keyA, "GET", sp+"/events", nil, 200, nil)
	c.json(t, e.keyA, "GET", sp+"/artifacts", nil, 200, nil)
	c.do(t, call{method: "GET", path: "/v1/artifacts/" + shot.ID, key: e.keyA, status: 302})

	// The vault; fill_credential of a credential not bound to the session.
	var cred struct{ ID string }
	c.json(t, e.keyA, "POST", "/v1/credentials", map[string]any{"name": "contract", "kind": "bearer", "secret": e.canary,
		"destinations": []map[string]any{{"scheme": "https", "host": "site.sandgate.test"}}}, 201, &cred)
	c.json(t, e.keyA, "GET", "/v1/credentials", nil, 200, nil)
	c.json(t, e.keyA, "GET", "/v1/credentials/"+cred.ID, nil, 200, nil)
	c.json(t, e.keyA, "POST", sp+"/actions", map[string]any{"action": "fill_credential", "credential": cred.ID, "selector": "#pass"}, 403, nil)
	c.do(t, call{method: "POST", path: "/v1/credentials", key: e.keyA, body: []byte(`{"name":"x","kind":"smoke","secret":"s"}`), status: 400, invalid: true})
	c.do(t, call{method: "DELETE", path: "/v1/credentials/" + cred.ID, key: e.keyA, status: 204})
	c.do(t, call{method: "GET", path: "/v1/credentials/" + cred.ID, key: e.keyA, status: 404})

	// Viewer, VNC, review.
	c.do(t, call{method: "GET", path: "/viewer-assets/viewer.js", status: 200})
	c.do(t, call{method: "GET", path: "/viewer-assets/viewer.css", status: 200})
	c.do(t, call{method: "GET", path: "/view/" + token(pw), status: 200})
	c.do(t, call{method: "GET", path: "/view/" + token(pc), status: 401})
	c.ws(t, call{method: "GET", path: "/vnc/" + token(pv), status: 101})
	c.do(t, call{method: "GET", path: "/review/" + token(pr), status: 200})
	c.do(t, call{method: "GET", path: "/review/" + token(pr) + "/artifacts/" + shot.ID, status: 302})

	// CDP, the token in the path.
	cdp := "/cdp/" + token(pc)
	var version struct {
		WS string `json:"webSocketDebuggerUrl"`
	}
	if err := json.Unmarshal(c.do(t, call{method: "GET", path: cdp + "/json/version", status: 200}), &version); err != nil {
		t.Fatal(err)
	}
	browserID := version.WS[strings.LastIndex(version.WS, "/")+1:]
	var targets []struct{ ID, Type string }
	if err := json.Unmarshal(c.do(t, call{method: "GET", path: cdp + "/json/list", status: 200}), &targets); err != nil {
		t.Fatal(err)
	}
	page := ""
	for _, tg := range targets {
		if tg.Type == "page" && page == "" {
			page = tg.ID
		}
	}
	if page == "" {
		t.Fatalf("no page target in %+v", targets)
	}
	c.do(t, call{method: "GET", path: cdp + "/json", status: 200})
	c.do(t, call{method: "GET", path: cdp + "/json/protocol", status: 200})
	c.do(t, call{method: "GET", path: cdp + "/json/new", status: 404, invalid: true})
	c.ws(t, call{method: "GET", path: cdp, status: 101})
	c.ws(t, call{method: "GET", path: cdp + "/devtools/browser/" + browserID, status: 101})
	c.ws(t, call{method: "GET", path: cdp + "/devtools/page/" + page, status: 101})
	c.do(t, call{method: "GET", path: "/cdp/not-a-token/json/version", status: 401})

	// CDP, the token in the Authorization header.
	bearer := http.Header{"Authorization": {"Bearer " + token(pc)}}
	c.do(t, call{method: "GET", path: "/cdp/json/version", header: bearer, status: 200})
	c.do(t, call{method: "GET", path: "/cdp/json", header: bearer, status: 200})
	c.ws(t, call{method: "GET", path: "/cdp", header: bearer, status: 101})
	c.ws(t, call{method: "GET", path: "/cdp/devtools/browser/" + browserID, header: bearer, status: 101})
	c.do(t, call{method: "GET", path: "/cdp/json/version", status: 401, invalid: true})

	// What is left under each preview prefix.
	for _, p := range []string{"/reviewx", "/viewx", "/vncx", "/cdpx"} {
		for _, m := range []string{"GET", "PUT", "POST", "DELETE", "OPTIONS", "PATCH", "TRACE"} {
			c.do(t, call{method: m, path: p, status: 401})
		}
	}

	// Profiles and snapshots.
	var prof struct{ ID string }
	c.json(t, e.keyA, "POST", "/v1/profiles", map[string]any{"name": "contract"}, 201, &prof)
	c.json(t, e.keyA, "GET", "/v1/profiles", nil, 200, nil)
	c.json(t, e.keyA, "GET", "/v1/profiles/"+prof.ID, nil, 200, nil)
	c.json(t, e.keyB, "GET", "/v1/profiles/"+prof.ID, nil, 404, nil)
	c.json(t, e.keyA, "POST", "/v1/profiles/"+prof.ID+"/rollback", map[string]any{"version": 0}, 200, nil)
	c.json(t, e.keyA, "POST", "/v1/profiles/"+prof.ID+"/rollback", map[string]any{"version": 3}, 400, nil)
	c.do(t, call{method: "POST", path: "/v1/profiles", key: e.keyA, body: []byte(`{"name":""}`), status: 400, invalid: true})
	var snap struct{ ID string }
	c.json(t, e.keyA, "POST", sp+"/snapshots", nil, 201, &snap)
	c.json(t, e.keyA, "GET", sp+"/snapshots", nil, 200, nil)
	c.json(t, e.keyB, "GET", sp+"/snapshots", nil, 404, nil)
	c.do(t, call{method: "DELETE", path: "/v1/profiles/" + prof.ID, key: e.keyA, status: 204})
	c.do(t, call{method: "DELETE", path: "/v1/profiles/" + prof.ID, key: e.keyA, status: 404})

	// The end.
	c.json(t, e.keyA, "DELETE", sp, nil, 200, nil)

	var missed []string
	for path, item := range c.doc.Paths.Map() {
		for method := range item.Operations() {
			if !c.covered[method+" "+path] {
				missed = append(missed, method+" "+path)
			}
		}
	}
	slices.Sort(missed)
	if len(missed) > 0 {
		t.Errorf("documented operations the test did not drive:\n  %s", strings.Join(missed, "\n  "))
	}
	t.Logf("%d documented operations driven", len(c.covered))
}
