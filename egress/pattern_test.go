package egress

import (
	"errors"
	"net/netip"
	"testing"
)

func TestParsePattern(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // "" means invalid
	}{
		{"example.com:443", "example.com:443"},
		{"Example.COM.:80", "example.com:80"},
		{"*.example.com:443", "*.example.com:443"},
		{"*.example.co.uk:443", "*.example.co.uk:443"},
		{"203.0.113.7:8080", "203.0.113.7:8080"},
		{"[2001:db8::1]:443", "[2001:db8::1]:443"},
		{"*:443", ""},
		{"*", ""},
		{"*.com:443", ""},
		{"*.co.uk:443", ""},
		{"*.localhost:80", ""},
		{"example.com", ""},
		{"example.com:*", ""},
		{"example.com:0", ""},
		{"example.com:70000", ""},
		{"exa mple.com:80", ""},
		{"2130706433:80", ""},
		{"127.0x0.0x1:80", ""},
		{"-bad.com:80", ""},
		{"user@example.com:80", ""},
		{"file:///etc/passwd:80", ""},
		{"[fe80::1%eth0]:80", ""},
	} {
		p, err := ParsePattern(tc.in)
		if tc.want == "" {
			if err == nil || !errors.Is(err, ErrInvalid) {
				t.Errorf("ParsePattern(%q) = %v, %v; want an ErrInvalid error", tc.in, p, err)
			}
			continue
		}
		if err != nil || p.String() != tc.want {
			t.Errorf("ParsePattern(%q) = %v, %v; want %s", tc.in, p, err, tc.want)
		}
	}
}

func TestPatternMatches(t *testing.T) {
	wild, _ := ParsePattern("*.example.com:443")
	exact, _ := ParsePattern("example.com:443")
	for _, tc := range []struct {
		p    Pattern
		host string
		port uint16
		want bool
	}{
		{wild, "a.example.com", 443, true},
		{wild, "a.b.example.com", 443, true},
		{wild, "example.com", 443, false},
		{wild, "badexample.com", 443, false},
		{wild, "a.example.com", 80, false},
		{exact, "example.com", 443, true},
		{exact, "a.example.com", 443, false},
	} {
		if got := tc.p.Matches(tc.host, tc.port); got != tc.want {
			t.Errorf("%v.Matches(%s, %d) = %v", tc.p, tc.host, tc.port, got)
		}
	}
}

func TestForbidden(t *testing.T) {
	for _, tc := range []struct {
		addr string
		bad  bool
	}{
		{"127.0.0.1", true}, {"10.1.2.3", true}, {"172.20.0.1", true}, {"192.168.1.1", true},
		{"169.254.169.254", true}, {"100.64.0.1", true}, {"0.0.0.0", true}, {"224.0.0.1", true},
		{"::1", true}, {"fe80::1", true}, {"fd00::1", true}, {"::ffff:127.0.0.1", true},
		{"::ffff:10.0.0.1", true}, {"fd00:ec2::254", true}, {"64:ff9b::a9fe:a9fe", true},
		{"93.184.215.14", false}, {"203.0.113.10", false}, {"2606:2800:21f:cb07:6820:80da:af6b:8b2c", false},
	} {
		if got := Forbidden(netip.MustParseAddr(tc.addr), nil) != ""; got != tc.bad {
			t.Errorf("Forbidden(%s) = %v, want %v", tc.addr, got, tc.bad)
		}
	}
	if Forbidden(netip.MustParseAddr("10.9.0.5"), []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}) != "" {
		t.Error("an exempt network is still forbidden")
	}
}

// FuzzParsePattern: a pattern that parses prints to itself, matches its
// own host (a wildcard: a name below it, not itself), and no other port.
func FuzzParsePattern(f *testing.F) {
	for _, s := range []string{"example.com:443", "*.example.co.uk:443", "[2001:db8::1]:80", "203.0.113.7:8080", "*.com:443", "2130706433:80", "Exa_mple.COM.:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePattern(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%q: an error that is not ErrInvalid: %v", s, err)
			}
			return
		}
		again, err := ParsePattern(p.String())
		if err != nil || again != p {
			t.Fatalf("%q parses to %v, printed %q, which parses to %v, %v", s, p, p.String(), again, err)
		}
		if h, ok := NormalizeHost(p.Host); !ok || h != p.Host {
			t.Fatalf("%q: host %q is not normal (%q %v)", s, p.Host, h, ok)
		}
		host := p.Host
		if p.Wildcard {
			if p.Matches(host, p.Port) {
				t.Fatalf("%q: a wildcard matches its own domain", s)
			}
			host = "a." + host
		}
		if !p.Matches(host, p.Port) || p.Matches(host, p.Port+1) {
			t.Fatalf("%q: Matches(%q) is wrong", s, host)
		}
	})
}
