package egress

import (
	"net/url"
	"path"
	"strings"
	"testing"
)

func TestCleanPath(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want string // "" means ambiguous
	}{
		{"/", "/"},
		{"", "/"},
		{"/api/x", "/api/x"},
		{"/api/x/", "/api/x/"},
		{"/api/./x", "/api/x"},
		{"/api//x", "/api/x"},
		{"/api/../admin", "/admin"},
		{"/api/%2e%2e/admin", "/admin"},
		{"/api/%2E./admin", "/admin"},
		{"/../../etc", "/etc"},
		{"/%61pi", "/api"},
		{"/a%20b", "/a b"},
		{"/a%25b", "/a%b"},
		{"/api/..%2fadmin", ""},
		{"/api%2Fadmin", ""},
		{"/api/..%5Cadmin", ""},
		{"/api/..\\admin", ""},
		{"/api/..;/admin", ""},
		{"/api/.;x/admin", ""},
		{"/api;x/admin", "/api;x/admin"},
		{"/api/%00", ""},
	} {
		u := &url.URL{Path: "placeholder"}
		if err := setRawPath(u, tc.raw); err != nil {
			if tc.want != "" {
				t.Errorf("%q: %v", tc.raw, err)
			}
			continue
		}
		got, ok := CleanPath(u)
		if tc.want == "" {
			if ok {
				t.Errorf("CleanPath(%q) = %q; want it refused as ambiguous", tc.raw, got)
			}
			continue
		}
		if !ok || got != tc.want {
			t.Errorf("CleanPath(%q) = %q, %v; want %q", tc.raw, got, ok, tc.want)
		}
	}
}

// setRawPath sets u's path from an escaped path, as a server parses a
// request target.
func setRawPath(u *url.URL, raw string) error {
	p, err := url.Parse("http://h" + raw)
	if err != nil {
		return err
	}
	*u = *p
	return nil
}

func TestPathUnder(t *testing.T) {
	for _, tc := range []struct {
		clean, prefix string
		want          bool
	}{
		{"/api", "/api", true},
		{"/api/", "/api", true},
		{"/api/x", "/api", true},
		{"/api/x", "/api/", true},
		{"/api", "/api/", true},
		{"/apiary", "/api", false},
		{"/apiary", "/api/", false},
		{"/ap", "/api", false},
		{"/", "/api", false},
		{"/anything", "/", true},
		{"/", "/", true},
		{"/API/x", "/api", false},
	} {
		if got := PathUnder(tc.clean, tc.prefix); got != tc.want {
			t.Errorf("PathUnder(%q, %q) = %v", tc.clean, tc.prefix, got)
		}
	}
}

func TestBindingMatchesURL(t *testing.T) {
	b := Binding{Credential: "cred_0000000000000001", Scheme: "https", Host: "*.example.com", PathPrefix: "/app/"}
	if err := CheckBinding(&b); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		u    string
		want bool
	}{
		{"https://a.example.com/app/login", true},
		{"https://A.Example.COM:443/app", true},
		{"https://a.example.com/app/../admin", false},
		{"https://a.example.com/application", false},
		{"https://a.example.com/app%2flogin", false},
		{"http://a.example.com/app/login", false},
		{"https://a.example.com:8443/app/login", false},
		{"https://example.com/app/login", false},
		{"https://a.example.com.evil.test/app/login", false},
	} {
		u, err := url.Parse(tc.u)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.MatchesURL(u); got != tc.want {
			t.Errorf("MatchesURL(%s) = %v", tc.u, got)
		}
	}
	for _, bad := range []Binding{
		{Credential: "cred_0000000000000001", Scheme: "https", Host: "example.com", Fill: "typed"},
		{Credential: "cred_0000000000000001", Scheme: "https", Host: "example.com", PathPrefix: "/a/../b"},
		{Credential: "cred_0000000000000001", Scheme: "https", Host: "example.com", PathPrefix: "/a%2fb"},
		{Credential: "cred_0000000000000001", Scheme: "https", Host: "example.com", PathPrefix: "/a//b"},
	} {
		if err := CheckBinding(&bad); err == nil {
			t.Errorf("CheckBinding(%+v) accepted it", bad)
		}
	}
	v := Binding{Credential: "cred_0000000000000001", Scheme: "https", Host: "example.com", Fill: FillValue}
	if err := CheckBinding(&v); err != nil || v.Fill != FillValue {
		t.Errorf("fill value: %v %q", err, v.Fill)
	}
}

// FuzzBindingMatch: whatever the path, a match means the cleaned path
// lies under the prefix at a segment boundary, holds no dot segment or
// encoded slash, and is its own cleaned form; an encoded slash never
// matches.
func FuzzBindingMatch(f *testing.F) {
	for _, s := range []string{"/api/x", "/api/../admin", "/api/%2e%2e/admin", "/apiary", "/api%2fx", "/api/..;/x", "//api//x/", "/%61pi/./x"} {
		f.Add(s, "/api/")
	}
	f.Fuzz(func(t *testing.T, raw, prefix string) {
		u, err := url.Parse("https://app.example.com" + raw)
		if err != nil || u.Host != "app.example.com" {
			return
		}
		b := Binding{Credential: "cred_0000000000000001", Scheme: "https", Host: "app.example.com", PathPrefix: prefix}
		if CheckBinding(&b) != nil {
			return
		}
		clean, ok := CleanPath(u)
		if strings.Contains(strings.ToLower(u.EscapedPath()), "%2f") && ok {
			t.Fatalf("%q: an encoded slash was not refused", raw)
		}
		if b.MatchesURL(u) != (ok && PathUnder(clean, b.PathPrefix)) {
			t.Fatalf("%q: MatchesURL disagrees with CleanPath and PathUnder", raw)
		}
		if !ok {
			return
		}
		if !strings.HasPrefix(clean, "/") || strings.Contains(clean, "//") {
			t.Fatalf("%q: cleaned to %q", raw, clean)
		}
		for _, seg := range strings.Split(clean, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("%q: cleaned to %q, with a dot segment", raw, clean)
			}
		}
		if again, ok := CleanPath(&url.URL{Path: clean}); !ok || again != clean {
			t.Fatalf("%q: cleaned to %q, which cleans to %q %v", raw, clean, again, ok)
		}
		if PathUnder(clean, b.PathPrefix) {
			p := strings.TrimSuffix(path.Clean(b.PathPrefix), "/")
			if clean != p && !strings.HasPrefix(clean, p+"/") {
				t.Fatalf("%q (%q) matched prefix %q off a segment boundary", raw, clean, b.PathPrefix)
			}
		}
	})
}
