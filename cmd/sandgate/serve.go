package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/mcpserver"
	sandgate "github.com/sandgate/sandgate/sdk/go"
	"github.com/sandgate/sandgate/session/kube"
	corev1 "k8s.io/api/core/v1"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/sandgate/sandgate/browser"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/images"
	"github.com/sandgate/sandgate/profile"
	"github.com/sandgate/sandgate/recordings"
	"github.com/sandgate/sandgate/session"
	"github.com/sandgate/sandgate/tenant"
	"github.com/sandgate/sandgate/vault"
)

// cmdServe runs the gateway until SIGINT or SIGTERM.
func cmdServe(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfgPath := fs.String("config", "/etc/sandgate/config.json", "config file")
	advertise := fs.String("advertise", "", "backend kubernetes: where other replicas reach this one (ip:port), overriding kubernetes.advertise")
	pod := fs.String("pod", "", "backend kubernetes: this gateway's own Pod, labelled while it leads, overriding kubernetes.pod")
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	cfg, err := LoadConfig(*cfgPath)
	if err != nil {
		return err
	}
	if *advertise != "" {
		if cfg.Backend != "kubernetes" {
			return usageError("-advertise is for backend kubernetes (gateway replicas)")
		}
		if err := checkAdvertise(*advertise); err != nil {
			return usageError("-advertise: " + err.Error())
		}
		cfg.Kubernetes.Advertise = *advertise
	}
	if *pod != "" {
		if cfg.Backend != "kubernetes" {
			return usageError("-pod is for backend kubernetes (gateway replicas)")
		}
		if err := checkPodName(*pod); err != nil {
			return usageError("-pod: " + err.Error())
		}
		cfg.Kubernetes.Pod = *pod
	}
	pub, err := url.Parse(cfg.PublicURL)
	if err != nil || pub.Host == "" || (pub.Scheme != "http" && pub.Scheme != "https") {
		return fmt.Errorf("config: public_url %q must be an http(s) URL", cfg.PublicURL)
	}

	// The backend: containerd on this host, with the session image
	// built into it, or Pods on a cluster whose nodes have the image.
	var client *containerd.Client
	var backend session.Backend
	var front *gateway.Front // backend kubernetes, with replicas
	// standCtx lasts while this replica stands by (endStand: it leads).
	standCtx, endStand := context.WithCancel(ctx)
	defer endStand()
	var kb *kube.Backend // backend kubernetes
	// Backend kubernetes, with kubernetes.pod: the leader's label on
	// this replica's Pod while it leads (see kube.LabelGatewayRole).
	var role *kube.Role
	// Backend kubernetes: the recordings this replica takes, and how.
	var recShare *kube.Shared
	var heldRec *recordings.Recorder
	// Backend kubernetes, with kubernetes.advertise and egress.listen:
	// the egress proxy this replica serves from the start, which the
	// session manager takes once it leads (egressStand ends its tries
	// to listen).
	var standEgress *replicaEgress
	// Backend kubernetes, with kubernetes.advertise: what this replica
	// answers while it stands by.
	var standRelay *gateway.Server
	egressStand, endEgressStand := context.WithCancel(ctx)
	defer endEgressStand()
	// leadCtx lasts while this replica holds the namespace's lease, its
	// drain too (backend kubernetes).
	leadCtx := ctx
	// leaveEgress takes this replica's Pod out of the egress proxy's
	// Service (kube.LabelEgress), once; set below for a replica with a
	// Pod and a proxy.
	leaveEgress := func() {}
	ref := images.SessionDefinition().Ref()
	if cfg.Backend == "kubernetes" {
		kubeBackend := func(cfg *Config) (*kube.Backend, error) {
			ref = images.SessionDefinition().Ref()
			if cfg.Kubernetes.Image != "" {
				ref = cfg.Kubernetes.Image
			}
			return kube.New(kube.Config{
				Kubeconfig: cfg.Kubernetes.Kubeconfig, Namespace: cfg.Kubernetes.Namespace, Image: ref,
				PullPolicy: corev1.PullPolicy(cfg.Kubernetes.PullPolicy), RuntimeClasses: cfg.Kubernetes.RuntimeClasses,
				Seccomp: cfg.Kubernetes.Seccomp,
			})
		}
		if kb, err = kubeBackend(cfg); err != nil {
			return err
		}
		if own, listen := cfg.Kubernetes.Pod, cfg.Egress.Listen; own != "" && listen != "" {
			// (Its own copies: kb and cfg are read again on taking the
			// lead, while this may run, at a SIGTERM.)
			pods := kb
			var once sync.Once
			leaveEgress = func() {
				once.Do(func() {
					lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
					defer cancel()
					if err := pods.LeaveEgress(lctx, own); err != nil {
						log.Warn("cannot take this replica's Pod out of the egress proxy's Service; the leader will once its proxy stops answering", "err", err)
					}
				})
			}
		}
		// One replica leads the namespace's sessions: it holds the
		// namespace's lease while it runs (given back as serve returns),
		// and stops if it loses it. A replica with an address others can
		// reach stands by meanwhile, forwarding what it is sent to the
		// leader, and takes over when the leader stops renewing; one
		// without is refused once the leader has kept the lease a while.
		holdCtx, endHold := context.WithCancel(context.WithoutCancel(ctx))
		defer endHold()
		leadCtx = holdCtx
		// Named by its Pod (name and UID) where it runs in one, so that
		// the next run of its container knows this one's leases (below).
		name, _ := os.Hostname()
		var uid string
		if own := cfg.Kubernetes.Pod; own != "" {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			uid, err = kb.CheckPod(cctx, own)
			cancel()
			if err != nil {
				return fmt.Errorf("kubernetes.pod: %w", err)
			}
			role = kube.NewRole(holdCtx, own, log)
			name = own
		}
		identity := kube.Identity(name, uid, os.Getpid(), randomHex(4))
		wait := 3 * kube.HoldDuration
		// knowsDead: this run serves in its Pod at the advertised port,
		// so any earlier run of the Pod's container is dead (below).
		knowsDead := false
		// freed is closed once the look for a dead run's hold is over:
		// it runs beside the start-up (it may wait for the hold's grace),
		// and the bid for the lead waits for it.
		freed := make(chan struct{})
		if cfg.Kubernetes.Advertise != "" {
			ln, err := net.Listen("tcp", cfg.Listen)
			if err != nil {
				return err
			}
			// (Its own copies: kb and cfg are read again on taking the
			// lead, while the front still runs.)
			holds, own := kb, cfg.Kubernetes.Advertise
			front = gateway.NewFront(ln, func(ctx context.Context) (string, gateway.Relays, error) {
				l, err := holds.ReadLead(ctx)
				leader, addr := l.Identity, l.Address
				if leader == identity {
					return "", gateway.Relays{}, err // this replica: it is taking over
				}
				if err == nil && addr != "" && checkAdvertise(addr) != nil {
					// The lease is the gateway's own (rbac.yaml), but an
					// address that is no ip:port is not dialled.
					return "", gateway.Relays{}, fmt.Errorf("the leading replica %s advertises %q, which is not ip:port", leader, addr)
				}
				if addr == own {
					// Forwarding there would come back here, for good.
					return "", gateway.Relays{}, fmt.Errorf("the leading replica %s advertises this replica's own address %s: each replica needs its own kubernetes.advertise", leader, addr)
				}
				return addr, gateway.Relays{Previews: l.Relays, Exec: l.Exec, Files: l.Files, Actions: l.Actions, Snapshots: l.Snapshots}, err
			}, log.With("component", "front"))
			defer front.Close()
			wait = 0
			// A container that restarted (its last run was SIGKILLed, or
			// ran out of memory) may find that run's hold: the kubelet
			// starts a container's next run once the last one's processes
			// are gone, and a run holds its port until it has given its
			// leases back (the front closes last), so the hold is given
			// back at once and a replica leads within a few seconds, not
			// once the hold runs out (up to its whole 15 s).
			if uid != "" && listensAt(ln, cfg.Kubernetes.Advertise) {
				knowsDead = true
				go func() {
					defer close(freed)
					fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					dead, err := kb.FreeDeadHold(fctx, cfg.Kubernetes.Pod, uid, identity, cfg.Kubernetes.Advertise)
					cancel()
					switch {
					case err != nil:
						log.Warn("cannot read whether this replica's last run left the namespace's gateway lease; it runs out on its own", "err", err)
					case dead != "":
						log.Info("this replica's last run, dead, held the namespace's gateway lease: given back, so that a replica leads at once", "dead", dead)
					default:
						log.Info("no dead run of this replica holds the namespace's gateway lease")
					}
				}()
			}
			// While it stands by, it carries the preview connections (CDP
			// and VNC), shells, commands, files, actions, screenshots and
			// snapshots it is sent itself, straight to the sessions' Pods,
			// asking the leader about each (gateway.NewRelay); it stores
			// the screenshots and snapshots itself.
			// While the store does not answer (MinIO, asked every few
			// seconds), those are forwarded to the leader.
			relayStore, err := recordings.Open(storeConfig(cfg))
			if err != nil {
				log.Warn("no artifact store for this replica: the actions, screenshots and snapshots it is sent go to the leader", "err", err)
				relayStore = nil
			}
			pods := kube.NewSessions(ctx, holds)
			// The tenants' profiles count against their quota with the
			// artifacts, as on the leader, which has profiles when a
			// vault.key is configured. (With no store, this replica
			// takes no snapshots: they go to the leader.)
			var relayOpts []gateway.Option
			if vkey, _ := cfg.vaultKey(); vkey != nil && relayStore != nil {
				counter, err := profile.NewCounter(profileConfig(cfg, vkey))
				if err != nil {
					log.Warn("no artifact store for this replica: it cannot count the tenants' profiles against their quota, so the actions, screenshots and snapshots it is sent go to the leader", "err", err)
					relayStore = nil
				} else {
					relayOpts = append(relayOpts, gateway.WithProfileBytes(counter.TenantBytes))
				}
			}
			// And /mcp while no leader answers (the Front passes it on
			// otherwise). Its tools' calls are retried as the gateway
			// says to, for mcpRetryFor: a create waits until a replica
			// leads (this one, say), as an SDK's would, rather than
			// failing at once.
			mcp, err := mcpOption(cfg, pub, sandgate.WithRetry(mcpRetryFor))
			if err != nil {
				return err
			}
			relayOpts = append(relayOpts, mcp)
			relay, err := gateway.NewRelay(gatewayConfig(cfg, pub), identity, func(ctx context.Context) (string, error) {
				_, addr, err := holds.Leader(ctx) // this replica too, once it leads
				if err == nil && addr != "" && checkAdvertise(addr) != nil {
					return "", fmt.Errorf("the leading replica advertises %q, which is not ip:port", addr)
				}
				return addr, err
			}, pods.Sandbox, relayStore, log.With("component", "relay"), relayOpts...)
			if err != nil {
				return err
			}
			// Its own vault, opened when first needed: credentials
			// answered alone, and the egress proxy's while it stands by.
			var standVault *standby[vault.Vault]
			var standProfiles *standby[profile.Store]
			if vkey, _ := cfg.vaultKey(); vkey != nil {
				standVault = newStandby("vault", func(ctx context.Context) (*vault.Vault, error) {
					return vault.Open(ctx, vaultConfig(cfg, vkey))
				})
				// And its profile store, for profiles answered alone.
				standProfiles = newStandby("profile store", func(ctx context.Context) (*profile.Store, error) {
					return profile.Open(ctx, profileConfig(cfg, vkey))
				})
			}
			// The key hashes of each session's own CA, which its Chromium
			// trusts: for the sessions this replica creates and its
			// egress proxy's.
			vkey, _ := cfg.vaultKey()
			ca, err := caSecret(vkey)
			if err != nil {
				return err
			}
			// While no leader answers (one died; its lease has yet to
			// run out), it admits the connections and requests it
			// carries itself: by copies of the tenant registry and the
			// revocations stored in MinIO, read again every 2 s and not
			// used once 30 s old (standCtx ends them as it leads), and
			// by the session's Pod.
			if relayStore != nil {
				rlog := log.With("component", "relay")
				followed := tenant.Follow(standCtx, recordings.TenantsMirror{Store: relayStore, Name: cfg.Kubernetes.Namespace}, tenantSeeds(cfg), 2*time.Second, 30*time.Second, rlog)
				revoked := relayStore.FollowRevocations(standCtx, 2*time.Second, 30*time.Second, rlog)
				// And creates, each a cold start made here, admitted by
				// the sessions' Pods under the replicas' admission lease,
				// that the next leader adopts.
				scope, err := sessionScope(cfg, true)
				if err != nil {
					return err
				}
				alone := &session.Alone{
					Backend: pods, Identity: identity, ProxyURL: proxyURL(cfg), Env: sessionCAEnv(ca),
					Trails: relayStore, Scope: scope, Capacity: cfg.Capacity.MaxSessions,
					Lock: func(ctx context.Context) (func(), func() bool, error) {
						return holds.LockAdmission(ctx, identity, rlog)
					},
					Records: pods.LookEvery,
					Update:  pods.UpdateRecord,
					Adopts:  holds.AdoptsAlone,
					Log:     rlog,
				}
				relay.AdmitAlone(gateway.RelayAlone{
					Create: func(ctx context.Context, spec session.Spec, lim session.TenantLimits, extra func(context.Context, session.Info, session.Endpoint) ([]session.Event, error)) (session.Info, error) {
						runtimes, def, err := pods.Offered(ctx, cfg.DefaultRuntime)
						if err != nil {
							return session.Info{}, &session.PublicError{Class: session.ErrUnavailable, Msg: "the cluster's runtimes could not be read; retry", Err: err, RetryAfter: 2}
						}
						return alone.Create(ctx, spec, lim, runtimes, def, extra)
					},
					Tenant: func(key string) (string, session.TenantLimits, error) {
						t, err := followed.Authenticate(key)
						return t.Name, sessionLimits(t), err
					},
					Session: pods.Look,
					List:    pods.LookAll,
					Every:   pods.LookEvery,
					Tenants: followed.Copy,
					Limits:  sessionLimits,
					Runtimes: func(ctx context.Context) ([]session.Runtime, string, error) {
						runtimes, def, err := pods.Offered(ctx, cfg.DefaultRuntime)
						if err != nil {
							return nil, "", err
						}
						return session.InOrder(runtimes), def, nil
					},
					Pools: func(ctx context.Context) ([]session.PoolStats, error) {
						return pods.Pools(ctx, poolConfigs(cfg), cfg.DefaultRuntime)
					},
					Isolation: kube.RuntimeIsolation,
					Revoke:    relayStore.PutRevocation,
					Update:    pods.UpdateRecord,
					Vault:     standVault.get,
					Profiles:  standProfiles.get,
					Enabled:   followed.Enabled,
					Revoked:   revoked.Revoked,
					Refresh: func(ctx context.Context) {
						var wg sync.WaitGroup
						wg.Add(2)
						go func() { defer wg.Done(); followed.Refresh(ctx) }()
						go func() { defer wg.Done(); revoked.Refresh(ctx) }()
						wg.Wait()
					},
					Fresh: func() time.Time {
						t, r := followed.ReadAt(), revoked.ListedAt()
						if r.Before(t) {
							return r
						}
						return t
					},
				})
			}
			// Every replica serves the sessions' egress (the proxy's
			// Service sends to each): while this one stands by, it knows
			// a session by its Pod.
			if cfg.Egress.Listen != "" {
				sources, err := kube.NewSources(pods)
				if err != nil {
					return err
				}
				standEgress = &replicaEgress{sources: sources, relay: relay, vault: standVault, log: log.With("component", "egress")}
				if err := startReplicaEgress(egressStand, cfg, standEgress, ca, log); err != nil {
					return err
				}
				if pod := cfg.Kubernetes.Pod; pod != "" {
					// Once its proxy listens, its Pod joins the proxy's
					// Service (kube.LabelEgress); it leaves as the replica
					// is told to stop, its proxy serving on until it exits
					// (the Service's endpoints follow meanwhile).
					go func() {
						<-standEgress.started
						if standEgress.served {
							holds.JoinEgress(ctx, pod, log.With("component", "egress"))
						}
						<-ctx.Done()
						leaveEgress()
					}()
				} else {
					log.Warn("no kubernetes.pod (serve -pod): this replica's Pod never joins the egress proxy's Service of deploy/kubernetes, which sends only to Pods labelled sandgate.io/egress=serving")
				}
				defer func() {
					endEgressStand()
					<-standEgress.started
					leaveEgress()
					if standEgress.proxy != nil {
						standEgress.proxy.Close()
					}
					if standEgress.lead.Load() == nil {
						// Its last events go to the leader before it exits.
						relay.FlushReports(5 * time.Second)
					}
				}()
			}
			standRelay = relay
			go relay.ServeRelay(front.RelayListener(relay.RelayUsable))
			defer relay.App().ShutdownWithTimeout(5 * time.Second)
			// A replica that led in this Pod before its container
			// restarted may have left the leader's label on it.
			role.StandBy(holds)
			log.Info("sandgate replica listening", "addr", cfg.Listen, "advertise", cfg.Kubernetes.Advertise)
		}
		// Recordings are spread over the replicas: this one records what
		// it takes, standing by or leading (the leader finishes them).
		// One that cannot record still places, stops and collects them
		// when it leads.
		var record func(context.Context, kube.Work) string // nil: this replica records nothing
		if rec, err := sharedRecorder(ctx, cfg, log); err != nil {
			log.Warn("this replica records no sessions: the other replicas record those it places", "err", err)
		} else {
			heldRec = rec
			serves := kb.Serves // (kb is read again on taking the lead)
			record = func(ctx context.Context, w kube.Work) string {
				return gateway.RecordHeld(ctx, rec, w.Session, w.Params, w.TakenOver, w.Ready, w.Note, serves)
			}
		}
		recShare = kb.NewShared(identity, "recording", record, log.With("component", "recordings"))
		if standRelay != nil && heldRec != nil {
			// The sessions it creates while no leader answers have their
			// recordings placed as the leader places them: this replica
			// records, so the image has what a recording needs (a
			// replica that cannot record has them wait for a leader).
			standRelay.RecordAlone(sharedRecordings{recShare})
		}
		if knowsDead {
			// The recordings an earlier run of this Pod's container held
			// are taken over at once (after their left segments are
			// stored, below), not once their leases run out.
			pod := cfg.Kubernetes.Pod
			recShare.HoldersDead(func(h string) bool { return kube.Predecessor(pod, uid, h, identity) })
		}
		shareCtx, endShare := context.WithCancel(context.WithoutCancel(ctx))
		shared := make(chan struct{})
		go func() {
			defer close(shared)
			if heldRec != nil {
				// What this replica's last run left of recordings that
				// another replica has taken over since, before it takes
				// any (beside the start-up, not in its way: MinIO may be
				// slow).
				lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				gateway.HandLeftovers(lctx, heldRec, recShare.Params, log.With("component", "recordings"))
				cancel()
			}
			recShare.Serve(shareCtx)
		}()
		defer func() { endShare(); <-shared }()
		// A leader that loses the lease stops at once, without a drain
		// or a last flush: another replica may lead from the next
		// moment, and two must not act on the same sessions (their
		// Pods, trails and recordings). Its sessions go on in their
		// Pods; what its API acknowledged is stored already.
		lose := func() {
			log.Error("this replica no longer leads the namespace: exiting at once")
			if front != nil {
				front.Close()
			}
			os.Exit(3)
		}
		if !knowsDead {
			close(freed)
		}
		<-freed
		released, err := kb.Hold(ctx, holdCtx, identity, cfg.Kubernetes.Advertise, wait, log, lose)
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopped while standing by
			}
			return err
		}
		// Runs before endHold's defer above: given back before exiting.
		defer func() {
			endHold()
			select {
			case <-released:
			case <-time.After(10 * time.Second):
			}
		}()
		if ctx.Err() != nil {
			return nil // stopped just as it took the lead
		}
		if wait == 0 {
			// A replica may stand by for days: it leads with the config
			// as it is now (keys, tenants and signing keys removed since
			// it started must not come back), not as it was then.
			fresh, err := LoadConfig(*cfgPath)
			if err != nil {
				return fmt.Errorf("reading the config again on taking the lead: %w", err)
			}
			if fresh.Backend != cfg.Backend || fresh.Kubernetes.Namespace != cfg.Kubernetes.Namespace || fresh.Listen != cfg.Listen {
				return errors.New("the config's backend, namespace or listen address changed while this replica stood by: restart it")
			}
			fresh.Kubernetes.Advertise, fresh.Kubernetes.Pod = cfg.Kubernetes.Advertise, cfg.Kubernetes.Pod
			cfg = fresh
			if pub, err = url.Parse(cfg.PublicURL); err != nil || pub.Host == "" || (pub.Scheme != "http" && pub.Scheme != "https") {
				return fmt.Errorf("config: public_url %q must be an http(s) URL", cfg.PublicURL)
			}
			if kb, err = kubeBackend(cfg); err != nil { // its image, RuntimeClasses, seccomp as they are now
				return err
			}
		}
		if front != nil {
			front.TakingOver()
		}
		// Sessions are kept apart by the namespace's NetworkPolicy, not
		// by anything of the gateway's: say so when none governs them.
		isoCtx, isoDone := context.WithTimeout(ctx, 30*time.Second)
		iso, err := kb.Isolation(isoCtx)
		isoDone()
		if cfg.Egress.Listen != "" && (err != nil || !iso.Egress) {
			// Allow lists would be advice only: a session could go around
			// the proxy. Refused rather than pretended.
			if err != nil {
				return fmt.Errorf("egress.listen is set, but the namespace's NetworkPolicies cannot be read to check that session Pods reach nothing but the proxy: %w", err)
			}
			return fmt.Errorf("egress.listen is set, but no NetworkPolicy of namespace %s governs session Pods' egress, so allow lists would not hold: apply deploy/kubernetes/networkpolicies.yaml", kb.Namespace())
		}
		if err != nil {
			log.Warn("cannot read the namespace's NetworkPolicies; session Pods may be open to each other", "namespace", kb.Namespace(), "err", err)
		} else if !iso.Ingress || !iso.Egress {
			log.Warn("no NetworkPolicy of the namespace governs session Pods' traffic in every direction: they can reach, and be reached by, what the cluster's network allows; apply deploy/kubernetes/networkpolicies.yaml",
				"namespace", kb.Namespace(), "ingress", iso.Ingress, "egress", iso.Egress)
		}
		backend = kube.NewSessions(ctx, kb)
	} else {
		client, err = containerd.New(cfg.Containerd.Address, containerd.WithTimeout(10*time.Second))
		if err != nil {
			return fmt.Errorf("connect to containerd at %s: %w", cfg.Containerd.Address, err)
		}
		defer client.Close()
		b := &images.Builder{Client: client, CacheDir: cfg.CacheDir, Snapshotter: cfg.Containerd.Snapshotter, Log: log}
		if ref, err = b.Ensure(namespaces.WithNamespace(ctx, cfg.Containerd.Namespace), images.SessionDefinition()); err != nil {
			return fmt.Errorf("session image: %w", err)
		}
		// Each upgrade that changes the image leaves the last one (about
		// 1 GB of archive and as much unpacked): gone once nothing uses it.
		pctx, cancel := context.WithTimeout(namespaces.WithNamespace(ctx, cfg.Containerd.Namespace), 2*time.Minute)
		removed, err := b.Prune(pctx, images.SessionDefinition())
		cancel()
		if len(removed) > 0 {
			log.Info("removed earlier session images", "removed", removed)
		}
		if err != nil {
			log.Warn("earlier session images could not all be removed; the next start tries again", "err", err)
		}
	}

	store, err := recordings.New(ctx, storeConfig(cfg))
	if err != nil {
		return err
	}

	vkey, _ := cfg.vaultKey()
	var v *vault.Vault
	if vkey != nil {
		v, err = vault.Open(ctx, vaultConfig(cfg, vkey))
		if err != nil {
			return fmt.Errorf("vault: %w", err)
		}
	} else {
		log.Warn("no vault.key configured: credentials and fill_credential are unavailable")
	}
	ca, err := caSecret(vkey)
	if err != nil {
		return err
	}

	// Tenants and keys: the config's, and what the admin API added,
	// kept in the state directory. A change reaches the manager at once.
	seeds := tenantSeeds(cfg)
	var mgr *session.Manager
	// Under kubernetes the registry is in MinIO too: the replica that
	// takes the lead on another node knows what the admin API changed.
	var mirror tenant.Mirror
	if cfg.Backend == "kubernetes" {
		mirror = recordings.TenantsMirror{Store: store, Name: cfg.Kubernetes.Namespace}
	}
	reg, err := tenant.OpenMirrored(filepath.Join(cfg.StateDir, "tenants.json"), mirror, seeds, func(t tenant.Tenant) {
		if mgr != nil {
			mgr.SetTenant(t.Name, sessionLimits(t))
		}
	})
	if err != nil {
		return err
	}
	defer reg.Close()
	tenants := map[string]session.TenantLimits{}
	for _, t := range reg.List() {
		tenants[t.Name] = sessionLimits(t)
	}
	scope, err := sessionScope(cfg, kb != nil)
	if err != nil {
		return err
	}
	mgr, err = session.New(ctx, client, session.Config{
		Namespace: cfg.Containerd.Namespace, Image: ref, Snapshotter: cfg.Containerd.Snapshotter,
		StateDir: cfg.StateDir,
		Network: session.NetworkConfig{
			Bridge: cfg.Network.Bridge, Subnet: cfg.Network.Subnet, PluginDir: cfg.Network.PluginDir,
			NetNSDir: cfg.Network.NetNSDir, IPAMDir: filepath.Join(cfg.StateDir, "ipam"),
		},
		Runtimes:       session.RuntimeConfig{Runsc: cfg.Runtimes.Gvisor.Runsc},
		Backend:        backend,
		DefaultRuntime: cfg.DefaultRuntime,
		Tenants:        tenants,
		MaxSessions:    cfg.Capacity.MaxSessions,
		MinFreeDiskMB:  cfg.Capacity.MinFreeDiskMB,
		ProxyPort:      cfg.Egress.ProxyPort,
		ProxyURL:       proxyURL(cfg),
		Retention:      cfg.Sessions.Retention.Duration,
		MaxEnded:       cfg.Sessions.MaxEnded,
		Trails:         store,
		Scope:          scope,
		OrphanQuiet:    orphanQuiet(kb != nil),
		// A kubernetes gateway's successor may run on another node,
		// with none of this one's files.
		TakenOverElsewhere: kb != nil,
		Revocations:        store,
		Env:                sessionCAEnv(ca),
		Pools:              poolConfigs(cfg),
		PoolLimits: session.PoolLimits{
			MaxSessions: cfg.PoolLimits.MaxSessions, MinAvailableMemoryMB: cfg.PoolLimits.MinAvailableMemoryMB,
			MaxAge: cfg.PoolLimits.MaxAge.Duration, Freeze: cfg.PoolLimits.Freeze,
			RefillDelay: cfg.PoolLimits.RefillDelay.Duration,
		},
	}, log)
	if err != nil {
		return err
	}
	defer mgr.Close()
	if standEgress != nil {
		endEgressStand()
		<-standEgress.started
	}
	if standEgress != nil && standEgress.proxy != nil && standEgress.settings != egressSettings(cfg) {
		// The config read again on taking the lead changed egress.* or
		// the vault's key: the proxy starts again with them.
		log.Warn("the egress settings or the vault key changed since this replica started: its egress proxy starts again with them (the connections through it end)")
		standEgress.proxy.Close()
		standEgress.proxy = nil
	}
	ownEgress := false // this replica's own proxy serves
	if standEgress != nil && standEgress.proxy != nil {
		// Its connections go on; the manager knows the sessions now.
		// (Closed before the manager, as the leader's own proxy is.)
		standEgress.Lead(mgr, v)
		defer standEgress.proxy.Close()
		ownEgress = true
	} else if mgr.ProxyAddr().IsValid() || cfg.Egress.Listen != "" {
		proxy, err := startEgress(cfg, mgr, v, ca, log)
		switch {
		case err != nil && standEgress != nil && errors.Is(err, syscall.EADDRINUSE):
			// Replicas that share a host's network: another serves there.
			log.Warn("another process holds egress.listen (a replica on the same host?): this replica leads without an egress proxy of its own", "addr", cfg.Egress.Listen)
			leaveEgress()
		case err != nil:
			return err
		default:
			defer proxy.Close()
			ownEgress = true
		}
	} else {
		log.Warn("no egress proxy: sessions of this backend reach what the cluster's NetworkPolicy allows (deploy/kubernetes/networkpolicies.yaml)", "backend", mgr.Backend())
	}

	opts := []gateway.Option{gateway.WithVault(v), gateway.WithTenants(reg)}
	if vkey != nil {
		profiles, err := profile.Open(ctx, profileConfig(cfg, vkey))
		if err != nil {
			return fmt.Errorf("profiles: %w", err)
		}
		opts = append(opts, gateway.WithProfiles(profiles))
	} else {
		log.Warn("no vault.key configured: browser profiles are unavailable")
	}
	if recShare != nil {
		opts = append(opts, gateway.WithRecordingShare(sharedRecordings{recShare}))
	}
	if heldRec != nil {
		// The recorder that has recorded since this replica started
		// finishes what any replica recorded.
		opts = append(opts, gateway.WithRecorder(heldRec))
	} else if rec, err := newRecorder(cfg, store, log); err != nil {
		log.Warn("recordings are unavailable", "err", err)
	} else {
		opts = append(opts, gateway.WithRecorder(rec))
	}
	retention := map[string]time.Duration{}
	for _, t := range cfg.Tenants {
		retention[t.Name] = t.ArtifactRetention.Duration
	}
	opts = append(opts, gateway.WithRetention(retention, cfg.RetentionCheck.Duration))
	mcp, err := mcpOption(cfg, pub)
	if err != nil {
		return err
	}
	opts = append(opts, mcp)
	srv, err := gateway.New(gatewayConfig(cfg, pub), mgr, store, log, opts...)
	if err != nil {
		return err
	}
	// Sessions adopted after a restart get their recorder and download
	// watcher back; those that ended meanwhile get their artifacts final.
	mgr.Observe(srv.Observer())
	// Sessions adopted for a tenant that is disabled now (through the
	// API, or dropped from the config) stop: nothing of it runs on.
	for _, t := range reg.List() {
		if t.Disabled {
			if n := mgr.StopTenant(t.Name, "the tenant is disabled"); n > 0 {
				log.Info("stopped the sessions of a disabled tenant", "tenant", t.Name, "sessions", n)
			}
		}
	}
	log.Info("sandgate listening", "addr", cfg.Listen, "public_url", cfg.PublicURL, "image", ref)
	// Once it serves, the leader's label; as it stops leading (served,
	// drained), the label goes first, then the proxy and the lease.
	role.Lead(kb)
	defer role.StepDown(kb)
	if kb != nil && cfg.Kubernetes.Pod != "" && cfg.Egress.Listen != "" {
		// The egress proxy's Service sends to the replicas whose proxy
		// answers (this one's too), kept so while this replica holds the
		// lease, through its drain; this one leaves it as it is told to
		// stop, its proxy serving on until it exits (and if it stops
		// otherwise, before its proxy does).
		defer leaveEgress()
		go func() { <-ctx.Done(); leaveEgress() }()
		if port, err := listenPort(cfg.Egress.Listen); err != nil {
			log.Warn("the egress proxy's Service is not kept to the replicas that serve", "err", err)
		} else {
			own := ""
			if ownEgress {
				own = cfg.Kubernetes.Pod
			}
			go kb.KeepEgress(leadCtx, own, port, egress.Probe, log.With("component", "egress"))
		}
	}
	if front != nil {
		front.Lead()
		endStand()
		return srv.Serve(ctx, front.Listener())
	}
	return srv.Listen(ctx, cfg.Listen)
}

