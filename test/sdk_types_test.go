package test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	sandgate "github.com/sandgate/sandgate/sdk/go"
)

// TestGoSDKTypesMatchOpenAPI holds the Go SDK's answer types to the
// document: every field the SDK reads is a property of the schema (so a
// rename in the API breaks this, not a user), and every property the
// schema requires is read by the SDK (so nothing the API promises is
// silently dropped). A unit test: it reads gateway/openapi.yaml.
func TestGoSDKTypesMatchOpenAPI(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromFile("../gateway/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Properties a schema requires that the SDK leaves out on purpose.
	skip := map[string][]string{"ActionResult": {"took_ms"}} // read into Took, a time.Duration
	for _, tc := range []struct {
		schema string
		typ    any
	}{
		{"Session", sandgate.Session{}},
		{"Preview", sandgate.Preview{}},
		{"Runtime", sandgate.Runtime{}},
		{"Pool", sandgate.Pool{}},
		{"Usage", sandgate.Usage{}},
		{"Artifact", sandgate.Artifact{}},
		{"Event", sandgate.Event{}},
		{"Credential", sandgate.Credential{}},
		{"ActionResult", sandgate.ActionResult{}},
		{"Resources", sandgate.Resources{}},
		{"Screen", sandgate.Screen{}},
		{"Binding", sandgate.Binding{}},
		{"CreateSession", sandgate.SessionRequest{}},
		{"ExecRequest", sandgate.ExecRequest{}},
		{"NewCredential", sandgate.CredentialRequest{}},
		{"Destination", sandgate.Destination{}},
		{"Profile", sandgate.Profile{}},
		{"ProfileVersion", sandgate.ProfileVersion{}},
		{"Snapshot", sandgate.Snapshot{}},
	} {
		ref := doc.Components.Schemas[tc.schema]
		if ref == nil || ref.Value == nil {
			t.Errorf("no schema %s in openapi.yaml", tc.schema)
			continue
		}
		props := properties(ref.Value)
		fields := jsonFields(reflect.TypeOf(tc.typ))
		if len(fields) == 0 {
			t.Errorf("%T has no JSON fields", tc.typ)
		}
		for _, f := range fields {
			if _, ok := props[f]; !ok {
				t.Errorf("%T reads %q, which schema %s does not have", tc.typ, f, tc.schema)
			}
		}
		for _, r := range required(ref.Value) {
			if !slices.Contains(fields, r) && !slices.Contains(skip[tc.schema], r) {
				t.Errorf("schema %s requires %q, which %T does not read", tc.schema, r, tc.typ)
			}
		}
	}
}

// properties of a schema, through allOf.
func properties(s *openapi3.Schema) map[string]bool {
	out := map[string]bool{}
	for k := range s.Properties {
		out[k] = true
	}
	for _, a := range s.AllOf {
		if a.Value != nil {
			for k := range properties(a.Value) {
				out[k] = true
			}
		}
	}
	return out
}

func required(s *openapi3.Schema) []string {
	out := slices.Clone(s.Required)
	for _, a := range s.AllOf {
		if a.Value != nil {
			out = append(out, required(a.Value)...)
		}
	}
	return out
}

// jsonFields are the JSON names of a struct's fields (embedded ones
// flattened; "-" skipped).
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		switch {
		case name == "-" || !f.IsExported():
		case f.Anonymous && name == "":
			out = append(out, jsonFields(f.Type)...)
		case name == "":
			out = append(out, f.Name)
		default:
			out = append(out, name)
		}
	}
	return out
}
