package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// LabelEgress is on the Pod of each gateway replica whose egress proxy
// serves, and the egress proxy's Service selects EgressServing only. A
// replica puts EgressPending on its own Pod once its proxy listens, and
// takes the label off as it stops; the leader probes each labelled
// Pod's proxy at the Pod's IP (KeepEgress) and makes it EgressServing
// while it answers, EgressPending once it has not for a while. So a
// replica whose node died, or whose process hangs, leaves the Service
// within seconds, where its Pod may stay for minutes (and with the
// Service's publishNotReadyAddresses, in its endpoints).
const (
	LabelEgress   = "sandgate.io/egress"
	EgressServing = "serving"
	EgressPending = "pending"
)

// Probing of KeepEgress: a labelled Pod's proxy is asked every
// egressProbeEvery, given egressProbeWait to answer, and is no longer
// served to sessions once it has not answered egressProbeMisses times
// in a row (about 10 s to 25 s). The wait is longer than a standing-by
// replica's proxy takes at most to refuse the probe's source (it asks
// the API server, 5 s at most): an API server that is slow does not
// take replicas out.
const (
	egressProbeEvery  = 2 * time.Second
	egressProbeWait   = 6 * time.Second
	egressProbeMisses = 3
)

// JoinEgress labels pod, this replica's own, EgressPending (unless it
// has the label already), in the background, trying again until it
// succeeds or ctx ends: its proxy listens, and the leader's probe will
// tell whether sessions reach it.
func (b *Backend) JoinEgress(ctx context.Context, pod string, log *slog.Logger) {
	go keepTrying(ctx, log, "label this replica's Pod as serving egress", func(ctx context.Context) error {
		return b.updateGatewayPod(ctx, pod, func(p *corev1.Pod) bool {
			if _, ok := p.Labels[LabelEgress]; ok {
				return false
			}
			p.Labels[LabelEgress] = EgressPending
			return true
		})
	})
}