// cmdHashKey prints an API key's SHA-256, the form the config stores.
// Without an argument it makes a new key and prints both.
func cmdHashKey(args []string) error {
	key := ""
	if len(args) > 0 {
		key = args[0]
	} else {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		key = "sg_" + hex.EncodeToString(b)
		fmt.Println(key)
	}
	sum := sha256.Sum256([]byte(key))
	fmt.Println(hex.EncodeToString(sum[:]))
	return nil
}

func poolConfigs(cfg *Config) []session.PoolConfig {
	var out []session.PoolConfig
	for _, p := range cfg.Pools {
		out = append(out, session.PoolConfig{
			Kind: session.Kind(p.Kind), Runtime: p.Runtime,
			Screen: session.Screen{Width: p.Screen.Width, Height: p.Screen.Height}, Size: p.Size,
		})
	}
	return out
}

// sessionLimits is what the session manager enforces of a tenant.
// The registry's copy on a standby asks its version before its bytes.
var _ tenant.VersionedMirror = recordings.TenantsMirror{}

// tenantSeeds are the config's tenants and keys.
func tenantSeeds(cfg *Config) []tenant.Seed {
	var seeds []tenant.Seed
	for _, t := range cfg.Tenants {
		seeds = append(seeds, tenant.Seed{Tenant: tenant.Tenant{Name: t.Name, Limits: tenant.Limits{
			MaxSessions: t.MaxSessions, MaxCPUs: t.MaxCPUs, MaxMemoryMB: t.MaxMemoryMB, DefaultTTL: t.DefaultTTL.Duration,
			MaxRecordings: t.MaxRecordings, MaxCreatesPerMinute: t.MaxCreatesPerMinute, MaxArtifactBytes: t.MaxArtifactBytes,
			MaxTTL: t.MaxTTL.Duration, MaxIdle: t.MaxIdle.Duration, AllowRoot: t.AllowRoot, MaxFileBytes: t.MaxFileBytes,
			EgressAllow: t.EgressAllow,
		}}, Digests: t.APIKeySHA256})
	}
	return seeds
}

