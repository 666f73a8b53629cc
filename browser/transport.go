package browser

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chromedp/cdproto"
	jsonv2 "github.com/chromedp/cdproto/cdp/jsonv2"
	"github.com/chromedp/chromedp"
	"github.com/gorilla/websocket"
)

// maxOwnMessage bounds one message on the gateway's own CDP connections to
// a session's Chromium (screenshots, credential fill, the download
// watcher). The largest is a screenshot: a PNG of the session's screen,
// base64-encoded, far below this for any screen the gateway allows.
const maxOwnMessage = 64 << 20

// allocator is a chromedp allocator on the session's browser for the
// gateway's own connections: to the browser address built from a checked
// id, over a WebSocket whose messages are bounded by limit
// (maxOwnMessage, or less).
func allocator(ctx context.Context, cdp netip.AddrPort, limit int64) (context.Context, context.CancelFunc, error) {
	actx, cancel, _, err := allocatorOf(ctx, cdp, limit)
	return actx, cancel, err
}

// allocatorOf is allocator, with the allocator itself: it tells whether
// the browser broke the protocol (Abused).
func allocatorOf(ctx context.Context, cdp netip.AddrPort, limit int64) (context.Context, context.CancelFunc, *ownAllocator, error) {
	ws, err := browserWSURL(ctx, cdp)
	if err != nil {
		return nil, nil, nil, err
	}
	a := &ownAllocator{wsURL: ws, limit: limit}
	actx, cancel := chromedp.NewAllocatorContext(ctx, a)
	return actx, cancel, a, nil
}

// ownAllocator attaches to a running browser, as chromedp's remote
// allocator does, with a bounded transport.
type ownAllocator struct {
	wsURL string
	limit int64 // of one message
	wg    sync.WaitGroup
	// abused: the browser sent a message over the limit, or one that is
	// not CDP's JSON (a session's own program in Chromium's place).
	abused atomic.Bool
}

// Abused says whether the browser broke the protocol on a connection
// of this allocator.
func (a *ownAllocator) Abused() bool { return a.abused.Load() }

var (
	_ chromedp.Allocator = (*ownAllocator)(nil)
	_ chromedp.Transport = (*transport)(nil)
)

// Allocate dials the browser. The connection outlives ctx's pages: it
// closes after chromedp has closed them.
func (a *ownAllocator) Allocate(ctx context.Context, opts ...chromedp.BrowserOption) (*chromedp.Browser, error) {
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second, ReadBufferSize: 64 << 10, WriteBufferSize: 64 << 10}
	dctx, cancelDial := context.WithTimeout(ctx, 10*time.Second)
	ws, resp, err := d.DialContext(dctx, a.wsURL, nil)
	cancelDial()
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(a.limit)
	wctx, cancel := context.WithCancel(context.Background())
	a.wg.Go(func() {
		<-ctx.Done()
		chromedp.Cancel(ctx)
		cancel()
	})
	return chromedp.NewBrowserTransport(wctx, &transport{ws: ws, abused: &a.abused}, opts...)
}

// Wait waits until the connections are closed.
func (a *ownAllocator) Wait() { a.wg.Wait() }

// Attaches tells chromedp that the browser runs already: cancelling
// closes the connection, never the browser.
func (a *ownAllocator) Attaches() bool { return true }

// transport is a chromedp.Transport over a WebSocket with a read limit.
type transport struct {
	ws     *websocket.Conn
	mu     sync.Mutex   // one writer at a time
	abused *atomic.Bool // set when the browser breaks the protocol
}

func (t *transport) Read(_ context.Context, msg *cdproto.Message) error {
	_, data, err := t.ws.ReadMessage()
	if errors.Is(err, websocket.ErrReadLimit) {
		t.abused.Store(true)
	}
	if err != nil {
		return err
	}
	if err := jsonv2.Unmarshal(data, msg, chromedp.DefaultUnmarshalOptions); err != nil {
		t.abused.Store(true)
		return err
	}
	return nil
}

func (t *transport) Write(_ context.Context, msg *cdproto.Message) error {
	data, err := jsonv2.Marshal(msg, chromedp.DefaultMarshalOptions)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ws.WriteMessage(websocket.TextMessage, data)
}

func (t *transport) Close() error { return t.ws.Close() }
