package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/session/kube"
	"github.com/sandgate/sandgate/vault"
)

// replicaEgress is the egress proxy of a gateway replica of backend
// kubernetes with an address (kubernetes.advertise): every replica
// serves the sessions' egress, so that a session's connections through
// a replica do not end with the leader, and new ones go on while no
// replica leads. While this replica stands by, a connection's session
// is its source's Pod, read from the API server (kube.Sources), its
// events are reported to the leader through the relay, and its
// credentials are opened by a vault of its own; once it leads, the
// session manager and the leader's vault answer, on the same proxy (its
// connections go on).
type replicaEgress struct {
	lead    atomic.Pointer[leading]
	sources *kube.Sources
	relay   *gateway.Server
	log     *slog.Logger

	// Its own vault while it stands by (nil: no vault.key).
	vault  *standby[vault.Vault]
	warnAt atomic.Int64
	// settings: the egress settings the proxy runs with (egressSettings).
	settings string
	proxy    *egress.Proxy
	started  chan struct{} // closed once the proxy serves (or never will)
	served   bool          // the proxy served (set before started closes)
}

// leading: the leader's session manager and vault, once this replica
// leads.
type leading struct {
	m *session.Manager
	v *vault.Vault
}

// Policy: the session manager's once this replica leads; before, the
// record of the Pod that holds src, if it is a session's that starts or
// runs.
func (r *replicaEgress) Policy(src netip.Addr) (egress.Policy, bool) {
	if ld := r.lead.Load(); ld != nil {
		return policies{ld.m}.Policy(src)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, ok, err := r.sources.Record(ctx, src)
	if err != nil {
		r.warn("egress proxy: cannot read which session's Pod a connection comes from; refused", "source", src, "err", err)
		return egress.Policy{}, false
	}
	if !ok {
		return egress.Policy{}, false
	}
	info, err := session.InfoFromRecord(rec)
	if err != nil || (info.State != session.StateStarting && info.State != session.StateRunning) {
		return egress.Policy{}, false // (read afresh at its next connection)
	}
	r.relay.EgressSession(info.Tenant, info.ID, info.ExpiresAt)
	return policyOf(info), true
}

// audit records an event: the session manager's trail once this
// replica leads, a report to the leader before.
func (r *replicaEgress) audit(id, typ string, f map[string]any) {
	if ld := r.lead.Load(); ld != nil {
		ld.m.Record(id, typ, f)
		return
	}
	r.relay.EgressEvent(id, typ, f)
}

// Credential opens a credential with the leader's vault once this
// replica leads, with its own before.
func (r *replicaEgress) Credential(ctx context.Context, tenant, id string) (egress.Credential, error) {
	return secrets{r.vaultNow(ctx)}.Credential(ctx, tenant, id)
}

func (r *replicaEgress) Placeholder(session, credential string) string {
	return secrets{r.vaultNow(context.Background())}.Placeholder(session, credential)
}

func (r *replicaEgress) vaultNow(ctx context.Context) *vault.Vault {
	if ld := r.lead.Load(); ld != nil {
		return ld.v
	}
	if r.vault == nil {
		return nil
	}
	// A connection waits for the vault to open as long as a try
	// lasts; past that, or within 5 s of a failed try, it goes without
	// (credential_unavailable).
	ctx, cancel := context.WithTimeout(ctx, standbyOpen)
	defer cancel()
	v, err := r.vault.get(ctx)
	if err != nil {
		r.warn("egress proxy: the vault cannot be opened; credentials are not added meanwhile", "err", err)
	}
	return v
}

// standby is what a replica opens of its own while it stands by (its
// vault, its profile store): opened when first needed, tried again at
// most every 5 s while MinIO does not answer.
type standby[T any] struct {
	what string // what it opens, for errors
	open func(context.Context) (*T, error)
	v    atomic.Pointer[T]
	mu   sync.Mutex
	try  chan struct{} // closed as the try under way ends; nil: none
	at   time.Time     // when the last try ended
	err  error         // its error
}

func newStandby[T any](what string, open func(context.Context) (*T, error)) *standby[T] {
	return &standby[T]{what: what, open: open}
}

// standbyOpen bounds a try to open it.
const standbyOpen = 10 * time.Second

// get is what s opens, opened now if need be: one try at a time, apart
// from its askers (within standbyOpen, its end recorded whoever
// waits), and none within 5 s of one that failed (its error is the
// answer then). An asker waits for the try while ctx lasts. A nil s
// has nothing to open: nil and no error.
func (s *standby[T]) get(ctx context.Context) (*T, error) {
	if s == nil {
		return nil, nil // none to open (no vault.key)
	}
	if v := s.v.Load(); v != nil {
		return v, nil
	}
	s.mu.Lock()
	if v := s.v.Load(); v != nil {
		s.mu.Unlock()
		return v, nil
	}
	if s.try == nil {
		if err := s.err; err != nil && time.Since(s.at) < 5*time.Second {
			s.mu.Unlock()
			return nil, err
		}
		done := make(chan struct{})
		s.try = done
		go func() {
			defer close(done)
			octx, cancel := context.WithTimeout(context.Background(), standbyOpen)
			defer cancel()
			v, err := func() (v *T, err error) {
				defer func() {
					if p := recover(); p != nil {
						v, err = nil, fmt.Errorf("opening the %s panicked: %v", s.what, p)
					}
				}()
				return s.open(octx)
			}()
			if err == nil && v == nil {
				err = fmt.Errorf("the %s opened as none", s.what)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if err == nil {
				s.v.Store(v)
			}
			s.at, s.err, s.try = time.Now(), err, nil
		}()
	}
	done := s.try
	s.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("the %s is being opened: %w", s.what, ctx.Err())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.v.Load(); v != nil {
		return v, nil
	}
	return nil, s.err
}

// warn logs, at most every 10 s.
func (r *replicaEgress) warn(msg string, args ...any) {
	now := time.Now().UnixNano()
	if last := r.warnAt.Load(); now-last > int64(10*time.Second) && r.warnAt.CompareAndSwap(last, now) {
		r.log.Warn(msg, args...)
	}
}

// Lead hands the proxy to the leader's session manager and vault.
func (r *replicaEgress) Lead(m *session.Manager, v *vault.Vault) {
	r.lead.Store(&leading{m: m, v: v})
}

// egressSettings are what a proxy's config comes from: egress.* and the
// vault's key (its sessions' CAs derive from it).
func egressSettings(cfg *Config) string {
	raw, _ := json.Marshal(struct {
		Egress any
		Key    string
	}{cfg.Egress, cfg.Vault.Key})
	return string(raw)
}

// startReplicaEgress serves the egress proxy on egress.listen while
// this replica stands by. Where another process holds the address (a
// leader on the same host, as replicas that share a host's network),
// it says so and tries again every second until it serves or stop
// ends; the leader's proxy serves meanwhile. A config it cannot run,
// or an address it cannot listen on otherwise, is an error.
func startReplicaEgress(stop context.Context, cfg *Config, r *replicaEgress, ca []byte, log *slog.Logger) error {
	ec, err := egressConfig(cfg, r.audit, ca, log)
	if err != nil {
		return err
	}
	r.settings = egressSettings(cfg)
	r.started = make(chan struct{})
	l, err := net.Listen("tcp", cfg.Egress.Listen)
	if err == nil {
		r.proxy = serveEgress(ec, l, r, r, log)
		r.served = true
		close(r.started)
		return nil
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		close(r.started)
		return fmt.Errorf("egress proxy on %s: %w", cfg.Egress.Listen, err)
	}
	log.Warn("another process holds egress.listen (a replica on the same host?): this replica serves egress once it is free", "addr", cfg.Egress.Listen)
	go func() {
		defer close(r.started)
		for {
			select {
			case <-stop.Done():
				return
			case <-time.After(time.Second):
			}
			if l, err := net.Listen("tcp", cfg.Egress.Listen); err == nil {
				r.proxy = serveEgress(ec, l, r, r, log)
				r.served = true
				return
			}
		}
	}()
	return nil
}