func sessionLimits(t tenant.Tenant) session.TenantLimits {
	return session.TenantLimits{
		MaxSessions: t.MaxSessions, MaxCPUs: t.MaxCPUs, MaxMemoryMB: t.MaxMemoryMB, DefaultTTL: t.DefaultTTL,
		MaxTTL: t.MaxTTL, MaxIdle: t.MaxIdle, AllowRoot: t.AllowRoot, MaxFileBytes: t.MaxFileBytes,
		EgressAllow: t.EgressAllow, Disabled: t.Disabled,
		MaxRecordings: t.MaxRecordings, MaxCreatesPerMinute: t.MaxCreatesPerMinute, MaxArtifactBytes: t.MaxArtifactBytes,
	}.WithDefaults()
}

// sharedRecordings is the replicas' recordings as the gateway uses them.
type sharedRecordings struct{ *kube.Shared }

func (r sharedRecordings) Placed(ctx context.Context) ([]gateway.PlacedRecording, error) {
	list, err := r.Shared.List(ctx)
	out := make([]gateway.PlacedRecording, 0, len(list))
	for _, p := range list {
		out = append(out, gateway.PlacedRecording{Session: p.Session, Params: p.Params, Created: p.Created})
	}
	return out, err
}

// storeConfig is where the config stores artifacts.
func storeConfig(cfg *Config) recordings.Config {
	return recordings.Config{
		Endpoint: cfg.MinIO.Endpoint, AccessKey: cfg.MinIO.AccessKey, SecretKey: cfg.MinIO.SecretKey,
		Secure: cfg.MinIO.Secure, Bucket: cfg.MinIO.Bucket, PresignTTL: cfg.MinIO.PresignTTL.Duration,
	}
}

