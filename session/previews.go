package session

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandgate/sandgate/ids"
)

// Bounds on a session's live preview connections (CDP, VNC, shell).
const (
	MaxSessionConns = 32
	MaxPreviewConns = 16
)

// Track registers a live connection of a preview on its session, so that
// the session's end or the preview's revocation closes it. The returned
// func unregisters it.
func (m *Manager) Track(tenant, id, preview string, c io.Closer) (func(), error) {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.info.State != StateRunning {
		return nil, publicf(ErrConflict, "the session is "+string(s.info.State), nil)
	}
	if m.revocations.has(id, preview, time.Now()) {
		return nil, publicf(ErrNotFound, "the preview was revoked", nil)
	}
	// A shared link is held by strangers: each connection costs the
	// gateway buffers, descriptors and goroutines, so a session has a
	// bounded number of them, and one preview a smaller share.
	per := 0
	for t := range s.conns {
		if t.preview == preview {
			per++
		}
	}
	if len(s.conns) >= MaxSessionConns || per >= MaxPreviewConns {
		return nil, publicf(ErrQuota, fmt.Sprintf("too many live connections (at most %d per session, %d per preview)", MaxSessionConns, MaxPreviewConns), nil)
	}
	t := &tracked{preview: preview, c: c}
	s.conns[t] = struct{}{}
	return func() {
		m.mu.Lock()
		delete(s.conns, t)
		m.mu.Unlock()
	}, nil
}

// closeConns closes the session's tracked connections, all of them or
// those of one preview. The caller holds m.mu.
func closeConns(s *sess, preview string) {
	for t := range s.conns {
		if preview == "" || t.preview == preview {
			go t.c.Close()
			delete(s.conns, t)
		}
	}
}

// RevokePreview marks a preview revoked until its expiry and closes its
// live connections. Revocations are kept in a file under the state dir,
// so they hold after a gateway restart, for ended sessions too.
func (m *Manager) RevokePreview(ctx context.Context, tenant, id, preview string, until time.Time) error {
	s, err := m.lookup(tenant, id)
	if err != nil {
		return err
	}
	return m.revoke(ctx, s, id, preview, until)
}

// RevokeForgotten revokes a preview of a session this gateway does not
// hold any more (forgotten after its retention; its review links live
// on). The caller has made sure the session was the tenant's: the store
// holds its artifacts under the tenant.
func (m *Manager) RevokeForgotten(ctx context.Context, id, preview string, until time.Time) error {
	if !ids.IsSession(id) {
		return ErrNotFound
	}
	return m.revoke(ctx, nil, id, preview, until)
}

// HoldRevocation holds a revocation another gateway replica made and
// stored (so none is stored here), until then: as RevokePreview does
// for a session of tenant's this manager holds (its connections end),
// or, for a session it does not hold at all (ended, forgotten: its
// review links), as RevokeForgotten does; another tenant's session is
// ErrNotFound. It is not refused past MaxRevocationsPerSession: the
// store has it already, and a restart would hold it.
func (m *Manager) HoldRevocation(tenant, id, preview string, until time.Time) error {
	if !ids.IsSession(id) {
		return ErrNotFound
	}
	m.mu.Lock()
	s := m.sessions[id]
	if s != nil && s.info.Tenant != tenant {
		m.mu.Unlock()
		return ErrNotFound
	}
	m.mu.Unlock()
	err := m.revocations.add(id, preview, until, time.Now())
	if s != nil {
		m.mu.Lock()
		closeConns(s, preview)
		m.mu.Unlock()
	}
	return err
}

// revoke does RevokePreview for s, or for a session the manager does not
// hold (nil).
func (m *Manager) revoke(ctx context.Context, s *sess, id, preview string, until time.Time) error {
	var err error
	if m.revocations.count(id, time.Now()) >= MaxRevocationsPerSession && !m.revocations.has(id, preview, time.Now()) {
		// Each is kept (here and in the store) until its preview would
		// expire: a bound, so that no one can fill the store with them.
		return publicf(ErrQuota, fmt.Sprintf("at most %d previews of a session can be revoked; end the session to end them all", MaxRevocationsPerSession), nil)
	}
	err = m.revocations.add(id, preview, until, time.Now())
	if s != nil {
		m.mu.Lock()
		closeConns(s, preview)
		m.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("store revocation: %w", err)
	}
	if st := m.cfg.Revocations; st != nil {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := st.PutRevocation(sctx, id, preview, until); err != nil {
			return publicf(ErrUnavailable, "the preview is revoked on this gateway, but the revocation could not be stored for the others and for a restart; revoke it again", err)
		}
	}
	return nil
}

// RevocationStore keeps revoked previews where every gateway of the
// deployment reads them (MinIO): a revocation then holds on a gateway
// that comes back on another host, without this host's file.
type RevocationStore interface {
	PutRevocation(ctx context.Context, session, preview string, until time.Time) error
	// Revocations calls each with the stored revocations that hold at
	// now; it may remove those that do not.
	Revocations(ctx context.Context, now time.Time, each func(session, preview string, until time.Time)) error
}

