package session

import "testing"

// TestOffered: a runtime a backend does not report reads as not offered;
// the default is the configured one (an error when it is not usable),
// else the strongest usable isolating one, never runc, "" when none.
func TestOffered(t *testing.T) {
	found := map[string]*Runtime{"gvisor": {Name: "gvisor", Usable: true}, "runc": {Name: "runc", Usable: true}}
	all, def, err := Offered("somewhere", found, "")
	if err != nil || def != "gvisor" || all["kata"] == nil || all["kata"].Usable || all["kata"].Reason != "somewhere does not offer it" {
		t.Fatalf("none configured: %v %q %+v", err, def, all["kata"])
	}
	if got := InOrder(all); len(got) != 3 || got[0].Name != "kata" || got[1].Name != "gvisor" || got[2].Name != "runc" {
		t.Errorf("in order: %+v", got)
	}
	if _, def, err := Offered("somewhere", found, "runc"); err != nil || def != "runc" {
		t.Errorf("runc configured: %q %v", def, err)
	}
	if _, _, err := Offered("somewhere", found, "kata"); err == nil {
		t.Error("kata configured, not offered: no error")
	}
	if _, def, err := Offered("somewhere", map[string]*Runtime{"runc": {Name: "runc", Usable: true}}, ""); err != nil || def != "" {
		t.Errorf("runc alone, none configured: %q %v, want no default", def, err)
	}
}
