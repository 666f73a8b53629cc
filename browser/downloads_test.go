package browser

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// chromium starts a headless Chromium of the host's for the test and
// returns its CDP address. The machine that runs `make test` has one (the
// setup installs it for the sessions' image).
func chromium(t *testing.T) netip.AddrPort {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("no chromium on this machine")
	}
	dir, err := os.MkdirTemp("", "chromium")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
		"--user-data-dir="+filepath.Join(dir, "profile"), "about:blank")
	// Its default download directory stays in the test's.
	cmd.Env = append(os.Environ(), "HOME="+dir)
	// Its own process group, so that its helpers end with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		os.RemoveAll(dir)
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		raw, err := os.ReadFile(filepath.Join(dir, "profile", "DevToolsActivePort"))
		if port, perr := strconv.Atoi(strings.SplitN(string(raw), "\n", 2)[0]); err == nil && perr == nil && port > 0 {
			return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("chromium did not start")
	return netip.AddrPort{}
}

// cdpClient is a bare CDP client on the browser target, as a client of the
// gateway's proxy is.
type cdpClient struct {
	t  *testing.T
	c  *websocket.Conn
	id int
}

func dialBrowser(t *testing.T, cdp netip.AddrPort) *cdpClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := BrowserID(ctx, cdp)
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := websocket.DefaultDialer.Dial("ws://"+cdp.String()+"/devtools/browser/"+id, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &cdpClient{t: t, c: c}
}

// send writes one raw message (its id replaced) and waits for the answer.
func (c *cdpClient) send(msg string) string {
	c.t.Helper()
	c.id++
	var m map[string]any
	if err := json.Unmarshal([]byte(msg), &m); err != nil {
		c.t.Fatal(err)
	}
	m["id"] = c.id
	raw, _ := json.Marshal(m)
	if err := c.c.WriteMessage(websocket.TextMessage, raw); err != nil {
		c.t.Fatal(err)
	}
	c.c.SetReadDeadline(time.Now().Add(15 * time.Second))
	for {
		_, data, err := c.c.ReadMessage()
		if err != nil {
			c.t.Fatal(err)
		}
		var r struct{ ID int }
		json.Unmarshal(data, &r)
		if r.ID == c.id {
			return string(data)
		}
	}
}

// proxied sends msg as the gateway's proxy does: through RewriteCommand.
func (c *cdpClient) proxied(msg, dir string) string {
	c.t.Helper()
	fwd, reply, err := RewriteCommand([]byte(msg), dir)
	if err != nil {
		c.t.Fatal(err)
	}
	if reply != nil {
		return string(reply)
	}
	return c.send(string(fwd))
}

// downloads is a watcher of the test's, with what it handed over.
type downloads struct {
	t   *testing.T
	dir string
	got chan Download
	// down: the test's store fails each finished download handed over;
	// tries counts them.
	down   atomic.Bool
	tries  atomic.Int64
	finals atomic.Int64 // tries marked Final
	stop   func()       // stops the watcher, once it has handed over what it had

	mu       sync.Mutex
	listings int
	listed   map[string]bool // every name the watcher's listings had
}

func watch(t *testing.T, cdp netip.AddrPort, limits DownloadLimits) *downloads {
	return watchKicked(t, cdp, limits, nil)
}

// watchKicked is watch with a channel that tells the watcher to set its
// behaviour again.
func watchKicked(t *testing.T, cdp netip.AddrPort, limits DownloadLimits, reassert <-chan struct{}) *downloads {
	dir, err := os.MkdirTemp("", "downloads")
	if err != nil {
		t.Fatal(err)
	}
	// Chromium may still write a late download into it.
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &downloads{t: t, dir: dir, got: make(chan Download, 100), listed: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		WatchDownloads(ctx, cdp, d.dir, limits, reassert, d.list, func(dl Download) error {
			if dl.Refused == "" && d.down.Load() {
				d.tries.Add(1)
				if dl.Final {
					d.finals.Add(1)
				}
				return errors.New("the store does not answer")
			}
			select {
			case d.got <- dl: // what it hands over as it stops too
				return nil
			default:
			}
			select {
			case d.got <- dl:
			case <-ctx.Done(): // a test that failed reads no more
			}
			return nil
		})
	}()
	var once sync.Once
	d.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(d.stop)
	return d
}