// newRecorder is the config's recorder, storing in store.
func newRecorder(cfg *Config, store *recordings.Store, log *slog.Logger) (*recordings.Recorder, error) {
	return recordings.NewRecorder(recordings.RecorderConfig{
		Dir: filepath.Join(cfg.StateDir, "recordings"), FPS: cfg.Recording.FPS, Segment: cfg.Recording.Segment.Duration,
		Log: log.With("component", "recorder"),
	}, store)
}

// sharedRecorder is the recorder of a replica that records whatever
// sessions it takes, with a store of its own: it runs before the replica
// leads, if ever.
func sharedRecorder(ctx context.Context, cfg *Config, log *slog.Logger) (*recordings.Recorder, error) {
	store, err := recordings.New(ctx, storeConfig(cfg))
	if err != nil {
		return nil, err
	}
	return newRecorder(cfg, store, log)
}

// profileConfig is the profiles' store's config.
func profileConfig(cfg *Config, vkey []byte) profile.Config {
	return profile.Config{Endpoint: cfg.MinIO.Endpoint, AccessKey: cfg.MinIO.AccessKey, SecretKey: cfg.MinIO.SecretKey,
		Secure: cfg.MinIO.Secure, Bucket: cfg.Profiles.Bucket, VaultKey: vkey, Keep: cfg.Profiles.KeepVersions}
}

