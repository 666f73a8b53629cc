package browser

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"
)

// Download is a file Chromium finished downloading: saved under its GUID
// in the session's download directory. Refused is set instead when the
// watcher did not keep one or more downloads; GUID is then empty, so
// there is nothing to open.
type Download struct {
	GUID    string
	URL     string // the source, cut to maxURLBytes
	Name    string // the name the site suggested, cut to maxNameBytes
	Refused string // why downloads were not kept, with how many
	// Found: the watcher did not see this one finish (its connection was
	// lost, or it was not running) and found its file in the directory
	// instead; URL and Name are then unknown.
	Found bool
	// Retry: handed over before, and not stored then. Final: the last
	// try (the watcher is stopping, or has tried for limits.Stale).
	Retry, Final bool
	failedAt     time.Time
}

// DownloadLimits bound what the watcher takes from a session; a zero
// field takes its default.
type DownloadLimits struct {
	// Pending bounds the downloads begun and not yet handed over (16);
	// more at once are cancelled in Chromium.
	Pending int
	// PerSession bounds the downloads handed over from one session
	// (1000); later ones are cancelled.
	PerSession int
	// Bytes bounds one download as Chromium counts it (512 MiB); a larger
	// one is cancelled. The workspace the file lands in is bounded too.
	Bytes int64
	// Reassert is how often the watcher sets its download behaviour
	// again (30 s) besides when it is told to: Chromium resets a context
	// to its default behaviour when a client that set it disconnects.
	// The gateway tells the watcher whenever a client of its CDP proxy
	// leaves; the timer is for clients inside the session.
	Reassert time.Duration
	// Stale is how long a begun download may go without finishing before
	// the watcher cancels it and frees its place (1 h), and how long one
	// that could not be stored is tried again.
	Stale time.Duration
	// SweepEvery is the least time between two looks in the download
	// directory while the watcher runs (10 s): a session that breaks the
	// watcher's connection again and again costs the gateway a listing
	// (an exec, under Kubernetes) at most that often.
	SweepEvery time.Duration
}

// DefaultDownloadBytes bounds one download when DownloadLimits sets none.
const DefaultDownloadBytes = 512 << 20

// DefaultReassert is DownloadLimits.Reassert when it is not set: long
// enough that an idle session's watcher costs nothing.
const DefaultReassert = 30 * time.Second

// reassertAgain is when the watcher sets its behaviour a second time
// after it was told a client left.
const reassertAgain = time.Second

func (l DownloadLimits) withDefaults() DownloadLimits {
	if l.Pending <= 0 {
		l.Pending = 16
	}
	if l.PerSession <= 0 {
		l.PerSession = 1000
	}
	if l.Bytes <= 0 {
		l.Bytes = DefaultDownloadBytes
	}
	if l.Reassert <= 0 {
		l.Reassert = DefaultReassert
	}
	if l.Stale <= 0 {
		l.Stale = time.Hour
	}
	if l.SweepEvery <= 0 {
		l.SweepEvery = 10 * time.Second
	}
	return l
}

const (
	maxURLBytes  = 2048
	maxNameBytes = 255
)

// downloadGUID is what Chromium's download GUIDs look like (a UUID); the
// GUID becomes a file name, so nothing else is accepted.
var downloadGUID = regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)

