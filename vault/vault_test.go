package vault

import (
	"bytes"
	"errors"
	"regexp"
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
	for _, tc := range []struct {
		n  New
		ok bool
	}{
		{New{Name: "login", Kind: KindForm, Username: "qa:user@example.com", Secret: "pw"}, true},
		{New{Name: "login", Kind: KindForm, Secret: "pw"}, false},
		{New{Name: "login", Kind: KindForm, Username: "qa\nuser", Secret: "pw"}, false},
		{New{Name: "login", Kind: KindForm, Username: "qa", Secret: "p\rw"}, false},
	} {
		err := check(tc.n)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("check(%+v) = %v, want ok %v", tc.n, err, tc.ok)
		}
	}
}
