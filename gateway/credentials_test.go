package gateway

import (
	"testing"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/vault"
)

// TestBindingAllowed: a binding only within one of its credential's
// destinations, as they are stored (defaults filled, hosts normalised),
// and a value fill only where the credential allows it.
func TestBindingAllowed(t *testing.T) {
	var dests []vault.Destination
	for _, d := range []vault.Destination{
		{Scheme: "https", Host: "Login.Example.com."},
		{Scheme: "http", Host: "[::1]", Port: 8080, PathPrefix: "/app/"},
		{Scheme: "https", Host: "*.qa.example.com"},
	} {
		n, err := credentialDestination(d)
		if err != nil {
			t.Fatalf("%+v: %v", d, err)
		}
		dests = append(dests, n)
	}
	if dests[0].Host != "login.example.com" || dests[0].Port != 443 || dests[0].PathPrefix != "/" || dests[1].Host != "[::1]" || dests[2].Host != "*.qa.example.com" {
		t.Fatalf("stored destinations: %+v", dests)
	}
	m := vault.Meta{Destinations: dests}
	for _, c := range []struct {
		b  egress.Binding
		ok bool
	}{
		{egress.Binding{Scheme: "https", Host: "login.example.com"}, true},
		{egress.Binding{Scheme: "http", Host: "[::1]", Port: 8080, PathPrefix: "/app/login"}, true},
		{egress.Binding{Scheme: "https", Host: "a.qa.example.com"}, true},
		{egress.Binding{Scheme: "https", Host: "evil.example"}, false},
		{egress.Binding{Scheme: "http", Host: "[::1]", Port: 8080}, false},
		{egress.Binding{Scheme: "https", Host: "login.example.com", Fill: egress.FillValue}, false},
	} {
		c.b.Credential = "cred_0000000000000001"
		if err := egress.CheckBinding(&c.b); err != nil {
			t.Fatal(err)
		}
		if why := bindingAllowed(m, c.b); (why == "") != c.ok {
			t.Errorf("%+v: %q, want allowed %v", c.b, why, c.ok)
		}
	}
	m.AllowValueFill = true
	if why := bindingAllowed(m, egress.Binding{Scheme: "https", Host: "login.example.com", Port: 443, PathPrefix: "/", Fill: egress.FillValue}); why != "" {
		t.Errorf("a value fill the credential allows: %q", why)
	}
	if why := bindingAllowed(vault.Meta{}, egress.Binding{Scheme: "https", Host: "login.example.com", Port: 443, PathPrefix: "/"}); why == "" {
		t.Error("a credential without destinations was bound")
	}
}
