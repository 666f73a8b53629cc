package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// loadDoc parses and validates the embedded document as kin-openapi reads
// OpenAPI 3.1.
func loadDoc(t *testing.T, raw []byte) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatalf("load openapi document: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi %q, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the openapi document is not valid: %v", err)
	}
	return doc
}

var (
	fiberParam    = regexp.MustCompile(`:([A-Za-z0-9_]+)`)
	fiberWildcard = regexp.MustCompile(`\*[0-9]*`)
)

// openapiPath maps a Fiber route path to its OpenAPI template: a
// parameter :id is {id}, a wildcard * (Fiber names them *1, *2...) is
// {path}, and a trailing slash goes (routing is not strict, so /cdp/:token/
// is /cdp/{token}).
func openapiPath(p string) string {
	p = fiberParam.ReplaceAllString(p, "{$1}")
	p = fiberWildcard.ReplaceAllString(p, "{path}")
	if len(p) > 1 {
		p = strings.TrimSuffix(p, "/")
	}
	return p
}

func TestOpenAPIPath(t *testing.T) {
	for in, want := range map[string]string{
		"/v1/sessions/:id/previews/:preview": "/v1/sessions/{id}/previews/{preview}",
		"/cdp/:token/":                       "/cdp/{token}",
		"/cdp/:token/devtools/*":             "/cdp/{token}/devtools/{path}",
		"/cdp*":                              "/cdp{path}",
		"/":                                  "/",
	} {
		if got := openapiPath(in); got != want {
			t.Errorf("openapiPath(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestOpenAPIParity holds openapi.yaml equal to the routes the app
// registers: every route is documented and every documented operation is
// a route. HEAD is left out where the route has GET (Fiber adds HEAD to
// every GET; the document does not list it), and CONNECT, which the
// catch-all routes (app.All) answer, because OpenAPI 3.1 has no CONNECT
// operation.
func TestOpenAPIParity(t *testing.T) {
	doc := loadDoc(t, openapiDoc)
	// With every optional part the gateway serves (sandgate serve mounts
	// the MCP server), so the document covers them too.
	s := newTestServer(t, WithMCP(http.NotFoundHandler()))

	routes := map[string]bool{} // "METHOD /template"
	gets := map[string]bool{}
	for _, r := range s.App().GetRoutes(true) {
		if r.Method == "GET" {
			gets[openapiPath(r.Path)] = true
		}
	}
	for _, r := range s.App().GetRoutes(true) {
		p := openapiPath(r.Path)
		switch {
		case r.Method == "HEAD" && gets[p]:
		case r.Method == "CONNECT":
		default:
			routes[r.Method+" "+p] = true
		}
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented[method+" "+path] = true
		}
	}
	var missing, extra []string
	for r := range routes {
		if !documented[r] {
			missing = append(missing, r)
		}
	}
	for d := range documented {
		if !routes[d] {
			extra = append(extra, d)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 {
		t.Errorf("routes the app has and openapi.yaml lacks:\n  %s", strings.Join(missing, "\n  "))
	}
	if len(extra) > 0 {
		t.Errorf("operations openapi.yaml has and the app lacks:\n  %s", strings.Join(extra, "\n  "))
	}
	if len(routes) < 40 {
		t.Fatalf("only %d routes: is the app built?", len(routes))
	}
}

// TestOpenAPIServed: both forms are served without an API key, and the
// JSON is the same document as the YAML.
func TestOpenAPIServed(t *testing.T) {
	s := newTestServer(t)
	get := func(path, wantType string) []byte {
		req := httptest.NewRequest("GET", path, nil)
		req.Host = "gw.test:8080"
		resp, err := s.App().Test(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != wantType {
			t.Fatalf("GET %s: %d %q, want 200 %q", path, resp.StatusCode, resp.Header.Get("Content-Type"), wantType)
		}
		return body
	}
	y := loadDoc(t, get("/openapi.yaml", "application/yaml"))
	j := loadDoc(t, get("/openapi.json", "application/json"))
	yj, _ := json.Marshal(y)
	jj, _ := json.Marshal(j)
	if string(yj) != string(jj) {
		t.Fatal("/openapi.json is not the document /openapi.yaml is")
	}
}
