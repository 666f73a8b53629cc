package session

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/sandgate/sandgate/ids"
)

// recover adopts the running, unexpired sessions of known tenants that a
// previous gateway left in containerd, and removes everything else it
// owns: other containers, namespaces and workspaces nobody holds.
func (m *Manager) recover(ctx context.Context) error {
	containers, err := m.client.Containers(ctx, fmt.Sprintf("labels.%q", labelSession))
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	kept := map[string]bool{}
	for _, c := range containers {
		id := c.ID()
		log := m.log.With("session", id)
		s, exited, why := m.adopt(ctx, c)
		if s == nil {
			log.Info("removing orphaned session", "reason", why)
			if err := removeContainer(ctx, c); err != nil {
				log.Error("remove orphan container", "err", err)
			}
			continue
		}
		kept[id] = true
		m.mu.Lock()
		m.sessions[id] = s
		m.byAddr[s.addr] = s
		if p := s.info.Profile; p != nil {
			// Its hold goes on: nothing else may take the profile first.
			if m.takeProfileLocked(s.info.Tenant, p) {
				tenant, use := s.info.Tenant, *p
				s.releaseProfile = func() { m.mu.Lock(); m.dropProfileLocked(tenant, &use); m.mu.Unlock() }
			} else {
				// Two writers of one profile (an earlier gateway's
				// teardown that failed): the one adopted first keeps the
				// hold, and this one's end does not drop it.
				log.Warn("adopted a second session holding the same profile; only the first keeps the hold", "profile", p.ID)
			}
		}
		m.mu.Unlock()
		log.Info("adopted session", "tenant", s.info.Tenant, "expires_at", s.info.ExpiresAt)
		m.wg.Add(1)
		go m.watch(s, exited)
	}
	for _, id := range m.net.leftovers() {
		if !kept[id] {
			m.log.Info("removing orphaned network namespace", "session", id)
			if err := m.net.remove(ctx, id); err != nil {
				m.log.Error("remove orphan netns", "session", id, "err", err)
			}
		}
	}
	entries, _ := os.ReadDir(filepath.Join(m.cfg.StateDir, "sessions"))
	for _, e := range entries {
		if !kept[e.Name()] && ids.IsSession(e.Name()) {
			// A workspace without a container: also release any address
			// its namespace may still hold.
			if err := m.net.remove(ctx, e.Name()); err != nil {
				m.log.Error("release orphan address", "session", e.Name(), "err", err)
			}
			if err := m.removeWorkspace(e.Name()); err != nil {
				m.log.Error("remove orphan workspace", "session", e.Name(), "err", err)
			}
		}
	}
	m.sweepCgroups() // those of containers an earlier gateway's runtime left
	return nil
}

// adopt rebuilds a session from its container, or says why it cannot.
func (m *Manager) adopt(ctx context.Context, c containerd.Container) (*sess, <-chan containerd.ExitStatus, string) {
	labels, err := c.Labels(ctx)
	if err != nil {
		return nil, nil, "labels unreadable"
	}
	if labels[labelPool] != "" {
		// Claimed by a gateway that died before containerd had the claim
		// (storeClaim): the claim record finishes it.
		claimed, err := m.readClaim(c.ID())
		if err != nil {
			// Nobody claimed it: a pooled session is never adopted, so
			// that nothing an earlier gateway started is handed out unseen.
			return nil, nil, "a warm pool session of an earlier gateway"
		}
		claimed[labelPool] = "" // cleared whatever the record says
		if labels, err = c.SetLabels(ctx, claimed); err != nil {
			return nil, nil, "its claim could not be stored"
		}
		os.Remove(filepath.Join(m.workspaceDir(c.ID()), claimFile))
		m.log.Info("finished the claim of a warm session an earlier gateway handed out", "session", c.ID())
	}
	info, err := infoFromLabels(labels)
	if err != nil {
		return nil, nil, err.Error()
	}
	if _, ok := m.Limits(info.Tenant); !ok {
		return nil, nil, "tenant no longer configured"
	}
	if time.Now().After(info.ExpiresAt) {
		return nil, nil, "expired"
	}
	rt, ok := m.runtimes[info.Runtime]
	if !ok || !rt.Usable {
		return nil, nil, "runtime no longer usable"
	}
	addr, err := netip.ParseAddr(labels[labelAddr])
	if err != nil {
		return nil, nil, "no address"
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, nil, "no task"
		}
		return nil, nil, "task unreadable"
	}
	st, err := task.Status(ctx)
	if err != nil || st.Status != containerd.Running {
		return nil, nil, "task not running"
	}
	exited, err := task.Wait(m.base)
	if err != nil {
		return nil, nil, "task cannot be watched"
	}
	ep := endpointOf(addr)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, version, err := waitReady(rctx, ep, info.Kind == KindBrowser, exited, 10*time.Second)
	ep.Version = version
	if err != nil {
		var pe *PublicError
		if errors.As(err, &pe) {
			return nil, nil, pe.Msg
		}
		return nil, nil, "not answering"
	}
	info.State = StateRunning
	info.Isolation = rt.Isolation
	if info.Labels == nil {
		info.Labels = map[string]string{}
	}
	s := newSess(info)
	s.addr, s.ep, s.container = addr, ep, c
	// Containers of gateways before the revocations file kept their
	// revocations in labels.
	for preview, until := range revokedFromLabels(labels) {
		if until.After(time.Now()) && !m.revocations.has(info.ID, preview, time.Now()) {
			m.revocations.add(info.ID, preview, until, time.Now())
		}
	}
	s.trail = m.openTrail(info.Tenant, info.ID)
	s.record("adopted", map[string]any{"note": "the gateway restarted and took the session over"})
	return s, exited, ""
}