// list names what is in the watcher's directory, as the gateway's
// ListDownloads does in a session's.
func (d *downloads) list(context.Context) ([]string, error) {
	f, err := os.Open(d.dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	d.mu.Lock()
	d.listings++
	for _, n := range names {
		d.listed[n] = true
	}
	d.mu.Unlock()
	return names, err
}

// looked says how many listings the watcher made, and whether one of
// them had name.
func (d *downloads) looked(name string) (int, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.listings, d.listed[name]
}

// of waits for what the watcher hands over about the file name (kept, or
// refused with its source); what it hands over about others is skipped.
func (d *downloads) of(name string) Download {
	d.t.Helper()
	dl, ok := d.within(name, 20*time.Second)
	if !ok {
		d.t.Fatalf("the watcher handed nothing over about %s", name)
	}
	return dl
}

func (d *downloads) within(name string, limit time.Duration) (Download, bool) {
	src := "/" + strings.TrimSuffix(name, ".bin") + "?"
	timeout := time.After(limit)
	for {
		select {
		case dl := <-d.got:
			if dl.Name == name || (dl.Refused != "" && strings.Contains(dl.URL, src)) {
				return dl, true
			}
		case <-timeout:
			return Download{}, false
		}
	}
}

// files serves numbered files as attachments; start opens one in a new
// tab, which downloads it.
type files struct {
	srv *httptest.Server
	n   atomic.Int64
}

func serveFiles(t *testing.T) *files {
	f := &files{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		size, _ := strconv.Atoi(r.URL.Query().Get("size"))
		w.Header().Set("Content-Disposition", `attachment; filename="`+strings.Trim(r.URL.Path, "/")+`.bin"`)
		fmt.Fprint(w, r.URL.Path, strings.Repeat(".", size))
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *files) start(c *cdpClient, size int) string {
	c.t.Helper()
	name := fmt.Sprintf("file%d", f.n.Add(1))
	if r := c.send(`{"method":"Target.createTarget","params":{"url":"` + f.srv.URL + "/" + name + "?size=" + strconv.Itoa(size) + `"}}`); !strings.Contains(r, "targetId") {
		c.t.Fatalf("createTarget: %s", r)
	}
	return name + ".bin"
}

// ready waits until the watcher keeps downloads: it has connected and set
// its behaviour. Downloads before that are not its.
func (d *downloads) ready(c *cdpClient, f *files) {
	d.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		// One at a time, each waited for: none is left to count later.
		name := f.start(c, 0)
		if dl, ok := d.within(name, 5*time.Second); ok && dl.Refused == "" {
			d.kept(dl, name)
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatal("the watcher never kept a download")
		}
	}
}

// kept checks that dl is the named download and its file is in the
// watcher's directory under its GUID.
func (d *downloads) kept(dl Download, name string) {
	d.t.Helper()
	if dl.Refused != "" || dl.Name != name || !downloadGUID.MatchString(dl.GUID) {
		d.t.Fatalf("want %s kept, got %+v", name, dl)
	}
	if _, err := os.Stat(filepath.Join(d.dir, dl.GUID)); err != nil {
		d.t.Fatalf("%s: %v", name, err)
	}
}

// TestDownloadsKeptWhateverClientsSet, against a real Chromium: a client
// that sets its own download behaviour through the proxy's rewrite keeps
// the session's downloads in the watcher's directory; one that goes
// around it loses them, and the watcher says so (the control). When such
// a client leaves, Chromium resets the behaviour: a watcher that does not
// set it again loses the next download (the control), the watcher as
// configured keeps them.
func TestDownloadsKeptWhateverClientsSet(t *testing.T) {
	cdp := chromium(t)
	f := serveFiles(t)

	t.Run("client sets its own", func(t *testing.T) {
		d := watch(t, cdp, DownloadLimits{Reassert: time.Hour})
		c := dialBrowser(t, cdp)
		defer c.c.Close()
		d.ready(c, f) // control: the watcher's own behaviour
		elsewhere := t.TempDir()
		set := `{"id":1,"method":"Browser.setDownloadBehavior","params":{"behavior":"allowAndName","downloadPath":"` + elsewhere + `","eventsEnabled":true}}`
		if r := c.proxied(set, d.dir); !strings.Contains(r, `"result":{}`) {
			t.Fatalf("set through the proxy: %s", r)
		}
		name := f.start(c, 0)
		d.kept(d.of(name), name)
		// Around the proxy, Playwright's behaviour takes the download
		// elsewhere, and the watcher says it did not keep it.
		if r := c.send(set); !strings.Contains(r, `"result":{}`) {
			t.Fatal(r)
		}
		if dl := d.of(f.start(c, 0)); !strings.Contains(dl.Refused, "outside") || dl.GUID != "" {
			t.Fatalf("a download saved elsewhere: %+v", dl)
		}
	})

	t.Run("client leaves", func(t *testing.T) {
		// Told nothing and on a long timer (the control), on a short
		// timer, and on a long timer but told when the client left (as
		// the gateway tells it).
		for _, mode := range []string{"none", "timer", "told"} {
			// Each its own subtest, so that its watcher is gone before the
			// next sets its own behaviour.
			t.Run(mode, func(t *testing.T) { clientLeaves(t, cdp, f, mode) })
		}
	})

	t.Run("limits", func(t *testing.T) {
		d := watch(t, cdp, DownloadLimits{PerSession: 2, Bytes: 1000, Reassert: 100 * time.Millisecond})
		c := dialBrowser(t, cdp)
		defer c.c.Close()
		d.ready(c, f) // control: under both limits
		if dl := d.of(f.start(c, 5000)); !strings.Contains(dl.Refused, "over the limit of 1000 bytes") || dl.GUID != "" {
			t.Fatalf("a download over the size limit: %+v", dl)
		}
		name := f.start(c, 10)
		d.kept(d.of(name), name)
		if dl := d.of(f.start(c, 10)); !strings.Contains(dl.Refused, "over the limit of 2 downloads in a session") {
			t.Fatalf("a download over the session's count: %+v", dl)
		}
	})
}

// TestOwnConnectionsBounded: the gateway's own CDP connections take a
// screenshot from a real Chromium (the control), and give up on a browser
// that answers with a message over maxOwnMessage instead of reading it.
func TestOwnConnectionsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	png, err := Screenshot(ctx, chromium(t), 320, 200)
	if err != nil || !strings.HasPrefix(string(png), "\x89PNG") {
		t.Fatalf("screenshot from a real Chromium: %d bytes, %v", len(png), err)
	}

	var sent atomic.Int64
	up := websocket.Upgrader{}
	mux := http.NewServeMux()
	mux.HandleFunc("/json/version", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"webSocketDebuggerUrl": "ws://localhost:9222/devtools/browser/B"}`)
	})
	mux.HandleFunc("/json/list", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `[{"id": "P", "type": "page", "url": "about:blank", "webSocketDebuggerUrl": "ws://localhost:9222/devtools/page/P"}]`)
	})
	mux.HandleFunc("/devtools/browser/B", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		if _, _, err := c.ReadMessage(); err != nil {
			return
		}
		// One message of 4 x maxOwnMessage, in 1 MiB pieces.
		mw, err := c.NextWriter(websocket.TextMessage)
		if err != nil {
			return
		}
		chunk := []byte(strings.Repeat(" ", 1<<20))
		for i := 0; i < 4*maxOwnMessage>>20; i++ {
			n, err := mw.Write(chunk)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
		mw.Close()
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	hostile := netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "http://"))
	if _, err := Screenshot(ctx, hostile, 320, 200); err == nil {
		t.Fatal("a screenshot from a browser that sent an oversized message")
	}
	if n := sent.Load(); n >= 4*maxOwnMessage {
		t.Fatalf("the connection read all %d bytes", n)
	}
}

// clientLeaves: a client sets its own download behaviour and leaves, and
// the watcher is told nothing ("none", the control: a download is lost),
// sets its behaviour on a short timer ("timer") or is told ("told").
func clientLeaves(t *testing.T, cdp netip.AddrPort, f *files, mode string) {
	reassert, kick := time.Hour, make(chan struct{}, 1)
	if mode == "timer" {
		reassert = 100 * time.Millisecond
	}
	d := watchKicked(t, cdp, DownloadLimits{Reassert: reassert}, kick)
	c := dialBrowser(t, cdp)
	d.ready(c, f)
	set := `{"id":1,"method":"Browser.setDownloadBehavior","params":{"behavior":"allowAndName","downloadPath":"/tmp/x","eventsEnabled":true}}`
	c.proxied(set, d.dir)
	c.c.Close()
	c2 := dialBrowser(t, cdp)
	if mode == "told" {
		kick <- struct{}{}
	}
	if mode == "none" {
		// Wait until Chromium reset the behaviour: a download is
		// lost. Without the reset this fails.
		deadline := time.Now().Add(15 * time.Second)
		for {
			if dl := d.of(f.start(c2, 0)); dl.Refused != "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("Chromium did not reset the download behaviour when the client left")
			}
		}
	} else {
		deadline := time.Now().Add(15 * time.Second)
		for {
			name := f.start(c2, 0)
			if dl := d.of(name); dl.Refused == "" {
				d.kept(dl, name)
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("after the client left, no download was kept")
			}
		}
	}
	c2.c.Close()
}

// TestWatcherHostileBrowser: a browser that answers the watcher's first
// command with an endless message (a session's own program in
// Chromium's place) costs the gateway at most maxWatchMessage per
// connection, and is tried again less and less often: two or three
// connections in the first 8 s (pauses of 2 s and 4 s), where a pause of
// a second each time would make seven. The control: a browser that
// closes the connection as Chromium does when a client closes it, or
// as it restarts, is tried again every second (it sends downloads
// elsewhere until the watcher sets its behaviour again).
func TestWatcherHostileBrowser(t *testing.T) {
	var conns, sent atomic.Int64
	var most atomic.Int64
	up := websocket.Upgrader{}
	mux := http.NewServeMux()
	mux.HandleFunc("/json/version", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"webSocketDebuggerUrl": "ws://%s/devtools/browser/B"}`, r.Host)
	})
	var closing atomic.Bool   // the control: close after the first command
	var answering atomic.Bool // answer it first
	mux.HandleFunc("/devtools/browser/B", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		conns.Add(1)
		_, msg, err := c.ReadMessage()
		if err != nil {
			return
		}
		if answering.Load() {
			var cmd struct{ ID int64 }
			json.Unmarshal(msg, &cmd)
			c.WriteMessage(websocket.TextMessage, []byte(fmt.Sprintf(`{"id":%d,"result":{}}`, cmd.ID)))
		}
		if closing.Load() {
			c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			return
		}
		mw, err := c.NextWriter(websocket.TextMessage)
		if err != nil {
			return
		}
		chunk := []byte(strings.Repeat(" ", 1<<20))
		var n int64
		for n < 4*maxOwnMessage {
			m, err := mw.Write(chunk)
			n += int64(m)
			sent.Add(int64(m))
			if err != nil {
				break
			}
		}
		for {
			if cur := most.Load(); n <= cur || most.CompareAndSwap(cur, n) {
				break
			}
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	hostile := netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "http://"))

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	WatchDownloads(ctx, hostile, "/tmp/unused", DownloadLimits{}, nil, nil, func(Download) error { return nil })
	n := conns.Load()
	t.Logf("%d connections in 8 s, at most %d MiB sent on one", n, most.Load()>>20)
	if n < 2 || n > 3 {
		t.Errorf("%d connections in 8 s, want 2 or 3 (the control: more than one; pauses that grow: not more)", n)
	}
	// What the server wrote before the watcher gave up: the bound, and
	// what the sockets may buffer on the way (the server's send buffer,
	// the watcher's receive buffer, which loopback grows up to the
	// kernel's most: 32 MiB on some machines). Unbounded, the watcher
	// would read all of the server's 256 MiB.
	if m, buffered := most.Load(), tcpBufferMost(); m > maxWatchMessage+buffered {
		t.Errorf("the watcher read %d MiB of one message, past its bound of %d MiB and the sockets' %d MiB", m>>20, maxWatchMessage>>20, buffered>>20)
	}

	closing.Store(true)
	conns.Store(0)
	// (Pauses that grew would make at most 3 in 6 s: at 0, 2 and 6 s.)
	ctx, cancel = context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	WatchDownloads(ctx, hostile, "/tmp/unused", DownloadLimits{}, nil, nil, func(Download) error { return nil })
	if n := conns.Load(); n < 4 {
		t.Errorf("a browser that closes the connection: %d connections in 6 s, want one about every second", n)
	}

	// One that takes the download behaviour and then closes: the
	// watcher looks in the directory after the first connection (the
	// control) and as it stops, not after each of the others.
	answering.Store(true)
	conns.Store(0)
	var lists atomic.Int64
	var firstList atomic.Int64 // ns after the start
	start := time.Now()
	list := func(context.Context) ([]string, error) {
		if lists.Add(1) == 1 {
			firstList.Store(int64(time.Since(start)))
		}
		return nil, nil
	}
	ctx, cancel = context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	WatchDownloads(ctx, hostile, "/tmp/unused", DownloadLimits{}, nil, list, func(Download) error { return nil })
	first := time.Duration(firstList.Load())
	t.Logf("a browser that takes the behaviour and closes: %d connections, %d listings in 6 s, the first after %v", conns.Load(), lists.Load(), first)
	if n, l := conns.Load(), lists.Load(); n < 3 || l < 1 || l > 2 || first > 3*time.Second {
		t.Errorf("a browser that takes the behaviour and closes: %d connections and %d listings in 6 s, the first after %v; want 3 or more, 1 or 2, and the first on the first connection", n, l, first)
	}
}

