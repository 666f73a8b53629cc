package gateway

import (
	"testing"

	"github.com/sandgate/sandgate/egress"
)

func TestFillMode(t *testing.T) {
	bind := func(fill, prefix string) egress.Binding {
		b := egress.Binding{Credential: "cred_0123456789abcdef", Scheme: "http", Host: "login.example", Port: 8181, PathPrefix: prefix, Fill: fill}
		if err := egress.CheckBinding(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	ph, val := bind("", "/app"), bind("value", "/app")
	cases := []struct {
		name  string
		bound []egress.Binding
		url   string
		mode  string // "" refused
	}{
		{"bound page", []egress.Binding{ph}, "http://login.example:8181/app/login.html", "placeholder"},
		{"prefix itself", []egress.Binding{ph}, "http://LOGIN.example:8181/app", "placeholder"},
		{"value opt-in", []egress.Binding{val}, "http://login.example:8181/app/login.html?x=1#f", "value"},
		{"placeholder wins over value", []egress.Binding{val, ph}, "http://login.example:8181/app/x", "placeholder"},
		{"prefix is not a segment", []egress.Binding{ph}, "http://login.example:8181/apparel/login.html", ""},
		{"dot segments leave the prefix", []egress.Binding{ph}, "http://login.example:8181/app/../admin", ""},
		{"encoded slash", []egress.Binding{ph}, "http://login.example:8181/app%2f..%2fadmin", ""},
		{"other port", []egress.Binding{ph}, "http://login.example/app/login.html", ""},
		{"other scheme", []egress.Binding{ph}, "https://login.example:8181/app/login.html", ""},
		{"other host", []egress.Binding{ph}, "http://evil.example:8181/app/login.html", ""},
		{"suffix host", []egress.Binding{ph}, "http://login.example.evil:8181/app/login.html", ""},
		{"user info", []egress.Binding{ph}, "http://login.example:8181@evil.example/app/login.html", ""},
		{"blank page", []egress.Binding{ph}, "about:blank", ""},
		{"data URL", []egress.Binding{ph}, "data:text/html,<input>", ""},
		{"no bindings", nil, "http://login.example:8181/app/login.html", ""},
	}
	for _, tc := range cases {
		mode, ok := fillMode(tc.bound, tc.url)
		if ok != (tc.mode != "") || mode != tc.mode {
			t.Errorf("%s: %q -> %q %v, want %q", tc.name, tc.url, mode, ok, tc.mode)
		}
	}
}

func TestPageForAudit(t *testing.T) {
	for in, want := range map[string]string{
		"http://u:p@login.example:8181/app/x?token=abc#frag": "http://login.example:8181/app/x",
		"about:blank": "about:blank",
		"%zz":         "(unparsable URL)",
	} {
		if got := pageForAudit(in); got != want {
			t.Errorf("%q -> %q, want %q", in, got, want)
		}
	}
}
