package browser

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ErrCommand is the class of a client's CDP message that the gateway must
// read and cannot: the proxy closes that client's connection.
var ErrCommand = errors.New("cdp: a client message the gateway cannot read")

// maxNesting bounds Target.sendMessageToTarget inside one another.
const maxNesting = 4

// RewriteCommand takes one message a client sends to the session's Chromium
// through the gateway's CDP proxy, and keeps the session's downloads in
// dir, where the gateway's download watcher stores them from.
// Browser.setDownloadBehavior and Page.setDownloadBehavior (also inside
// Target.sendMessageToTarget) are rewritten:
//
//   - allow, allowAndName, default (and anything else but deny) become
//     allowAndName into dir: files are named by their GUID inside the
//     session, the artifact keeps the name the site suggested. The client's
//     browserContextId and eventsEnabled are kept, so Playwright still gets
//     its download events.
//   - deny passes for a browser context a client created; in the default
//     context (or through Page.setDownloadBehavior, whose context the
//     gateway cannot tell) it is answered with an error and not forwarded:
//     the gateway keeps the default context's downloads.
//
// It returns the message to forward (msg itself when nothing changes) or a
// reply to send back to the client instead. Messages are only parsed when
// they could name the command, and then with exact keys and no duplicate:
// what the gateway reads is what Chromium reads.
//
// This keeps unmodified clients' downloads; it is not a boundary. A session
// runs its own code, which can reach Chromium without the proxy.
func RewriteCommand(msg []byte, dir string) (forward, reply []byte, err error) {
	fwd, refuse, id, sid, err := rewriteCommand(msg, dir, 0)
	if err != nil {
		return nil, nil, err
	}
	if refuse != "" {
		if id == nil {
			return nil, nil, fmt.Errorf("%w: a refused command without an id", ErrCommand)
		}
		return nil, errorReply(id, sid, refuse), nil
	}
	return fwd, nil, nil
}

// mayName tells whether msg could carry the command. Its name has only
// letters, which JSON can write otherwise only as \u escapes.
func mayName(msg []byte) bool {
	return bytes.Contains(msg, []byte("DownloadBehavior")) || bytes.Contains(msg, []byte(`\u`))
}

func rewriteCommand(msg []byte, dir string, depth int) (fwd []byte, refuse string, id, sid json.RawMessage, err error) {
	if !mayName(msg) {
		return msg, "", nil, nil, nil
	}
	ms, err := members(msg)
	if err != nil {
		return nil, "", nil, nil, fmt.Errorf("%w: %v", ErrCommand, err)
	}
	var method string
	var params json.RawMessage
	pi := -1
	for i, m := range ms {
		switch m.key {
		case "method":
			if err := json.Unmarshal(m.raw, &method); err != nil {
				return nil, "", nil, nil, fmt.Errorf("%w: method: %v", ErrCommand, err)
			}
		case "id":
			id = m.raw
		case "sessionId":
			sid = m.raw
		case "params":
			pi, params = i, m.raw
		}
	}
	var np json.RawMessage
	switch method {
	case "Browser.setDownloadBehavior", "Page.setDownloadBehavior":
		np, refuse, err = downloadParams(method, params, dir)
	case "Target.sendMessageToTarget":
		np, refuse, err = nestedParams(params, dir, depth)
	default:
		return msg, "", id, sid, nil
	}
	if err != nil || refuse != "" {
		return nil, refuse, id, sid, err
	}
	if np == nil {
		return msg, "", id, sid, nil
	}
	if pi < 0 {
		ms = append(ms, member{key: "params"})
		pi = len(ms) - 1
	}
	ms[pi].raw = np
	return object(ms), "", id, sid, nil
}

// downloadBehavior is the parameters of Browser.setDownloadBehavior (Page's
// have behavior and downloadPath only).
type downloadBehavior struct {
	Behavior         string  `json:"behavior"`
	BrowserContextID *string `json:"browserContextId,omitempty"`
	DownloadPath     *string `json:"downloadPath,omitempty"`
	EventsEnabled    *bool   `json:"eventsEnabled,omitempty"`
}

// downloadParams rewrites the parameters of a set-download-behaviour
// command; they are rebuilt from the fields Chromium reads, so they say
// only what the gateway read.
func downloadParams(method string, params json.RawMessage, dir string) (json.RawMessage, string, error) {
	var p downloadBehavior
	if params != nil {
		if err := json.Unmarshal(params, &p); err != nil {
			return nil, "", fmt.Errorf("%w: %s params: %v", ErrCommand, method, err)
		}
	}
	page := method == "Page.setDownloadBehavior"
	out := downloadBehavior{Behavior: "allowAndName", BrowserContextID: p.BrowserContextID, DownloadPath: &dir, EventsEnabled: p.EventsEnabled}
	if p.Behavior == "deny" {
		if page || p.BrowserContextID == nil {
			return nil, "sandgate keeps the downloads of the session's default browser context: deny them with Browser.setDownloadBehavior in a browser context of your own", nil
		}
		out.DownloadPath = nil
		out.Behavior = "deny"
	}
	if page {
		out.BrowserContextID, out.EventsEnabled = nil, nil
	}
	b, err := json.Marshal(out)
	return b, "", err
}

// nestedParams rewrites the message inside Target.sendMessageToTarget.
func nestedParams(params json.RawMessage, dir string, depth int) (json.RawMessage, string, error) {
	if params == nil {
		return nil, "", nil
	}
	if depth >= maxNesting {
		return nil, "", fmt.Errorf("%w: Target.sendMessageToTarget nested more than %d deep", ErrCommand, maxNesting)
	}
	ms, err := members(params)
	if err != nil {
		return nil, "", fmt.Errorf("%w: Target.sendMessageToTarget params: %v", ErrCommand, err)
	}
	for i, m := range ms {
		if m.key != "message" {
			continue
		}
		var inner string
		if err := json.Unmarshal(m.raw, &inner); err != nil {
			return nil, "", fmt.Errorf("%w: Target.sendMessageToTarget message: %v", ErrCommand, err)
		}
		fwd, refuse, _, _, err := rewriteCommand([]byte(inner), dir, depth+1)
		if err != nil || refuse != "" {
			return nil, refuse, err
		}
		if string(fwd) == inner {
			return nil, "", nil
		}
		raw, err := json.Marshal(string(fwd))
		if err != nil {
			return nil, "", err
		}
		ms[i].raw = raw
		return object(ms), "", nil
	}
	return nil, "", nil
}

type member struct {
	key string
	raw json.RawMessage
}

// members reads a JSON object's members in order, with exact keys:
// a key twice (however it is escaped), anything but one object, or
// anything after it is an error.
func members(raw []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	var ms []member
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, ok := tok.(string)
		if !ok {
			return nil, errors.New("not a JSON object")
		}
		if seen[k] {
			return nil, fmt.Errorf("the key %.40q twice", k)
		}
		seen[k] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		ms = append(ms, member{key: k, raw: v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON object")
	}
	return ms, nil
}

// object writes members back as one JSON object.
func object(ms []member) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(m.key)
		b.Write(k)
		b.WriteByte(':')
		b.Write(m.raw)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// errorReply is Chromium's form of a failed command's answer.
func errorReply(id, sid json.RawMessage, msg string) []byte {
	type cdpError struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		ID        json.RawMessage `json:"id"`
		Error     cdpError        `json:"error"`
		SessionID json.RawMessage `json:"sessionId,omitempty"`
	}{id, cdpError{-32000, msg}, sid})
	return b
}
