package browser

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"
)

const (
	chromeList = `[ {
   "description": "",
   "devtoolsFrontendUrl": "/devtools/inspector.html?ws=localhost:9222/devtools/page/A1",
   "id": "A1",
   "title": "t <b>&",
   "type": "page",
   "url": "http://pages.test/",
   "webSocketDebuggerUrl": "ws://localhost:9222/devtools/page/A1"
} ]`
	chromeVersion = `{
   "Browser": "Chrome/140.0.0.0",
   "File-Path-Style": "posix",
   "Protocol-Version": "1.3",
   "User-Agent": "Mozilla/5.0",
   "V8-Version": "14.0",
   "WebKit-Version": "537.36",
   "webSocketDebuggerUrl": "ws://localhost:9222/devtools/browser/B-2"
}`
)

func TestRewriteTargets(t *testing.T) {
	out, err := rewriteTargets([]byte(chromeList), "wss://gw.example/cdp/TOKEN")
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	// The spacing is Chromium's, which some clients' tests rely on.
	if !strings.Contains(s, `"webSocketDebuggerUrl": "wss://gw.example/cdp/TOKEN/devtools/page/A1"`) ||
		!strings.Contains(s, `"devtoolsFrontendUrl": "/devtools/inspector.html?ws=gw.example/cdp/TOKEN/devtools/page/A1"`) ||
		!strings.Contains(s, `"title": "t <b>&"`) || strings.Contains(s, "9222") {
		t.Fatalf("rewrite: %s", s)
	}
	v, err := rewriteVersion([]byte(chromeVersion), "ws://gw/cdp/T")
	if err != nil || !strings.Contains(string(v), `"webSocketDebuggerUrl": "ws://gw/cdp/T/devtools/browser/B-2"`) || !strings.Contains(string(v), `"Protocol-Version": "1.3"`) {
		t.Fatalf("version: %s %v", v, err)
	}
	// A member the gateway does not know passes if it can hold no address.
	if !strings.Contains(string(v), `"File-Path-Style": "posix"`) {
		t.Fatalf("version lost a member: %s", v)
	}
	odd := strings.Replace(chromeList, `"id": "A1",`, `"id": "A1", "devtoolsFrontendUrlCompat": "https://x/?ws=localhost:9222/devtools/page/A1", "WebSocketDebuggerURL": "ws://evil", "extra": 7,`, 1)
	out, err = rewriteTargets([]byte(odd), "ws://gw/cdp/T")
	if err != nil || strings.Contains(string(out), "9222") || strings.Contains(string(out), "evil") || !strings.Contains(string(out), `"extra": 7`) {
		t.Fatalf("unknown members: %s %v", out, err)
	}
}

