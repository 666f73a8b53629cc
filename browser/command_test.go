package browser

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

const dlDir = "/home/sandgate/workspace/downloads"

// commandSeeds are what the clients send, and the ways around a naive
// reading; they seed FuzzRewriteCommand too.
var commandSeeds = []string{
	// Playwright's connectOverCDP, default context and its own.
	`{"id":3,"method":"Browser.setDownloadBehavior","params":{"behavior":"allowAndName","downloadPath":"/tmp/playwright-artifacts-x","eventsEnabled":true}}`,
	`{"id":9,"method":"Browser.setDownloadBehavior","params":{"behavior":"allowAndName","browserContextId":"C1","downloadPath":"/tmp/playwright-artifacts-x","eventsEnabled":true}}`,
	`{"id":9,"method":"Browser.setDownloadBehavior","params":{"behavior":"deny","browserContextId":"C1","downloadPath":"/tmp/p","eventsEnabled":true}}`,
	// Puppeteer's downloadBehavior option.
	`{"method":"Browser.setDownloadBehavior","params":{"behavior":"allow","downloadPath":"/tmp/pptr"},"id":4}`,
	`{"id":5,"method":"Browser.setDownloadBehavior","params":{"behavior":"deny"}}`,
	`{"id":6,"method":"Browser.setDownloadBehavior","params":{"behavior":"default"}}`,
	`{"id":7,"sessionId":"S1","method":"Page.setDownloadBehavior","params":{"behavior":"allow","downloadPath":"/etc"}}`,
	`{"id":8,"sessionId":"S1","method":"Page.setDownloadBehavior","params":{"behavior":"deny"}}`,
	// Escapes, duplicates, case and nesting.
	`{"id":10,"method":"Browser.setDownload\u0042ehavior","params":{"behavior":"allow","downloadPath":"/tmp"}}`,
	`{"id":11,"method":"Browser.setDownloadBehavior","method":"Browser.getVersion"}`,
	`{"id":12,"\u006dethod":"Browser.setDownloadBehavior","method":"Browser.getVersion"}`,
	`{"id":13,"method":"Browser.setDownloadBehavior","Method":"Browser.getVersion","params":{"behavior":"allow","downloadPath":"/tmp"}}`,
	`{"id":14,"method":"Browser.setDownloadBehavior","params":{"behavior":"allow","downloadPath":"/tmp","DownloadPath":"/x"}}`,
	`{"id":15,"method":"Target.sendMessageToTarget","params":{"sessionId":"S","message":"{\"id\":1,\"method\":\"Browser.setDownloadBehavior\",\"params\":{\"behavior\":\"allow\",\"downloadPath\":\"/tmp\"}}"}}`,
	`{"id":16,"method":"Target.sendMessageToTarget","params":{"message":"{\"id\":1,\"method\":\"Browser.setDownloadBehavior\",\"params\":{\"behavior\":\"deny\"}}"}}`,
	`{"id":17,"method":"Browser.setDownloadBehavior","params":{"behavior":"allow"}} {"id":18}`,
	`{"id":19,"method":"Browser.setDownloadBehavior","params":"allow"}`,
	`[{"id":20,"method":"Browser.setDownloadBehavior"}]`,
	`{"id":21,"method":"Browser.setDownloadBehavior"}`,
	// Ordinary traffic passes untouched.
	`{"id":1,"method":"Runtime.evaluate","params":{"expression":"'\u2028' + 1"}}`,
	`{"id":2,"method":"Target.setAutoAttach","params":{"autoAttach":true,"waitForDebuggerOnStart":true,"flatten":true}}`,
}

