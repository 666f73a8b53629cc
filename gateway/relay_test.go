package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestRelayAuth: the leader's relay routes take only requests signed
// with one of the gateway's keys, over this path and body, within a
// minute of now, once each; anything else is a 404, as a route that is
// not there.
// A signed admission with a bad token is a 401, and a signed report
// names a connection with a bad token to be ended. (The relay carrying
// real connections is TestKubeRelay's.)
func TestRelayAuth(t *testing.T) {
	s := newTestServer(t)
	post := func(path string, body []byte, header string) (int, string) {
		t.Helper()
		req := httptest.NewRequest("POST", path, bytes.NewReader(body))
		req.Host = "gw.test:8080"
		req.Header.Set("Content-Type", "application/json")
		if header != "" {
			req.Header.Set(relayHeader, header)
		}
		resp, err := s.App().Test(req, 10000)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	admit, _ := json.Marshal(relayAdmitRequest{Token: "not-a-token"})
	sync, _ := json.Marshal(relaySyncRequest{Relay: "r1", Conns: []relayConnState{{ID: "c1", Token: "not-a-token"}}})
	now := time.Now()
	other := map[string][]byte{"k1": []byte(strings.Repeat("b", 32))}
	sign := func(keys map[string][]byte, at time.Time, path string, body []byte) string {
		return relaySign(keys, "k1", at, randomNonce(), path, body)
	}
	for _, c := range []struct {
		name, path string
		body       []byte
		header     string
		status     int
	}{
		{"unsigned", relayAdmitPath, admit, "", 404},
		{"another key", relayAdmitPath, admit, sign(other, now, relayAdmitPath, admit), 404},
		{"an unknown key id", relayAdmitPath, admit, "k9" + sign(s.tokens.keys, now, relayAdmitPath, admit)[2:], 404},
		{"too old", relayAdmitPath, admit, sign(s.tokens.keys, now.Add(-2*time.Minute), relayAdmitPath, admit), 404},
		{"from the future", relayAdmitPath, admit, sign(s.tokens.keys, now.Add(2*time.Minute), relayAdmitPath, admit), 404},
		{"another path", relaySyncPath, admit, sign(s.tokens.keys, now, relayAdmitPath, admit), 404},
		{"another body", relayAdmitPath, []byte(`{"token":"other"}`), sign(s.tokens.keys, now, relayAdmitPath, admit), 404},
		{"garbage", relayAdmitPath, admit, "k1 x y", 404},
		// Signed (the control): the token is what is wrong.
		{"signed, a bad token", relayAdmitPath, admit, sign(s.tokens.keys, now, relayAdmitPath, admit), 401},
		{"signed, not JSON", relayAdmitPath, []byte("{"), sign(s.tokens.keys, now, relayAdmitPath, []byte("{")), 400},
	} {
		if st, body := post(c.path, c.body, c.header); st != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, st, body, c.status)
		}
	}
	// A signed request taken once is not taken again.
	replayed := sign(s.tokens.keys, now, relayAdmitPath, admit)
	if st, body := post(relayAdmitPath, admit, replayed); st != 401 {
		t.Errorf("a signed admission, first: %d %s, want 401", st, body)
	}
	if st, body := post(relayAdmitPath, admit, replayed); st != 404 {
		t.Errorf("the same signed admission again: %d %s, want 404", st, body)
	}
	st, body := post(relaySyncPath, sync, sign(s.tokens.keys, now, relaySyncPath, sync))
	var ans relaySyncAnswer
	if err := json.Unmarshal([]byte(body), &ans); st != 200 || err != nil || len(ans.Close) != 1 || ans.Close[0].ID != "c1" {
		t.Errorf("a signed report of a connection with a bad token: %d %s, want it named to end", st, body)
	}
}