// relay forwards TCP connections to a browser, as the path from the
// gateway to a session does; the test can cut them and hold new ones off.
type relay struct {
	addr  netip.AddrPort
	mu    sync.Mutex
	held  bool
	conns []net.Conn
}

func newRelay(t *testing.T, to netip.AddrPort) *relay {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{addr: netip.MustParseAddrPort(ln.Addr().String())}
	t.Cleanup(func() { ln.Close(); r.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			held := r.held
			r.mu.Unlock()
			if held {
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", to.String())
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, c, u)
			r.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	return r
}

// cut ends every connection through the relay.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
}

func (r *relay) hold(on bool) {
	r.mu.Lock()
	r.held = on
	r.mu.Unlock()
}

// TestWatcherFindsMissedDownloads, against a real Chromium: Chromium
// reports a download's end only on the connection it began on. A
// download that ends while the watcher's connection is lost is found in
// the directory once the watcher is connected again, and one still being
// written then is found once it is done, and one that ends while the
// connection is lost is found as the watcher stops; each is handed over
// once, and none that the watcher saw end (the control, through the
// browser's report) is handed over again.
func TestWatcherFindsMissedDownloads(t *testing.T) {
	cdp := chromium(t)
	f := serveFiles(t)
	release := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{}), "c": make(chan struct{})}
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.Trim(r.URL.Path, "/")
		w.Header().Set("Content-Disposition", `attachment; filename="`+name+`.bin"`)
		w.Header().Set("Content-Length", "20480")
		w.Write(bytes.Repeat([]byte(name), 10240))
		w.(http.Flusher).Flush()
		select {
		case <-release[name]:
		case <-r.Context().Done():
			return
		}
		w.Write(bytes.Repeat([]byte(name), 10240))
	}))
	defer slow.Close()
	rl := newRelay(t, cdp)
	d := watchKicked(t, rl.addr, DownloadLimits{Reassert: 200 * time.Millisecond, SweepEvery: 100 * time.Millisecond}, nil)
	c := dialBrowser(t, cdp)
	defer c.c.Close()
	d.ready(c, f) // the control: reported, handed over, its file there
	seen := map[string]int{}
	files := func() (done, writing []string) {
		entries, _ := os.ReadDir(d.dir)
		for _, e := range entries {
			if g, ok := strings.CutSuffix(e.Name(), ".crdownload"); ok {
				writing = append(writing, g)
			} else {
				done = append(done, e.Name())
			}
		}
		return done, writing
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("waited 30s for %s", what)
			}
		}
	}
	// found waits for the watcher to hand over the download saved as
	// guid, noting all it hands over.
	found := func(guid string) {
		t.Helper()
		timeout := time.After(20 * time.Second)
		for {
			select {
			case dl := <-d.got:
				seen[dl.GUID]++
				if dl.GUID != guid {
					continue
				}
				if !dl.Found || dl.URL != "" || dl.Refused != "" {
					t.Fatalf("the missed download handed over as %+v", dl)
				}
				raw, err := os.ReadFile(filepath.Join(d.dir, guid))
				if err != nil || len(raw) != 20480 {
					t.Fatalf("its file: %d bytes, %v", len(raw), err)
				}
				return
			case <-timeout:
				done, writing := files()
				t.Fatalf("the download saved as %s was not handed over (files %v, writing %v; handed over %v)", guid, done, writing, seen)
			}
		}
	}
	// begin starts the slow download of name and returns its GUID once
	// it is being written.
	begin := func(name string) string {
		t.Helper()
		if r := c.send(`{"method":"Target.createTarget","params":{"url":"` + slow.URL + "/" + name + `"}}`); !strings.Contains(r, "targetId") {
			t.Fatal(r)
		}
		var guid string
		waitFor("a download being written", func() bool {
			_, w := files()
			if len(w) == 1 {
				guid = w[0]
			}
			return guid != ""
		})
		return guid
	}

	// a ends while the watcher has no connection.
	a := begin("a")
	rl.hold(true)
	rl.cut()
	close(release["a"])
	waitFor("a written", func() bool { _, w := files(); return len(w) == 0 })
	select {
	case dl := <-d.got:
		t.Fatalf("handed over with no connection: %+v", dl)
	case <-time.After(time.Second):
	}
	rl.hold(false)
	found(a)

	// b is still being written when the watcher is connected again:
	// seen being written by a look after the connection came back.
	b := begin("b")
	before, _ := d.looked("")
	rl.cut() // the watcher connects again a second later
	waitFor("b seen being written", func() bool {
		n, saw := d.looked(b + ".crdownload")
		return n > before && saw
	})
	close(release["b"])
	found(b)

	// Nothing is handed over twice, though the watcher looks again.
	before, _ = d.looked("")
	rl.cut()
	waitFor("another look", func() bool { n, _ := d.looked(""); return n > before })
	timeout := time.After(time.Second)
	for done := false; !done; {
		select {
		case dl := <-d.got:
			seen[dl.GUID]++
		case <-timeout:
			done = true
		}
	}

	// c ends while the connection is lost, and the watcher stops before
	// it is back: found as it stops.
	cg := begin("c")
	rl.hold(true)
	rl.cut()
	close(release["c"])
	waitFor("c written", func() bool { _, w := files(); return len(w) == 0 })
	d.stop()
	found(cg)
	for guid, n := range seen {
		if n > 1 {
			t.Errorf("%s handed over %d times", guid, n)
		}
	}
}