// loadStoredRevocations takes up the store's revocations. A gateway that
// cannot read them does not start: it would take revoked links.
func (m *Manager) loadStoredRevocations(ctx context.Context) error {
	st := m.cfg.Revocations
	if st == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	now, n := time.Now(), 0
	r := m.revocations
	inStore := map[revocation]bool{}
	err := st.Revocations(ctx, now, func(session, preview string, until time.Time) {
		inStore[revocation{session, preview}] = true
		r.mu.Lock()
		if _, ok := r.m[revocation{session, preview}]; !ok {
			r.m[revocation{session, preview}] = until
			n++
		}
		r.mu.Unlock()
	})
	if err != nil {
		return fmt.Errorf("read the stored preview revocations: %w", err)
	}
	// What only this host has (kept before the store was, or whose store
	// write failed) goes to the store now, so it holds on any gateway.
	r.mu.Lock()
	var missing []revocation
	for k, until := range r.m {
		if !inStore[k] && until.After(now) {
			missing = append(missing, k)
		}
	}
	r.mu.Unlock()
	for _, k := range missing {
		r.mu.Lock()
		until := r.m[k]
		r.mu.Unlock()
		if err := st.PutRevocation(ctx, k.Session, k.Preview, until); err != nil {
			m.log.Warn("a revocation this host holds could not be stored; the next start tries again", "session", k.Session, "err", err)
			break
		}
	}
	if n > 0 {
		m.log.Info("took up preview revocations from the store that this host did not have", "count", n)
		// Into the host's file too, in one write.
		return r.rewrite()
	}
	return nil
}

// Revoked tells whether a preview of the session was revoked, whether the
// session is live, ended or forgotten.
func (m *Manager) Revoked(id, preview string) bool {
	return m.revocations.has(id, preview, time.Now())
}

// MaxRevocationsPerSession bounds the revocations a session holds at
// once.
const MaxRevocationsPerSession = 1000

// count is how many revocations of a session hold at now.
func (r *revocations) count(session string, now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for k, until := range r.m {
		if k.Session == session && until.After(now) {
			n++
		}
	}
	return n
}

// pruneRevocationsAt is the count past which add drops the expired
// revocations; each lasts only until its preview would have expired.
const pruneRevocationsAt = 10000

// revocations are the revoked previews, in memory and in an append-only
// file that is compacted (expired entries dropped) when it is loaded.
type revocations struct {
	path string
	mu   sync.Mutex               // guards m; never held during file I/O
	fmu  sync.Mutex               // serialises appends to the file
	m    map[revocation]time.Time // until
}

type revocation struct{ Session, Preview string }

type revocationLine struct {
	Session string `json:"session"`
	Preview string `json:"preview"`
	Until   int64  `json:"until"` // unix seconds
}

// loadRevocations reads the file, keeps what has not expired by now and
// writes it back compacted.
func loadRevocations(path string, now time.Time) (*revocations, error) {
	r := &revocations{path: path, m: map[revocation]time.Time{}}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("revocations: %w", err)
	}
	f, err := os.Open(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("revocations: %w", err)
	}
	if f != nil {
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 4096), 4096)
		for sc.Scan() {
			var l revocationLine
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				continue
			}
			if until := time.Unix(l.Until, 0); until.After(now) {
				r.m[revocation{l.Session, l.Preview}] = until
			}
		}
		f.Close()
	}
	if err := r.rewrite(); err != nil {
		return nil, err
	}
	return r, nil
}

// rewrite writes the file anew with what is in memory.
func (r *revocations) rewrite() error {
	r.fmu.Lock()
	defer r.fmu.Unlock()
	var b bytes.Buffer
	r.mu.Lock()
	for k, until := range r.m {
		line, _ := json.Marshal(revocationLine{k.Session, k.Preview, until.Unix()})
		b.Write(append(line, '\n'))
	}
	r.mu.Unlock()
	tmp := r.path + ".tmp"
	if err := writeSynced(tmp, b.Bytes()); err != nil {
		return fmt.Errorf("revocations: %w", err)
	}
	if err := os.Rename(tmp, r.path); err != nil {
		return fmt.Errorf("revocations: %w", err)
	}
	return nil
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// add revokes a preview until its expiry. It is in memory at once; the
// error says it could not be made durable.
func (r *revocations) add(session, preview string, until, now time.Time) error {
	r.mu.Lock()
	if len(r.m) >= pruneRevocationsAt {
		for k, u := range r.m {
			if !u.After(now) {
				delete(r.m, k)
			}
		}
	}
	r.m[revocation{session, preview}] = until
	r.mu.Unlock()
	// has (under the manager's lock) never waits on the disk.
	r.fmu.Lock()
	defer r.fmu.Unlock()
	line, _ := json.Marshal(revocationLine{session, preview, until.Unix()})
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(line, '\n'))
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (r *revocations) has(session, preview string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	until, ok := r.m[revocation{session, preview}]
	return ok && until.After(now)
}
