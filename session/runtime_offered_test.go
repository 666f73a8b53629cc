package session

import (
	"reflect"
	"testing"
)

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

// TestPoolsOf: the pools of a config, checked as a manager checks them
// (the default runtime, shape and resources filled in; a runtime not
// usable refused), counted from their sessions' records: running with a
// sandbox that runs is available, starting is on its way; one whose
// sandbox does not run, one claimed (its pool key cleared), one whose
// claim failed, and another pool's are not this pool's.
func TestPoolsOf(t *testing.T) {
	runtimes, def, err := Offered("here", map[string]*Runtime{"gvisor": {Name: "gvisor", Usable: true}, "runc": {Name: "runc", Usable: true}}, "")
	if err != nil {
		t.Fatal(err)
	}
	cfgs := []PoolConfig{{Size: 3}, {Kind: KindDesktop, Runtime: "runc", Screen: Screen{Width: 800, Height: 600}, Size: 1}}
	browser, desktop := "browser/gvisor/1280x800", "desktop/runc/800x600"
	rec := func(pool string, state State) map[string]string {
		return map[string]string{RecordPool: pool, RecordState: string(state)}
	}
	records := []RecordSeen{
		{rec(browser, StateRunning), true}, {rec(browser, StateRunning), true}, {rec(browser, StateStarting), false},
		{rec(browser, StateRunning), false}, {rec("", StateRunning), true}, {rec(claimFailed, StateRunning), true},
		{rec(desktop, StateRunning), true},
	}
	got, err := PoolsOf(cfgs, runtimes, def, records)
	if err != nil {
		t.Fatal(err)
	}
	want := []PoolStats{
		{Key: browser, Kind: KindBrowser, Runtime: "gvisor", Screen: Screen{Width: DefaultScreenWidth, Height: DefaultScreenHeight},
			Resources: Resources{CPUs: DefaultCPUs, MemoryMB: DefaultMemoryMB, Pids: DefaultPids}, Size: 3, Available: 2, Starting: 1},
		{Key: desktop, Kind: KindDesktop, Runtime: "runc", Screen: Screen{Width: 800, Height: 600},
			Resources: Resources{CPUs: DefaultCPUs, MemoryMB: DefaultMemoryMB, Pids: DefaultPids}, Size: 1, Available: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PoolsOf:\n got %+v\nwant %+v", got, want)
	}
	if _, err := PoolsOf([]PoolConfig{{Runtime: "kata", Size: 1}}, runtimes, def, nil); err == nil {
		t.Error("a pool of a runtime not offered: no error")
	}
	if got, err := PoolsOf(nil, runtimes, def, records); err != nil || len(got) != 0 || got == nil {
		t.Errorf("no pools: %#v %v, want an empty list", got, err)
	}
}