func TestRewriteCommand(t *testing.T) {
	type want struct {
		params  string // the forwarded params; "" when nothing changes
		refused bool
		err     bool
	}
	wants := []want{
		{params: `{"behavior":"allowAndName","downloadPath":"` + dlDir + `","eventsEnabled":true}`},
		{params: `{"behavior":"allowAndName","browserContextId":"C1","downloadPath":"` + dlDir + `","eventsEnabled":true}`},
		{params: `{"behavior":"deny","browserContextId":"C1","eventsEnabled":true}`},
		{params: `{"behavior":"allowAndName","downloadPath":"` + dlDir + `"}`},
		{refused: true},
		{params: `{"behavior":"allowAndName","downloadPath":"` + dlDir + `"}`},
		{params: `{"behavior":"allowAndName","downloadPath":"` + dlDir + `"}`},
		{refused: true},
		{params: `{"behavior":"allowAndName","downloadPath":"` + dlDir + `"}`},
		{err: true},
		{err: true},
		// "Method" is not Chromium's key: the command is the one in "method".
		{params: `{"behavior":"allowAndName","downloadPath":"` + dlDir + `"}`},
		{params: `{"behavior":"allowAndName","downloadPath":"` + dlDir + `"}`},
		{params: `{"sessionId":"S","message":"{\"id\":1,\"method\":\"Browser.setDownloadBehavior\",\"params\":{\"behavior\":\"allowAndName\",\"downloadPath\":\"` + dlDir + `\"}}"}`},
		{refused: true},
		{err: true},
		{err: true},
		{err: true},
		{params: `{"behavior":"allowAndName","downloadPath":"` + dlDir + `"}`},
		{},
		{},
	}
	if len(wants) != len(commandSeeds) {
		t.Fatalf("%d wants for %d seeds", len(wants), len(commandSeeds))
	}
	for i, in := range commandSeeds {
		w := wants[i]
		fwd, reply, err := RewriteCommand([]byte(in), dlDir)
		switch {
		case w.err:
			if !errors.Is(err, ErrCommand) {
				t.Errorf("%s: want an error, got %s %s %v", in, fwd, reply, err)
			}
		case err != nil:
			t.Errorf("%s: %v", in, err)
		case w.refused:
			var r struct {
				ID    json.RawMessage
				Error struct{ Code int }
			}
			if fwd != nil || json.Unmarshal(reply, &r) != nil || r.Error.Code != -32000 || len(r.ID) == 0 {
				t.Errorf("%s: want a refusal, got %s / %s", in, fwd, reply)
			}
		case w.params == "":
			if !bytes.Equal(fwd, []byte(in)) || reply != nil {
				t.Errorf("%s: changed to %s / %s", in, fwd, reply)
			}
		default:
			var m map[string]json.RawMessage
			if reply != nil || json.Unmarshal(fwd, &m) != nil || string(m["params"]) != w.params {
				t.Errorf("%s:\n got %s\nwant params %s", in, fwd, w.params)
			}
			if !bytes.Contains(fwd, []byte(`"id":`)) {
				t.Errorf("%s: lost its id: %s", in, fwd)
			}
		}
	}
}

// FuzzRewriteCommand: whatever a client sends, what reaches Chromium is
// either the message as it came (and then it cannot name the command) or
// valid JSON in which every set-download-behaviour command that Chromium
// would read keeps the gateway's directory or denies in a client's own
// context; rewriting again changes nothing.
func FuzzRewriteCommand(f *testing.F) {
	for _, s := range commandSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		fwd, reply, err := RewriteCommand(msg, dlDir)
		if err != nil {
			if fwd != nil || reply != nil {
				t.Fatal("an error with a message")
			}
			return
		}
		if reply != nil {
			if fwd != nil || !json.Valid(reply) {
				t.Fatalf("reply %s with %s", reply, fwd)
			}
			return
		}
		if bytes.Equal(fwd, msg) {
			if mayName(msg) && json.Valid(msg) {
				checkCommand(t, msg, 0)
			}
			return
		}
		if !json.Valid(fwd) {
			t.Fatalf("%q became invalid JSON %q", msg, fwd)
		}
		checkCommand(t, fwd, 0)
		again, reply2, err := RewriteCommand(fwd, dlDir)
		if err != nil || reply2 != nil || !bytes.Equal(again, fwd) {
			t.Fatalf("not stable: %s -> %s (%s, %v)", fwd, again, reply2, err)
		}
	})
}

// checkCommand reads a forwarded message as Chromium does (exact keys;
// with duplicates, either one) and checks its download behaviour.
func checkCommand(t *testing.T, msg []byte, depth int) {
	t.Helper()
	ms, err := members(msg)
	if err != nil {
		if depth == 0 && !strings.Contains(err.Error(), "twice") {
			t.Fatalf("forwarded %q that the gateway cannot read: %v", msg, err)
		}
		return
	}
	var method string
	var params json.RawMessage
	for _, m := range ms {
		switch m.key {
		case "method":
			json.Unmarshal(m.raw, &method)
		case "params":
			params = m.raw
		}
	}
	switch method {
	case "Browser.setDownloadBehavior", "Page.setDownloadBehavior":
		var p map[string]json.RawMessage
		if json.Unmarshal(params, &p) != nil {
			t.Fatalf("forwarded %s with params %s", method, params)
		}
		var b, dir string
		json.Unmarshal(p["behavior"], &b)
		json.Unmarshal(p["downloadPath"], &dir)
		ownContext := method == "Browser.setDownloadBehavior" && p["browserContextId"] != nil
		if !(b == "allowAndName" && dir == dlDir) && !(b == "deny" && ownContext) {
			t.Fatalf("forwarded %s", msg)
		}
	case "Target.sendMessageToTarget":
		var p map[string]json.RawMessage
		json.Unmarshal(params, &p)
		var inner string
		if json.Unmarshal(p["message"], &inner) == nil && depth < maxNesting {
			checkCommand(t, []byte(inner), depth+1)
		}
	}
}