// cut shortens s to at most n bytes on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// WatchDownloads holds a browser-level CDP connection of the gateway's own
// to the session's Chromium: it sends downloads to dir (a path inside the
// session), named by their GUID so no name a site suggests can point
// elsewhere, and calls done for each finished one, and for the ones it
// refused. It reconnects when Chromium restarts and returns when ctx ends,
// handing over first what had finished by then.
//
// Clients that set their own download behaviour over the gateway's CDP
// proxy keep dir (RewriteCommand), and the watcher sets its behaviour
// again whenever reassert receives and every limits.Reassert, because
// Chromium resets it to the default when such a client disconnects.
//
// Chromium reports a download's end only on the connection it began on,
// so a download that finished while the watcher had no connection (it
// was lost, the gateway restarted) is never reported. list names what is
// in dir: the watcher looks there when it connects after such a gap, and
// when it stops after one, and hands over each file named as a download
// it did not hand over (Found). One still being written (GUID.crdownload)
// is looked for again every limits.Reassert until it is done, for at
// most limits.Stale. The files are the session's: what list returns is
// bounded by the caller, and the watcher's limits hold for what it finds.
//
// done returns an error for a finished download it could not store for
// now (the store did not answer): that one is handed over again, with
// Retry set, every limits.Reassert for limits.Stale, and once more as
// the watcher stops, with Final set then. Tries again run beside the
// connection's work: done may be called from two goroutines at once.
func WatchDownloads(ctx context.Context, cdp netip.AddrPort, dir string, limits DownloadLimits, reassert <-chan struct{}, list func(context.Context) ([]string, error), done func(Download) error) {
	w := &watcher{dir: dir, limits: limits.withDefaults(), done: done, list: list, begun: map[string]begun{},
		handedOver: map[string]bool{}, skip: map[string]bool{}, orphans: map[string]time.Time{}, gap: true}
	// Failed stores are tried again apart from the connection, which a
	// session can break as often as it likes.
	retried := make(chan struct{})
	go func() {
		defer close(retried)
		tick := time.NewTicker(w.limits.Reassert)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				w.retryFailed(false)
			}
		}
	}()
	defer func() {
		<-retried
		w.mu.Lock()
		if len(w.begun) > 0 {
			// One may have finished with its report not read: looked
			// for in the directory.
			w.gap, w.begun = true, map[string]begun{}
		}
		w.mu.Unlock()
		// What finished in a gap before the stop: the session is still
		// there (its teardown waits for the watcher).
		if w.needSweep(true) {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sweepTimeout)
			w.sweep(sctx)
			cancel()
		}
		w.deliver(w.take(time.Now()))
		w.retryFailed(true)
	}()
	backoff := time.Second
	for ctx.Err() == nil {
		began := time.Now()
		abused, _ := w.watchOnce(ctx, cdp, reassert)
		if ctx.Err() == nil {
			w.mu.Lock()
			w.gap = true // what ends until the next connection is not reported
			// Downloads begun on the lost connection report nothing
			// more: found in the directory.
			w.begun = map[string]begun{}
			w.mu.Unlock()
		}
		// A browser that is not up, restarting, or closed by a client,
		// is asked again a second later: it sends downloads elsewhere
		// until the watcher sets its behaviour again. One that broke
		// the protocol (a session's own program in Chromium's place,
		// sending junk) is asked less and less often: each try costs
		// the gateway a message's worth. The pause comes down only
		// after a connection that lasted with no such break.
		pause := time.Second
		switch {
		case abused:
			backoff = min(2*backoff, watchBackoff)
			pause = backoff
		case time.Since(began) > watchSteady:
			backoff = time.Second
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
}

// A watcher's connection on which the browser broke the protocol
// doubles the pause before the next, up to watchBackoff; one that
// lasted watchSteady with no break brings it back to a second.
const (
	watchSteady  = 10 * time.Second
	watchBackoff = 30 * time.Second
)

// maxWatchMessage bounds one message on the watcher's connection: its
// events (a download's begin, with its URL; its progress) and answers
// are small, and a browser that sends more (a session's own program in
// Chromium's place) costs the gateway no more than this per try.
const maxWatchMessage = 8 << 20

// sweepTimeout bounds one look into the download directory.
const sweepTimeout = 30 * time.Second

// watcher is the state of one session's download watcher. kept counts
// across reconnections.
type watcher struct {
	dir    string
	limits DownloadLimits
	done   func(Download) error
	list   func(context.Context) ([]string, error)

	mu       sync.Mutex
	kept     int
	begun    map[string]begun
	queued   int // finished, handed over or about to be
	finished []Download
	refused  map[string]int // reason: how many
	refURL   string         // a source of a refused download
	cancels  []string
	// handedOver holds the GUIDs of the downloads handed over as
	// finished (at most limits.PerSession), so that none is found again.
	handedOver map[string]bool
	// skip holds GUIDs refused or given up (at most maxSkip): their
	// files, if any, are not found as downloads, nor refused again.
	skip map[string]bool
	// orphans are downloads being written that the watcher has no
	// report of (begun in a gap), by when they were first seen.
	orphans map[string]time.Time
	// gap: the watcher may have missed a download's end since it last
	// looked in the directory (a new watcher, or a lost connection).
	gap   bool
	swept time.Time // when the watcher last looked
	// failed are finished downloads done could not store yet (at most
	// limits.PerSession: each is counted as kept).
	failed []Download
}

type begun struct {
	d     Download
	since time.Time
}

// maxSkip bounds the GUIDs a watcher remembers it refused.
const maxSkip = 8192

// refuse notes a refused download and, when guid is one, that Chromium
// must cancel it. w.mu is held.
func (w *watcher) refuse(reason, guid, url string) {
	w.skipGUID(guid)
	if w.refused == nil {
		w.refused = map[string]int{}
	}
	w.refused[reason]++
	if w.refURL == "" {
		w.refURL = url
	}
	if guid != "" {
		w.cancels = append(w.cancels, guid)
	}
}

// skipGUID remembers a refused download's GUID; w.mu is held.
func (w *watcher) skipGUID(guid string) {
	if guid != "" && len(w.skip) < maxSkip {
		w.skip[guid] = true
	}
}

// event takes one event of Chromium's. It runs in chromedp's event loop,
// so it only updates bounded state.
func (w *watcher) event(ev any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch e := ev.(type) {
	case *cdpbrowser.EventDownloadWillBegin:
		url := cut(e.URL, maxURLBytes)
		switch {
		case !downloadGUID.MatchString(e.GUID):
			w.refuse("the browser gave a download id the gateway refuses", "", url)
		case w.begun[e.GUID].d.GUID != "", w.handedOver[e.GUID]:
			// Known already (found in the directory before this report).
		case w.kept+len(w.begun)+w.queued >= w.limits.PerSession:
			w.refuse(fmt.Sprintf("over the limit of %d downloads in a session", w.limits.PerSession), e.GUID, url)
		case len(w.begun)+w.queued >= w.limits.Pending:
			w.refuse(fmt.Sprintf("over the limit of %d downloads at a time", w.limits.Pending), e.GUID, url)
		default:
			w.begun[e.GUID] = begun{d: Download{GUID: e.GUID, URL: url, Name: cut(e.SuggestedFilename, maxNameBytes)}, since: time.Now()}
		}
	case *cdpbrowser.EventDownloadProgress:
		b, ok := w.begun[e.GUID]
		if !ok {
			return
		}
		switch {
		case e.TotalBytes > float64(w.limits.Bytes) || e.ReceivedBytes > float64(w.limits.Bytes):
			delete(w.begun, e.GUID)
			w.refuse(fmt.Sprintf("over the limit of %d bytes a download", w.limits.Bytes), e.GUID, b.d.URL)
		case e.State == cdpbrowser.DownloadProgressStateCompleted && e.FilePath != "" && e.FilePath != w.dir+"/"+e.GUID:
			// Chromium saved it where the gateway does not look: someone
			// set the behaviour around the gateway's proxy.
			delete(w.begun, e.GUID)
			w.refuse("saved outside the session's download directory", "", b.d.URL)
		case e.State == cdpbrowser.DownloadProgressStateCompleted:
			delete(w.begun, e.GUID)
			w.finished = append(w.finished, b.d)
			w.queued++
			w.handedOver[e.GUID] = true
		case e.State == cdpbrowser.DownloadProgressStateCanceled:
			delete(w.begun, e.GUID)
		}
	}
}

// take empties what the loop must act on.
func (w *watcher) take(now time.Time) (finished []Download, refused []Download, cancels []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for guid, b := range w.begun {
		if now.Sub(b.since) > w.limits.Stale {
			delete(w.begun, guid)
			w.refuse(fmt.Sprintf("unfinished after %s", w.limits.Stale), guid, b.d.URL)
		}
	}
	finished, w.finished = w.finished, nil
	cancels, w.cancels = w.cancels, nil
	reasons := make([]string, 0, len(w.refused))
	for r := range w.refused {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		refused = append(refused, Download{URL: w.refURL, Refused: fmt.Sprintf("%d download(s) not kept: %s", w.refused[r], r)})
	}
	w.refused, w.refURL = nil, ""
	return finished, refused, cancels
}

func (w *watcher) handed(n int) {
	w.mu.Lock()
	w.queued -= n
	w.kept += n
	w.mu.Unlock()
}

// watchOnce holds one connection until it is lost or ctx ends; abused
// says the browser broke the protocol on it.
func (w *watcher) watchOnce(ctx context.Context, cdp netip.AddrPort, reassert <-chan struct{}) (abused bool, err error) {
	actx, cancel, own, err := allocatorOf(ctx, cdp, maxWatchMessage)
	if err != nil {
		return false, err
	}
	defer func() { abused = own.Abused() }()
	defer cancel()
	cctx, cancel2 := chromedp.NewContext(actx)
	defer cancel2()
	wake := make(chan struct{}, 1)
	if err := chromedp.ListenBrowser(cctx, func(ev any) {
		w.event(ev)
		select {
		case wake <- struct{}{}:
		default:
		}
	}); err != nil {
		return false, err
	}
	yes := true
	set := func() error {
		_, err := chromedp.CallBrowser(cctx, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
			Behavior: cdpbrowser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: w.dir, EventsEnabled: &yes,
		})
		if err != nil {
			return fmt.Errorf("set download behaviour: %w", err)
		}
		return nil
	}
	if err := set(); err != nil {
		return false, err
	}
	// Downloads that ended while there was no connection: the behaviour
	// is set, so what begins from now on is reported.
	if w.needSweep(false) {
		w.sweep(ctx)
		select { // hand over what it found
		case wake <- struct{}{}:
		default: // woken already
		}
	}
	tick := time.NewTicker(w.limits.Reassert)
	defer tick.Stop()
	again := time.NewTimer(time.Hour)
	again.Stop()
	defer again.Stop()
	// The context ends when the connection to Chromium is lost.
	lost := cctx.Done()
	for {
		select {
		case <-wake:
		case <-tick.C:
			if err := set(); err != nil {
				return false, err
			}
			if w.needSweep(false) { // downloads begun in a gap, still being written
				w.sweep(ctx)
			}
		case <-reassert:
			// Chromium resets the behaviour when it has handled the
			// client's leaving, which may be after this: again a little
			// later.
			if err := set(); err != nil {
				return false, err
			}
			again.Reset(reassertAgain)
		case <-again.C:
			if err := set(); err != nil {
				return false, err
			}
		case <-lost:
			w.deliver(w.take(time.Now())) // what finished before the loss
			return false, nil
		case <-ctx.Done():
			w.deliver(w.take(time.Now()))
			return false, nil
		}
		finished, refused, cancels := w.take(time.Now())
		for _, guid := range cancels {
			chromedp.CallBrowser(cctx, cdpbrowser.CancelDownload, cdpbrowser.CancelDownloadParams{GUID: guid})
		}
		w.deliver(finished, refused, nil)
	}
}