// mcpRetryFor bounds how long a replica standing by sends its MCP
// tools' calls again (a create while no replica leads): longer than a
// replica takes to take over (the lease's 15 s and the adoption), short
// enough that the retries and a cold start (up to 21 s under gVisor on
// a slow machine) end before an MCP client's usual minute. A tool's
// call is carried on by the gateway, once sent, whether its client
// still waits or not.
const mcpRetryFor = 30 * time.Second

// mcpOption serves /mcp: the MCP tools act through the gateway's own
// API over loopback (this replica's listener: the Front, while it
// stands by), with each request's API key, under the public host name.
func mcpOption(cfg *Config, pub *url.URL, opts ...sandgate.Option) (gateway.Option, error) {
	self, err := loopbackURL(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("config: listen %q: %w", cfg.Listen, err)
	}
	return gateway.WithMCP(mcpserver.Handler(self, pub.Host, version(), opts...)), nil
}

// gatewayConfig is the gateway's part of the config.
func gatewayConfig(cfg *Config, pub *url.URL) gateway.Config {
	admins := map[string]bool{}
	for _, h := range cfg.AdminKeySHA256 {
		admins[strings.ToLower(h)] = true
	}
	return gateway.Config{
		PublicURL: pub, Hosts: cfg.Hosts, AdminKeys: admins,
		TokenKeys: cfg.Tokens.Keys, ActiveKey: cfg.Tokens.ActiveKey,
		TrustedProxies: cfg.TrustedProxies, ReadTimeout: cfg.ReadTimeout.Duration, UploadTimeout: cfg.UploadTimeout.Duration,
		DrainTimeout: cfg.DrainTimeout.Duration,
		CDP:          gateway.CDPLimits{ClientMessage: cfg.Limits.CDPClientMessageBytes, BrowserMessage: cfg.Limits.CDPBrowserMessageBytes},
		Downloads:    browser.DownloadLimits{Bytes: cfg.Limits.DownloadBytes, PerSession: cfg.Limits.DownloadsPerSession},
		Keep: gateway.ProfileLimits{MaxProfileBytes: cfg.Profiles.MaxBytes, MaxSnapshotBytes: cfg.Profiles.MaxSnapshotBytes,
			MaxEntries: cfg.Profiles.MaxEntries},
	}
}

