package vault

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"errors"
	"regexp"
	"strings"
	"testing"
)

func TestPlaceholder(t *testing.T) {
	key := bytes.Repeat([]byte{1}, 32)
	k1, err := placeholderKey(key)
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := placeholderKey(bytes.Repeat([]byte{2}, 32))
	v := &Vault{phKey: k1}
	form := regexp.MustCompile(`^sgph_[0-9a-f]{32}$`)
	a := v.Placeholder("s_0123456789abcdef", "cred_0000000000000001")
	if !form.MatchString(a) {
		t.Fatalf("placeholder %q is not sgph_ and 32 lower-case hex digits", a)
	}
	if again := (&Vault{phKey: k1}).Placeholder("s_0123456789abcdef", "cred_0000000000000001"); again != a {
		t.Errorf("not deterministic: %q then %q", a, again)
	}
	for name, other := range map[string]string{
		"another session":    v.Placeholder("s_0123456789abcdee", "cred_0000000000000001"),
		"another credential": v.Placeholder("s_0123456789abcdef", "cred_0000000000000002"),
		"another vault key":  (&Vault{phKey: k2}).Placeholder("s_0123456789abcdef", "cred_0000000000000001"),
		"fields shifted":     v.Placeholder("s_0123456789abcdef\x00cred_0000000000000001", ""),
	} {
		if other == a || !form.MatchString(other) {
			t.Errorf("%s: %q (the first was %q)", name, other, a)
		}
	}
	if bytes.Equal(k1, key) {
		t.Error("the placeholder key is the vault key itself")
	}
}

func TestCheckForm(t *testing.T) {
	dests := []Destination{{Scheme: "https", Host: "login.example.com"}}
	for _, tc := range []struct {
		n  New
		ok bool
	}{
		{New{Name: "login", Kind: KindForm, Username: "qa:user@example.com", Secret: "pw", Destinations: dests}, true},
		{New{Name: "login", Kind: KindForm, Username: "qa:user@example.com", Secret: "pw"}, false}, // goes nowhere
		{New{Name: "login", Kind: KindForm, Username: "qa:user@example.com", Secret: "pw", Destinations: make([]Destination, MaxDestinations+1)}, false},
		{New{Name: "login", Kind: KindForm, Secret: "pw", Destinations: dests}, false},
		{New{Name: "login", Kind: KindForm, Username: "qa\nuser", Secret: "pw", Destinations: dests}, false},
		{New{Name: "login", Kind: KindForm, Username: "qa", Secret: "p\rw", Destinations: dests}, false},
	} {
		err := check(tc.n)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("check(%+v) = %v, want ok %v", tc.n, err, tc.ok)
		}
	}
}

// TestDestinationsSealed: where a credential may go is sealed with its
// secret, so a stored credential whose destinations or value fill were
// changed does not open.
func TestDestinationsSealed(t *testing.T) {
	block, _ := aes.NewCipher(bytes.Repeat([]byte{3}, 32))
	aead, _ := cipher.NewGCM(block)
	m := Meta{ID: "cred_0000000000000001", Kind: KindForm, Username: "qa", Destinations: []Destination{{Scheme: "https", Host: "login.example.com"}}}
	nonce := make([]byte, aead.NonceSize())
	sealed := aead.Seal(nil, nonce, []byte("pw"), aad("acme", m))
	if _, err := aead.Open(nil, nonce, sealed, aad("acme", m)); err != nil {
		t.Fatalf("the control does not open: %v", err)
	}
	wider := m
	wider.Destinations = []Destination{{Scheme: "https", Host: "evil.example"}}
	value := m
	value.AllowValueFill = true
	for name, changed := range map[string]Meta{"other destinations": wider, "value fill allowed": value} {
		if _, err := aead.Open(nil, nonce, sealed, aad("acme", changed)); err == nil {
			t.Errorf("a credential with %s opens", name)
		}
	}
}

// TestOldCredentialsOpen: a credential stored before destinations existed
// (none, no value fill) is sealed with the additional data of then, so it
// still opens (and is bound nowhere).
func TestOldCredentialsOpen(t *testing.T) {
	m := Meta{ID: "cred_0000000000000001", Kind: KindBasic, Username: "qa", Destinations: []Destination{}}
	then := strings.Join([]string{"sandgate-vault-v1", "acme", m.ID, m.Kind, m.FieldName, m.Username}, "\x00")
	if got := string(aad("acme", m)); got != then {
		t.Errorf("the additional data of a credential without destinations changed: %q, was %q", got, then)
	}
	m.Destinations = nil
	if got := string(aad("acme", m)); got != then {
		t.Errorf("with nil destinations: %q, was %q", got, then)
	}
	m.Destinations = []Destination{{Scheme: "https", Host: "a.example.com"}}
	if got := string(aad("acme", m)); got == then {
		t.Error("the control: destinations do not change the additional data")
	}
}