// TestDiscoveryRefusesForeignAddresses: a session's Chromium (or whatever
// answers on its port) cannot point a client anywhere but back at the
// gateway. Chromium's own documents beside each case pass.
func TestDiscoveryRefusesForeignAddresses(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		version    bool
	}{
		{"other host", strings.Replace(chromeVersion, "localhost:9222", "evil.example:9222", 1), true},
		{"other port", strings.Replace(chromeVersion, "localhost:9222", "localhost:9223", 1), true},
		{"wss", strings.Replace(chromeVersion, "ws://localhost", "wss://localhost", 1), true},
		{"page as browser", strings.Replace(chromeVersion, "/browser/", "/page/", 1), true},
		{"path in id", strings.Replace(chromeVersion, "B-2", "B/../../x", 1), true},
		{"query in id", strings.Replace(chromeVersion, "B-2", "B?x=1", 1), true},
		{"no address", strings.Replace(chromeVersion, `"webSocketDebuggerUrl"`, `"x"`, 1), true},
		{"not JSON", `{"webSocketDebuggerUrl": "ws://localhost:9222/devtools/browser/B"`, true},
		{"list: other host", strings.Replace(chromeList, "ws://localhost:9222", "ws://10.0.0.1:9222", 1), false},
		{"list: another target's address", strings.Replace(chromeList, "page/A1\"\n", "page/A2\"\n", 1), false},
		{"list: bad id", strings.ReplaceAll(chromeList, "A1", "A 1"), false},
		{"list: object", `{"id":"A"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.version {
				_, err = rewriteVersion([]byte(tc.body), "ws://gw/cdp/T")
			} else {
				_, err = rewriteTargets([]byte(tc.body), "ws://gw/cdp/T")
			}
			if !errors.Is(err, ErrDiscovery) {
				t.Fatalf("accepted (%v): %s", err, tc.body)
			}
		})
	}
	// A frontend URL elsewhere is dropped, the target kept.
	out, err := rewriteTargets([]byte(strings.Replace(chromeList, "/devtools/inspector.html", "https://evil.example/inspector.html", 1)), "ws://gw/cdp/T")
	if err != nil || strings.Contains(string(out), "evil") || !strings.Contains(string(out), `"ws://gw/cdp/T/devtools/page/A1"`) {
		t.Fatalf("foreign frontend: %s %v", out, err)
	}
}

// TestDiscoveryBounded: a document over the limit is refused whole, an
// announced length before it is read; Chromium's size passes.
func TestDiscoveryBounded(t *testing.T) {
	big := `{"webSocketDebuggerUrl":"ws://localhost:9222/devtools/browser/B","Browser":"` + strings.Repeat("x", maxDiscoveryBytes) + `"}`
	var body string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Host != UpstreamHost {
			http.Error(w, "host", 500)
			return
		}
		w.Write([]byte(body))
	}))
	defer srv.Close()
	ap := netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "http://"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body = chromeVersion
	if id, err := BrowserID(ctx, ap); err != nil || id != "B-2" {
		t.Fatalf("control: %q %v", id, err)
	}
	body = big
	if _, err := Discover(ctx, ap, "json/version", "ws://gw/cdp/T"); !errors.Is(err, ErrDiscovery) {
		t.Fatalf("a %d-byte document: %v", len(big), err)
	}
	body = "[" + strings.Repeat(`{"id":"A","type":"page"},`, maxTargets) + `{"id":"A","type":"page"}]`
	if _, err := Targets(ctx, ap); !errors.Is(err, ErrDiscovery) {
		t.Fatalf("%d targets: %v", maxTargets+1, err)
	}
	body = chromeList
	if ts, err := Targets(ctx, ap); err != nil || len(ts) != 1 || ts[0].ID != "A1" {
		t.Fatalf("control targets: %v %v", ts, err)
	}
}

// FuzzDiscovery: whatever a session answers, what the gateway serves is
// JSON whose only WebSocket addresses are the gateway's.
func FuzzDiscovery(f *testing.F) {
	f.Add([]byte(chromeList), false)
	f.Add([]byte(chromeVersion), true)
	f.Fuzz(func(t *testing.T, body []byte, isVersion bool) {
		var out []byte
		var err error
		if isVersion {
			out, err = rewriteVersion(body, "ws://gw/cdp/T")
		} else {
			out, err = rewriteTargets(body, "ws://gw/cdp/T")
		}
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid JSON out: %s", out)
		}
		var wss, fronts []string
		if isVersion {
			var v doc
			json.Unmarshal(out, &v)
			wss = append(wss, v.str(wsKey))
			if _, ok := v[frontendKey]; ok {
				t.Fatalf("a frontend URL in the version: %s", out)
			}
		} else {
			var ts []doc
			json.Unmarshal(out, &ts)
			for _, d := range ts {
				if _, ok := d[wsKey]; ok {
					wss = append(wss, d.str(wsKey))
				}
				if _, ok := d[frontendKey]; ok {
					fronts = append(fronts, d.str(frontendKey))
				}
			}
		}
		// Outside the page's own members, nothing names the session's own
		// address any more, however it is written.
		var docs []doc
		if isVersion {
			var v doc
			json.Unmarshal(out, &v)
			docs = append(docs, v)
		} else {
			json.Unmarshal(out, &docs)
		}
		for _, d := range docs {
			for k := range known {
				delete(d, k)
			}
			flat, _ := json.Marshal(d)
			var v any
			json.Unmarshal(flat, &v)
			flat, _ = json.Marshal(v)
			if bytes.Contains(flat, []byte(UpstreamHost+"/devtools")) {
				t.Fatalf("the session's address is left in %s", out)
			}
		}
		for _, ws := range wss {
			id, ok := strings.CutPrefix(ws, "ws://gw/cdp/T/devtools/")
			if !ok || strings.Count(id, "/") != 1 || strings.ContainsAny(id, "?#%") {
				t.Fatalf("an address elsewhere: %q in %s", ws, out)
			}
		}
		for _, fr := range fronts {
			_, q, _ := strings.Cut(fr, "?")
			if !strings.HasPrefix(q, "ws=gw/cdp/T/devtools/page/") || strings.ContainsAny(q, "&#") ||
				!(strings.HasPrefix(fr, "/devtools/") || strings.HasPrefix(fr, hostedFrontend)) {
				t.Fatalf("a frontend address elsewhere: %q", fr)
			}
		}
	})
}

func TestCut(t *testing.T) {
	if got := cut("aé", 2); got != "a" {
		t.Fatalf("cut in a rune: %q", got)
	}
	if got := cut("abc", 5); got != "abc" {
		t.Fatal(got)
	}
}
