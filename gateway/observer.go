package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"mime"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
)

// WithRecorder enables "record": true sessions.
func WithRecorder(r *recordings.Recorder) Option { return func(s *Server) { s.recorder = r } }

// watchers is what runs beside a live session on the gateway's side.
type watchers struct {
	mu     sync.Mutex
	cancel map[string]context.CancelFunc
}

// Observer returns the gateway's session observer: it starts the recorder
// and the download watcher of a session that became ready, and when a
// session ends it finalises its recording and stores its audit trail.
func (s *Server) Observer() session.Observer { return (*observer)(s) }

type observer Server

func (o *observer) SessionRunning(info session.Info, ep session.Endpoint) {
	s := (*Server)(o)
	log := s.log.With("session", info.ID, "tenant", info.Tenant)
	if info.Record && s.recorder != nil {
		s.recorder.Start(recordings.Target{
			Tenant: info.Tenant, Session: info.ID, VNC: ep.VNC.String(),
			Width: info.Screen.Width, Height: info.Screen.Height,
			Note: func(typ string, f map[string]any) { s.sessions.Record(info.ID, typ, f) },
		})
		s.sessions.Record(info.ID, "recording_started", nil)
		log.Info("recording")
	}
	if info.Kind != session.KindBrowser {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.watch.mu.Lock()
	if old := s.watch.cancel[info.ID]; old != nil {
		old()
	}
	s.watch.cancel[info.ID] = cancel
	s.watch.mu.Unlock()
	go browser.WatchDownloads(ctx, ep.CDP, session.DownloadDir, browser.DownloadLimits{}, func(d browser.Download) {
		if err := s.storeDownload(ctx, info, d); err != nil {
			log.Warn("download not stored", "err", err)
			s.sessions.Record(info.ID, "download_failed", map[string]any{"url": d.URL})
		}
	})
}

func (s *Server) storeDownload(ctx context.Context, info session.Info, d browser.Download) error {
	f, err := s.sessions.OpenDownload(info.Tenant, info.ID, d.GUID)
	if err != nil {
		return err
	}
	defer f.Close()
	name := d.Name
	if !utf8.ValidString(name) || name == "" || len(name) > 255 || strings.ContainsAny(name, "/\\\x00") {
		name = "download"
	}
	ct := mime.TypeByExtension(filepath.Ext(name))
	if ct == "" {
		ct = "application/octet-stream"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	a, err := s.store.PutFrom(ctx, info.Tenant, recordings.Artifact{
		Session: info.ID, Kind: recordings.KindDownload, Name: name, ContentType: ct, SourceURL: d.URL,
	}, f)
	if err != nil {
		return err
	}
	s.sessions.Record(info.ID, "download", map[string]any{"artifact": a.ID, "name": a.Name, "url": d.URL, "size": a.Size, "sha256": a.SHA256})
	return nil
}

func (o *observer) SessionEnded(info session.Info, events []session.Event) {
	s := (*Server)(o)
	log := s.log.With("session", info.ID, "tenant", info.Tenant)
	s.watch.mu.Lock()
	if cancel := s.watch.cancel[info.ID]; cancel != nil {
		cancel()
		delete(s.watch.cancel, info.ID)
	}
	s.watch.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	note := func(typ string, f map[string]any) {
		s.sessions.Record(info.ID, typ, f)
		events = append(events, session.Event{Time: time.Now().UTC(), Type: typ, Fields: f})
	}
	if s.recorder != nil {
		m, err := s.recorder.Finish(ctx, info.Tenant, info.ID, time.Now())
		switch {
		case errors.Is(err, recordings.ErrNothingRecorded):
			note("recording_failed", map[string]any{"reason": err.Error()})
		case err != nil:
			log.Error("recording not finalised; its segments are kept for a retry", "err", err)
			note("recording_failed", map[string]any{"reason": "the recording could not be finalised yet; it is retried"})
		case m != nil:
			note("recording_finalised", map[string]any{"artifact": m.Recording, "duration_seconds": m.Duration, "segments": len(m.Segments), "size": m.Size, "sha256": m.SHA256})
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for _, ev := range events {
		enc.Encode(ev)
	}
	// The trail is all a reviewer has of what happened: retry while the
	// store is away, within the stop's bounds.
	for {
		_, err := s.store.Put(ctx, info.Tenant, info.ID, recordings.KindLog, "audit.jsonl", "application/x-ndjson", b.Bytes())
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			log.Error("audit trail not stored", "err", err)
			return
		case <-time.After(2 * time.Second):
		}
	}
}
