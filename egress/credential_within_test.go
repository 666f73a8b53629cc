package egress

import (
	"net/url"
	"testing"
)

// TestBindingWithin: a session's binding must stay inside one of its
// credential's destinations: scheme, port, host and path prefix.
func TestBindingWithin(t *testing.T) {
	dest := func(scheme, host, prefix string) Binding {
		b := Binding{Scheme: scheme, Host: host, PathPrefix: prefix}
		if err := CheckDestination(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	d := dest("https", "login.example.com", "/")
	w := dest("https", "*.example.com", "/")
	api := dest("https", "api.example.com", "/v1/")
	aws := dest("https", "*.amazonaws.com", "/")
	for _, c := range []struct {
		b    Binding
		d    Binding
		want bool
	}{
		{dest("https", "login.example.com", "/"), d, true},
		{dest("https", "login.example.com", "/auth/"), d, true},
		{dest("https", "LOGIN.example.com.", "/"), d, true},
		{dest("http", "login.example.com", "/"), d, false},
		{Binding{Scheme: "https", Host: "login.example.com", Port: 8443, PathPrefix: "/"}, d, false},
		{dest("https", "evil.example", "/"), d, false},
		{dest("https", "example.com", "/"), w, false},
		{dest("https", "a.example.com", "/"), w, true},
		{dest("https", "*.a.example.com", "/"), w, true},
		{dest("https", "*.example.com", "/"), w, true},
		{dest("https", "*.example.com", "/"), d, false},
		{dest("https", "a.example.com.evil.example", "/"), w, false},
		{dest("https", "api.example.com", "/v1/"), api, true},
		{dest("https", "api.example.com", "/v1/users/"), api, true},
		{dest("https", "api.example.com", "/v1"), api, true},
		{dest("https", "api.example.com", "/"), api, false},
		{dest("https", "api.example.com", "/v10/"), api, false},
		// Names under another public suffix belong to whoever registers
		// them: "*.amazonaws.com" does not cover an S3 bucket or an API
		// Gateway of someone else's.
		{dest("https", "www.amazonaws.com", "/"), aws, true},
		{dest("https", "abcd1234.execute-api.us-east-1.amazonaws.com", "/"), aws, false},
		{dest("https", "attacker.s3.amazonaws.com", "/"), aws, false},
		{dest("https", "*.attacker.s3.amazonaws.com", "/"), aws, false},
	} {
		if got := c.b.Within(c.d); got != c.want {
			t.Errorf("%s://%s:%d%s within %s://%s:%d%s: %v, want %v", c.b.Scheme, c.b.Host, c.b.Port, c.b.PathPrefix, c.d.Scheme, c.d.Host, c.d.Port, c.d.PathPrefix, got, c.want)
		}
	}
}

// TestBindingMatchesSite: at request time a wildcard binding does not
// reach a name under another public suffix either.
func TestBindingMatchesSite(t *testing.T) {
	b := Binding{Credential: "cred_0000000000000001", Scheme: "https", Host: "*.amazonaws.com"}
	if err := CheckBinding(&b); err != nil {
		t.Fatal(err)
	}
	for u, want := range map[string]bool{
		"https://www.amazonaws.com/":                          true,
		"https://a.b.amazonaws.com/":                          true,
		"https://bucket.s3.amazonaws.com/":                    false,
		"https://x.execute-api.us-east-1.amazonaws.com/prod/": false,
		"https://amazonaws.com/":                              false,
	} {
		pu, _ := url.Parse(u)
		if got := b.MatchesURL(pu); got != want {
			t.Errorf("%s: %v, want %v", u, got, want)
		}
		if got := len(bindingsFor([]Binding{b}, "https", pu.Hostname(), 443)) == 1; got != want {
			t.Errorf("bindingsFor %s: %v, want %v", u, got, want)
		}
	}
}