// LeaveEgress takes the label off pod, this replica's own, as its proxy
// stops: no session is sent there from then on (once the Service's
// endpoints follow).
func (b *Backend) LeaveEgress(ctx context.Context, pod string) error {
	err := b.updateGatewayPod(ctx, pod, func(p *corev1.Pod) bool {
		if _, ok := p.Labels[LabelEgress]; !ok {
			return false
		}
		delete(p.Labels, LabelEgress)
		return true
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// KeepEgress, run by the leader until ctx ends, probes the proxy of each
// gateway Pod labelled LabelEgress at the Pod's IP and the given port,
// and labels it EgressServing while it answers, EgressPending once it
// has missed egressProbeMisses probes in a row. own, this replica's Pod
// ("": its proxy does not serve there), is labelled first. probe says
// whether a Sandgate egress proxy answers at an address (egress.Probe).
//
// The probes come from the leader's network, and a fault on its side
// (its node cut off from the other Pods, out of files) would look like
// every other replica's. So it takes none out in a round where two or
// more others that serve were probed and none answered, and never the
// last Pod that serves: it says so instead.
func (b *Backend) KeepEgress(ctx context.Context, own string, port uint16, probe func(context.Context, netip.AddrPort) error, log *slog.Logger) {
	if own != "" {
		b.JoinEgress(ctx, own, log)
	}
	k := &egressKeeper{b: b, own: own, port: port, probe: probe, log: log, missed: map[string]int{}}
	for {
		if err := k.round(ctx); err != nil && ctx.Err() == nil {
			k.warn("cannot keep the egress proxy's Service to the replicas that serve; trying again", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(egressProbeEvery):
		}
	}
}

// egressKeeper is KeepEgress's state between rounds.
type egressKeeper struct {
	b      *Backend
	own    string
	port   uint16
	probe  func(context.Context, netip.AddrPort) error
	log    *slog.Logger
	missed map[string]int // by Pod UID
	warned time.Time
}

// warn logs, at most once a minute.
func (k *egressKeeper) warn(msg string, args ...any) {
	if time.Since(k.warned) > time.Minute {
		k.warned = time.Now()
		k.log.Warn(msg, args...)
	}
}

// round probes every labelled Pod at once, then writes the labels that
// change.
func (k *egressKeeper) round(ctx context.Context) error {
	b, port, probe, missed, log := k.b, k.port, k.probe, k.missed, k.log
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	l, err := b.client.CoreV1().Pods(b.cfg.Namespace).List(lctx, metav1.ListOptions{LabelSelector: LabelEgress})
	cancel()
	if err != nil {
		return err
	}
	type result struct {
		pod      *corev1.Pod
		answered bool
		err      error
	}
	results := make([]result, len(l.Items))
	var wg sync.WaitGroup
	for i := range l.Items {
		p := &l.Items[i]
		results[i].pod = p
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if isSessionPod(p.Labels) || err != nil || p.Status.Phase != corev1.PodRunning {
			// A session's Pod is never a proxy; a Pod that does not run
			// (not yet, or no longer: its address may be another's now)
			// does not answer.
			results[i].err = fmt.Errorf("pod %s does not run with an address", p.Name)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, egressProbeWait)
			defer cancel()
			results[i].err = probe(pctx, netip.AddrPortFrom(ip, port))
			results[i].answered = results[i].err == nil
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	// What the leader's own side can be blamed for: the other Pods that
	// serve, and how many of them answered (one out already, its node
	// dead, says nothing of the leader); the Pods that serve after this
	// round, unless taken out.
	others, othersAnswered, serving := 0, 0, 0
	for _, r := range results {
		if isSessionPod(r.pod.Labels) {
			continue
		}
		if r.pod.Name != k.own && r.pod.Labels[LabelEgress] == EgressServing {
			others++
			if r.answered {
				othersAnswered++
			}
		}
		if r.answered || r.pod.Labels[LabelEgress] == EgressServing {
			serving++
		}
	}
	holdBack := others >= 2 && othersAnswered == 0
	listed := map[string]bool{}
	var errs []error
	for _, r := range results {
		p := r.pod
		uid := string(p.UID)
		listed[uid] = true
		if isSessionPod(p.Labels) {
			continue
		}
		state := p.Labels[LabelEgress]
		var to string
		if r.answered {
			missed[uid] = 0
			if state != EgressServing {
				to = EgressServing
			}
		} else {
			missed[uid]++
			if missed[uid] >= egressProbeMisses && state != EgressPending {
				to = EgressPending
			}
		}
		if to == EgressPending && (holdBack || serving <= 1) {
			k.warn("gateway replicas' egress proxies do not answer this replica's probes, but it takes none out of the egress proxy's Service: none of the others answers, or this one is the last that serves (the fault may be on this replica's side)",
				"pod", p.Name, "err", r.err, "others", others, "answered", othersAnswered)
			continue
		}
		if to == "" {
			continue
		}
		if to == EgressPending {
			serving--
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := b.updateGatewayPod(wctx, p.Name, func(q *corev1.Pod) bool {
			cur, ok := q.Labels[LabelEgress]
			if !ok || cur == to || q.UID != p.UID {
				return false // its replica left meanwhile, or a new Pod has the name
			}
			q.Labels[LabelEgress] = to
			return true
		})
		cancel()
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			errs = append(errs, err)
		case to == EgressServing:
			log.Info("a gateway replica's egress proxy answers: sessions are sent there", "pod", p.Name)
		default:
			log.Warn("a gateway replica's egress proxy does not answer: sessions are no longer sent there", "pod", p.Name, "err", r.err, "missed", missed[uid])
		}
	}
	for uid := range missed {
		if !listed[uid] {
			delete(missed, uid)
		}
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// updateGatewayPod reads the gateway replica's Pod name, lets change
// edit it (false: nothing to change) and writes it back, again on a
// conflict. It refuses a session's Pod.
func (b *Backend) updateGatewayPod(ctx context.Context, name string, change func(*corev1.Pod) bool) error {
	pods := b.client.CoreV1().Pods(b.cfg.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if isSessionPod(p.Labels) {
			return fmt.Errorf("pod %s is a session's, not a gateway replica's", name)
		}
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		if !change(p) {
			return nil
		}
		_, err = pods.Update(ctx, p, metav1.UpdateOptions{})
		return err
	})
}