// TestWatcherRetriesFailedStores, against a real Chromium: a finished
// download that could not be stored is handed over again until it is,
// once; one stored at once (the control) is handed over once, with no
// Retry. One still not stored as the watcher stops is tried a last time.
func TestWatcherRetriesFailedStores(t *testing.T) {
	cdp := chromium(t)
	f := serveFiles(t)
	d := watch(t, cdp, DownloadLimits{Reassert: 100 * time.Millisecond})
	c := dialBrowser(t, cdp)
	defer c.c.Close()
	d.ready(c, f)
	name := f.start(c, 0)
	if dl := d.of(name); dl.Retry {
		t.Fatalf("stored at once, handed over as %+v", dl)
	}
	d.down.Store(true)
	name = f.start(c, 0)
	deadline := time.Now().Add(20 * time.Second)
	for d.tries.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("handed over %d times in 20 s with the store down, want 3 or more", d.tries.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.down.Store(false)
	dl := d.of(name)
	d.kept(dl, name)
	if !dl.Retry {
		t.Fatalf("handed over again as %+v, want Retry", dl)
	}
	select {
	case dl := <-d.got:
		t.Fatalf("handed over again once stored: %+v", dl)
	case <-time.After(time.Second):
	}

	// The store down as the watcher stops: one last try, said to be the
	// last, and none before it was.
	d.down.Store(true)
	d.tries.Store(0)
	f.start(c, 0)
	for deadline := time.Now().Add(20 * time.Second); d.tries.Load() < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not handed over twice in 20 s with the store down")
		}
	}
	if n := d.finals.Load(); n != 0 {
		t.Fatalf("%d tries said to be the last before the stop", n)
	}
	d.stop()
	if n := d.finals.Load(); n != 1 {
		t.Fatalf("%d tries said to be the last as the watcher stopped, want 1", n)
	}
}

// tcpBufferMost is the most a TCP connection's sockets may buffer, one
// way: the kernel's largest receive buffer and largest send buffer
// (16 MiB if the kernel does not say).
func tcpBufferMost() int64 {
	var most int64
	for _, f := range []string{"/proc/sys/net/ipv4/tcp_rmem", "/proc/sys/net/ipv4/tcp_wmem"} {
		raw, err := os.ReadFile(f)
		fields := strings.Fields(string(raw))
		if err != nil || len(fields) != 3 {
			return 16 << 20
		}
		n, err := strconv.ParseInt(fields[2], 10, 64)
		if err != nil {
			return 16 << 20
		}
		most += n
	}
	return most
}