// listensAt reports whether ln holds address's port on its address, or
// on every address of the host (address is ip:port).
func listensAt(ln net.Listener, address string) bool {
	want, err := netip.ParseAddrPort(address)
	if err != nil {
		return false
	}
	tcp, ok := ln.Addr().(*net.TCPAddr)
	if !ok || tcp.Port != int(want.Port()) {
		return false
	}
	got, ok := netip.AddrFromSlice(tcp.IP)
	return ok && (got.IsUnspecified() || got.Unmap() == want.Addr().Unmap())
}

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// sessionScope names where this gateway's sandboxes live (session.Config
// Scope): a cluster's namespace, whichever replica leads, or this host's
// gateway (a random name kept in its state directory) and containerd
// namespace. Gateways that share a bucket but not a scope do not
// finalise each other's sessions; deployments on clusters that share a
// bucket need namespaces of their own (the tenant registry's copy in
// MinIO is named by the namespace too).
func sessionScope(cfg *Config, kubernetes bool) (string, error) {
	if kubernetes {
		return "kubernetes/" + cfg.Kubernetes.Namespace, nil
	}
	p := filepath.Join(cfg.StateDir, "scope")
	if b, err := os.ReadFile(p); err == nil && len(strings.TrimSpace(string(b))) == 32 {
		return "containerd/" + strings.TrimSpace(string(b)) + "/" + cfg.Containerd.Namespace, nil
	}
	var r [16]byte
	rand.Read(r[:])
	id := hex.EncodeToString(r[:])
	if err := os.WriteFile(p+".new", []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("the gateway's scope: %w", err)
	}
	if err := os.Rename(p+".new", p); err != nil {
		return "", fmt.Errorf("the gateway's scope: %w", err)
	}
	return "containerd/" + id + "/" + cfg.Containerd.Namespace, nil
}

// orphanQuiet is how long a trail must have been left unwritten before
// a gateway finalises its session from the store (session.Config
// OrphanQuiet): under Kubernetes, a leader paused for longer than its
// lease (and so taken over) but less than this, that wakes and writes
// before it sees it lost the lease, does not find its session
// finalised under it. A host's gateway has no other to wait for.
func orphanQuiet(kubernetes bool) time.Duration {
	if kubernetes {
		return 4 * kube.HoldDuration
	}
	return 0
}