// needSweep says whether the watcher must look in the directory: it may
// have missed a download's end, or one begun in a gap is being written.
// Not more often than limits.SweepEvery, unless the watcher is stopping.
func (w *watcher) needSweep(stopping bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.list != nil && (w.gap || len(w.orphans) > 0) && (stopping || time.Since(w.swept) >= w.limits.SweepEvery)
}

// partSuffix is what Chromium adds to a download's name while it writes
// it; the file is renamed to its GUID when it is complete.
const partSuffix = ".crdownload"

// sweep looks in the directory for downloads the watcher did not see
// end, and queues each it finds (Found). It clears the gap only when
// the look succeeded.
func (w *watcher) sweep(ctx context.Context) {
	w.mu.Lock()
	w.swept = time.Now()
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, sweepTimeout)
	defer cancel()
	names, err := w.list(ctx)
	if err != nil {
		return // looked for again at the next chance
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gap = false
	writing := map[string]bool{}
	for _, name := range names {
		if guid, part := strings.CutSuffix(name, partSuffix); part {
			writing[guid] = true
		}
	}
	for _, name := range names {
		guid, _ := strings.CutSuffix(name, partSuffix)
		if !downloadGUID.MatchString(guid) || w.handedOver[guid] || w.skip[guid] || w.begun[guid].d.GUID != "" {
			continue
		}
		if writing[guid] {
			// Still written; or its part renamed as the directory was
			// read, which lists both names: looked for again.
			if _, ok := w.orphans[guid]; !ok {
				w.orphans[guid] = now
			}
			continue
		}
		if w.kept+len(w.begun)+w.queued >= w.limits.PerSession {
			w.refuse(fmt.Sprintf("over the limit of %d downloads in a session", w.limits.PerSession), "", "")
			w.skipGUID(guid)
			continue
		}
		w.finished = append(w.finished, Download{GUID: guid, Found: true})
		w.queued++
		w.handedOver[guid] = true
	}
	for guid, since := range w.orphans {
		switch {
		case !writing[guid]: // finished (found above), or cancelled
			delete(w.orphans, guid)
		case now.Sub(since) > w.limits.Stale:
			delete(w.orphans, guid)
			w.refuse(fmt.Sprintf("unfinished after %s", w.limits.Stale), guid, "")
		}
	}
}

// deliver hands finished and refused downloads to done, keeping those
// it could not store for another try.
func (w *watcher) deliver(finished, refused []Download, _ []string) {
	for _, d := range refused {
		w.done(d)
	}
	var failed []Download
	for _, d := range finished {
		if w.done(d) != nil {
			d.Retry, d.failedAt = true, time.Now()
			failed = append(failed, d)
		}
	}
	w.mu.Lock()
	w.failed = append(w.failed, failed...)
	w.mu.Unlock()
	w.handed(len(finished))
}

// retryFailed hands over again the downloads done could not store; as
// the last try when the watcher stops (final), or for one tried for
// limits.Stale.
func (w *watcher) retryFailed(final bool) {
	w.mu.Lock()
	again := w.failed
	w.failed = nil
	w.mu.Unlock()
	var still []Download
	for _, d := range again {
		d.Final = final || time.Since(d.failedAt) > w.limits.Stale
		if w.done(d) != nil && !d.Final {
			still = append(still, d)
		}
	}
	w.mu.Lock()
	w.failed = append(w.failed, still...)
	w.mu.Unlock()
}
