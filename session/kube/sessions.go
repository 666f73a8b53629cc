package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"

	"github.com/sandgate/sandgate/session"
)

// Sessions is the backend as the session manager drives it
// (session.Backend): each session's sandbox is a Pod, its record the
// Pod's info annotation, its address the Pod's IP.
//
// What it does not do (yet): freeze a sandbox (warm pools need the
// containerd backend), run a command as root (session Pods run as
// non-root), bound a Pod's process count (that is the kubelet's
// podPidsLimit, set per node), or kill a command whose exec stream it
// closed (the exec API has no signal: the stream ends, and a command
// with a terminal gets SIGHUP).
type Sessions struct {
	b *Backend
	// base outlives requests: the waits on Pods use it, and the watch of
	// the session Pods' ends runs as long as it.
	base     context.Context
	endsOnce sync.Once
	podEnds  *podEnds
	// recordHook: whom the watch tells of a record's change
	// (WatchRecords).
	recordHook atomic.Pointer[func(rec map[string]string)]
}

var (
	_ session.Backend       = (*Sessions)(nil)
	_ session.RecordWatcher = (*Sessions)(nil)
	_ session.RecordUpdater = (*pod)(nil)
)

// NewSessions drives b for the session manager; base bounds its waits.
func NewSessions(base context.Context, b *Backend) *Sessions {
	return &Sessions{b: b, base: base}
}

func (s *Sessions) Name() string { return "kubernetes" }

// Ready asks the API server for its version.
func (s *Sessions) Ready(ctx context.Context) error {
	_, err := s.b.client.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw()
	return err
}

// isolation is what each runtime isolates with, as the containerd
// backend reports it.
var isolation = map[string]string{"kata": "vm", "gvisor": "kernel", "runc": "container"}

// Runtimes reports a runtime usable when the configuration names a
// RuntimeClass for it and the cluster has that class.
func (s *Sessions) Runtimes(ctx context.Context) map[string]*session.Runtime {
	out, _ := s.Probe(ctx)
	return out
}

// Probe is Runtimes, with the first lookup that failed but for a
// RuntimeClass that is not there (the API server did not answer, say):
// what a replica that stands by says the runtimes by, which answers
// nothing rather than a runtime unusable for a moment.
func (s *Sessions) Probe(ctx context.Context) (map[string]*session.Runtime, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out := map[string]*session.Runtime{}
	var failed error
	for name, iso := range isolation {
		rt := &session.Runtime{Name: name, Isolation: iso}
		if class, err := s.b.RuntimeClass(ctx, name); err != nil {
			rt.Reason = err.Error()
			if !errors.Is(err, ErrRuntimeMissing) && failed == nil {
				failed = err
			}
		} else {
			rt.Usable, rt.Version = true, "RuntimeClass "+class
		}
		out[name] = rt
	}
	return out, failed
}

// Create creates the session's Pod and waits until it runs.
func (s *Sessions) Create(ctx context.Context, info session.Info, rt *session.Runtime, record map[string]string, host session.Host) (session.Sandbox, <-chan session.Exit, error) {
	raw, err := json.Marshal(record)
	if err != nil {
		return nil, nil, err
	}
	spec := Spec{ID: info.ID, Tenant: info.Tenant, Runtime: rt.Name, Expires: info.ExpiresAt, Deadline: host.Deadline,
		CPUs: info.Resources.CPUs, MemoryMB: info.Resources.MemoryMB, Env: host.Env, Info: string(raw)}
	sb := &pod{s: s, id: info.ID}
	fail := func(err error) (session.Sandbox, <-chan session.Exit, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if rerr := sb.Remove(cctx); rerr != nil {
			err = fmt.Errorf("%w (and removing the Pod: %v)", err, rerr)
		}
		return nil, nil, err
	}
	if err := s.b.Create(ctx, spec); err != nil {
		switch {
		case errors.Is(err, ErrRuntimeMissing):
			return nil, nil, &session.PublicError{Class: session.ErrUnavailableRuntime, Msg: fmt.Sprintf("runtime %q is not available on this cluster", rt.Name), Err: err}
		case errors.Is(err, ErrInvalid):
			return nil, nil, &session.PublicError{Class: session.ErrInvalid, Msg: "the session cannot run as a Pod", Err: err}
		}
		// The API server may have stored the Pod all the same (a create
		// cancelled on the way back): it goes too.
		return fail(err)
	}
	host.Done("pod")
	p, err := s.b.Wait(ctx, info.ID)
	if err != nil {
		return fail(err)
	}
	sb.addr = p.Addr
	host.Done("running")
	// Where Chromium saves downloads, which the gateway reads through
	// exec; the containerd backend's manager makes it on the host.
	var stderr limited
	if code, err := s.b.Run(ctx, info.ID, Exec{Args: []string{"mkdir", "-p", session.DownloadDir}, Stderr: &stderr}); err != nil || code != 0 {
		return fail(fmt.Errorf("make the downloads directory: exit %d, %v: %s", code, err, stderr.b))
	}
	exited, err := sb.Wait(s.base)
	if err != nil {
		return fail(err)
	}
	return sb, exited, nil
}

// limited keeps the first KiB written to it.
type limited struct{ b []byte }

func (l *limited) Write(p []byte) (int, error) {
	if room := 1024 - len(l.b); room > 0 {
		l.b = append(l.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// List returns the session Pods of the namespace.
func (s *Sessions) List(ctx context.Context) ([]session.Sandbox, error) {
	pods, err := s.b.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	out := make([]session.Sandbox, 0, len(pods))
	for _, p := range pods {
		out = append(out, &pod{s: s, id: p.ID, addr: p.Addr})
	}
	return out, nil
}

// Sandbox is the Pod of session id, to run commands in (the address
// and record are not read): a replica that stands by carries a shell
// the leader admitted straight to the Pod.
func (s *Sessions) Sandbox(id string) session.Sandbox { return &pod{s: s, id: id} }

// Sweep has nothing to do: the kubelet removes what a Pod held.
func (s *Sessions) Sweep(func(string) bool) {}

// pod is one session's Pod.
type pod struct {
	s    *Sessions
	id   string
	addr netip.Addr
}

func (p *pod) ID() string                 { return p.id }
func (p *pod) Addr() netip.Addr           { return p.addr }
func (p *pod) CPU() (time.Duration, bool) { return 0, false }

func (p *pod) get(ctx context.Context) (*corev1.Pod, error) {
	o, err := p.s.b.client.CoreV1().Pods(p.s.b.cfg.Namespace).Get(ctx, podName(p.id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: %v", session.ErrSandboxGone, err)
	}
	return o, err
}

// Record reads the session's record from the Pod's info annotation, with
// the Pod's IP as its address.
func (p *pod) Record(ctx context.Context) (map[string]string, error) {
	o, err := p.get(ctx)
	if err != nil {
		return nil, err
	}
	return record(o)
}

func record(o *corev1.Pod) (map[string]string, error) {
	r := map[string]string{}
	if err := json.Unmarshal([]byte(o.Annotations[AnnInfo]), &r); err != nil {
		return nil, fmt.Errorf("pod %s: annotation %s: %w (%w)", o.Name, AnnInfo, session.ErrRecordUnreadable, err)
	}
	if a, err := netip.ParseAddr(o.Status.PodIP); err == nil {
		r[session.RecordAddr] = a.String()
	}
	// The API server's, which no update changes.
	if !o.CreationTimestamp.IsZero() {
		r[session.RecordMade] = o.CreationTimestamp.UTC().Format(time.RFC3339Nano)
	}
	return r, nil
}

// SetRecord changes the keys given (an empty value removes one), as a
// write conditional on the Pod's version, retried on conflict.
func (p *pod) SetRecord(ctx context.Context, change map[string]string) (map[string]string, error) {
	return p.UpdateRecord(ctx, func(map[string]string) (map[string]string, error) { return change, nil })
}

// UpdateRecord is Sessions.UpdateRecord of the Pod's session
// (session.RecordUpdater).
func (p *pod) UpdateRecord(ctx context.Context, change func(rec map[string]string) (map[string]string, error)) (map[string]string, error) {
	rec, _, err := p.s.UpdateRecord(ctx, p.id, func(rec map[string]string, _ bool) (map[string]string, error) { return change(rec) })
	return rec, err
}

// UpdateRecord changes session id's record by what change makes of it
// (the record as the Pod has it, with its address, and whether the Pod
// runs and is not being deleted): the keys to set, an empty value
// removing one; none, nothing is written. The write is conditional on
// the Pod's version change read: on a conflict (another writer came
// first) the Pod is read again and change asked again, so that what it
// checked holds as it is written. change's error ends it, as is. The
// record and running are the Pod's as written (or as read, when
// nothing was). A Pod whose record cannot be read holds no session, as
// one gone: session.ErrSandboxGone.
func (s *Sessions) UpdateRecord(ctx context.Context, id string, change func(rec map[string]string, running bool) (map[string]string, error)) (map[string]string, bool, error) {
	p := &pod{s: s, id: id}
	var out map[string]string
	var running bool
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		o, err := p.get(ctx)
		if err != nil {
			return err
		}
		r, err := record(o)
		if err != nil {
			return fmt.Errorf("%w: %v", session.ErrSandboxGone, err)
		}
		running = o.Status.Phase == corev1.PodRunning && o.DeletionTimestamp == nil
		set, err := change(maps.Clone(r), running)
		if err != nil || len(set) == 0 {
			out = r
			return err
		}
		for k, v := range set {
			if v == "" {
				delete(r, k)
			} else {
				r[k] = v
			}
		}
		// The Pod's IP and creation, read afresh each time.
		delete(r, session.RecordAddr)
		delete(r, session.RecordMade)
		raw, err := json.Marshal(r)
		if err != nil {
			return err
		}
		o.Annotations[AnnInfo] = string(raw)
		mirrorLabels(o, r)
		// o carries the resourceVersion it was read at: the API server
		// refuses the write (409) if the Pod changed since.
		_, err = s.b.client.CoreV1().Pods(s.b.cfg.Namespace).Update(ctx, o, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: %v", session.ErrSandboxGone, err)
		}
		if err != nil {
			return err
		}
		out, err = record(o)
		return err
	})
	return out, running, err
}

// mirrorLabels keeps the Pod's tenant and expiry labels what its record
// says (a warm Pod claimed by a tenant, a session extended).
func mirrorLabels(o *corev1.Pod, r map[string]string) {
	if o.Labels == nil {
		o.Labels = map[string]string{}
	}
	if t := r[session.RecordTenant]; t != "" && len(validation.IsValidLabelValue(t)) == 0 {
		o.Labels[LabelTenant] = t
	} else {
		delete(o.Labels, LabelTenant)
	}
	if exp, err := time.Parse(time.RFC3339Nano, r[session.RecordExpires]); err == nil {
		o.Labels[LabelExpires] = strconv.FormatInt(exp.Unix(), 10)
	}
}

func (p *pod) Running(ctx context.Context) (bool, error) {
	o, err := p.get(ctx)
	if err != nil {
		return false, err
	}
	return o.Status.Phase == corev1.PodRunning && o.DeletionTimestamp == nil, nil
}

// ended says whether a Pod has ended, and its container's exit code. A
// Pod being deleted (by anyone: an eviction, a drain) counts as ended at
// once: its address may go to another Pod before its phase says so, and
// the egress proxy must not take that Pod for the session.
func ended(o *corev1.Pod) (int, bool) {
	if o.DeletionTimestamp != nil {
		return -1, true
	}
	if o.Status.Phase != corev1.PodFailed && o.Status.Phase != corev1.PodSucceeded {
		return 0, false
	}
	for _, c := range o.Status.ContainerStatuses {
		if t := c.State.Terminated; t != nil {
			return int(t.ExitCode), true
		}
	}
	return -1, true
}

// Wait reports the Pod's end (or its going). The ends of all session
// Pods come from one watch of the namespace (an informer), not one per
// Pod; a watch the server closes is opened again by the informer, which
// lists the Pods again when it cannot go on where it was.
func (p *pod) Wait(ctx context.Context) (<-chan session.Exit, error) {
	ends := p.s.ends()
	name := podName(p.id)
	// Listened for before the Pod is read, and the watch's first list
	// in: an end in between is not missed.
	ch := ends.listen(name)
	sctx, cancel := context.WithTimeout(ctx, syncWait)
	// (Not listed in time: the Pod's end comes once it is; meanwhile,
	// the Pod as it is now.)
	cache.WaitForCacheSync(sctx.Done(), ends.synced)
	cancel()
	o, err := p.get(ctx)
	if err != nil {
		ends.forget(name, ch)
		return nil, err
	}
	out := make(chan session.Exit, 1)
	if code, done := ended(o); done {
		ends.forget(name, ch)
		out <- session.Exit{Code: code}
		return out, nil
	}
	go func() {
		select {
		case e := <-ch:
			out <- e
		case <-ctx.Done():
			ends.forget(name, ch)
			out <- session.Exit{Err: ctx.Err()}
		}
	}()
	return out, nil
}

// Look is session id's record, and whether its Pod runs (and is not
// being deleted), read from the API server: what a replica that stands
// by admits a connection by while no leader answers. (Not from a
// watch's cache: a watch that stalled would keep an ended session's
// address, which may have gone to another tenant's Pod since.) A Pod
// whose record cannot be read holds no session: an empty record.
func (s *Sessions) Look(ctx context.Context, id string) (map[string]string, bool, error) {
	o, err := (&pod{s: s, id: id}).get(ctx)
	if err != nil {
		return nil, false, err
	}
	r, err := record(o)
	if err != nil {
		r = map[string]string{}
	}
	return r, o.Status.Phase == corev1.PodRunning && o.DeletionTimestamp == nil, nil
}

// Looked is a session Pod's record, and whether it runs (Look).
type Looked = session.RecordSeen

// maxLooked bounds the Pods LookAll reads (in pages of lookPage).
const (
	maxLooked = 10000
	lookPage  = 500
)

// LookAll is Look for each session Pod of tenant's (by the record's
// tenant, the Pod's label only narrowing the list), read from the API
// server in pages: what a replica that stands by lists a tenant's
// sessions by while no leader answers. Warm Pods not claimed, and Pods
// whose record cannot be read, are left out.
func (s *Sessions) LookAll(ctx context.Context, tenant string) ([]Looked, error) {
	set := labels.Set{LabelManaged: managedBy}
	if len(validation.IsValidLabelValue(tenant)) == 0 {
		set[LabelTenant] = tenant
	}
	return s.look(ctx, set, func(rec map[string]string) bool { return rec[session.RecordTenant] == tenant })
}

// LookEvery is LookAll for every tenant's session Pods: what a replica
// that stands by shows the tenants' usage by, to the admin API.
func (s *Sessions) LookEvery(ctx context.Context) ([]Looked, error) {
	return s.look(ctx, labels.Set{LabelManaged: managedBy}, func(rec map[string]string) bool { return rec[session.RecordTenant] != "" })
}

// Offered is what a replica that stands by says the runtimes by: each
// as the cluster has its RuntimeClass now (Probe), the default picked
// as a leader picks it (session.Offered). A configured default whose
// class is gone stays the default, listed as not usable with the
// reason: the leader, which checked it at its start, says it is the
// default too.
func (s *Sessions) Offered(ctx context.Context, configured string) (map[string]*session.Runtime, string, error) {
	found, err := s.Probe(ctx)
	if err != nil {
		return nil, "", err
	}
	runtimes, def, err := session.Offered(s.Name(), found, configured)
	if err != nil {
		runtimes, _, err = session.Offered(s.Name(), found, "")
		def = configured
	}
	return runtimes, def, err
}

// Pools is what a replica that stands by says the warm pools of cfgs by
// (session.PoolsOf): checked against the runtimes it is Offered, and
// counted from their Pods. None configured asks the cluster nothing.
func (s *Sessions) Pools(ctx context.Context, cfgs []session.PoolConfig, configured string) ([]session.PoolStats, error) {
	if len(cfgs) == 0 {
		return []session.PoolStats{}, nil
	}
	runtimes, def, err := s.Offered(ctx, configured)
	if err != nil {
		return nil, err
	}
	looked, err := s.LookPools(ctx)
	if err != nil {
		return nil, err
	}
	return session.PoolsOf(cfgs, runtimes, def, looked)
}

// LookPools is Look for every warm Pod not claimed: what a replica that
// stands by says the pools by.
func (s *Sessions) LookPools(ctx context.Context) ([]Looked, error) {
	return s.look(ctx, labels.Set{LabelManaged: managedBy}, func(rec map[string]string) bool { return rec[session.RecordPool] != "" })
}

// look lists the session Pods set selects, in pages, keeping those
// whose record keep takes.
func (s *Sessions) look(ctx context.Context, set labels.Set, keep func(rec map[string]string) bool) ([]Looked, error) {
	opts := metav1.ListOptions{LabelSelector: labels.SelectorFromSet(set).String(), Limit: lookPage}
	var out []Looked
	for read := 0; ; {
		list, err := s.b.client.CoreV1().Pods(s.b.cfg.Namespace).List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list pods: %w", err)
		}
		if read += len(list.Items); read > maxLooked {
			return nil, fmt.Errorf("more than %d session pods", maxLooked)
		}
		for i := range list.Items {
			o := &list.Items[i]
			r, err := record(o)
			if err != nil || !keep(r) {
				continue
			}
			out = append(out, Looked{Record: r, Running: o.Status.Phase == corev1.PodRunning && o.DeletionTimestamp == nil})
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out, nil
		}
	}
}

// RuntimeIsolation is what runtime isolates with ("" for none known),
// as the containerd backend reports it.
func RuntimeIsolation(runtime string) string { return isolation[runtime] }

// podEnds hands each session Pod's end to those waiting for it, from
// one informer over the namespace's session Pods.
type podEnds struct {
	mu      sync.Mutex
	waiting map[string]map[chan session.Exit]struct{} // by Pod name
	synced  cache.InformerSynced
}

// syncWait bounds how long a wait waits for the watch's first list.
const syncWait = 30 * time.Second

// ends starts the informer the first time it is needed; it runs as
// long as the backend's base context.
func (s *Sessions) ends() *podEnds {
	s.endsOnce.Do(func() {
		e := &podEnds{waiting: map[string]map[chan session.Exit]struct{}{}}
		s.podEnds = e
		sel := labels.SelectorFromSet(labels.Set{LabelManaged: managedBy}).String()
		factory := informers.NewSharedInformerFactoryWithOptions(s.b.client, 0, informers.WithNamespace(s.b.cfg.Namespace),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
		seen := func(obj any) {
			if o, ok := obj.(*corev1.Pod); ok {
				if code, done := ended(o); done {
					e.end(o.Name, code)
				}
			}
		}
		inf := factory.Core().V1().Pods().Informer()
		e.synced = inf.HasSynced
		inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) {
				seen(obj)
				s.recordAdded(obj)
			},
			UpdateFunc: func(was, o any) {
				seen(o)
				s.recordChanged(was, o)
			},
			DeleteFunc: func(obj any) {
				if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = t.Obj
				}
				if o, ok := obj.(*corev1.Pod); ok {
					e.end(o.Name, -1)
				}
			},
		})
		factory.Start(s.base.Done())
	})
	return s.podEnds
}

// WatchRecords calls changed with a session Pod's record each time the
// watch sees it (its info annotation) change, this replica's writes
// too, from the watch's first list on, in the order written
// (session.RecordWatcher).
func (s *Sessions) WatchRecords(changed func(rec map[string]string)) {
	s.recordHook.Store(&changed)
	s.ends() // the informer, started
}

// recordAdded hands the record of a Pod the watch sees first (at its
// first list, or made since) to the hook WatchRecords set, if any, when
// a replica standing by made it (session.RecordCreatedAlone): the
// leader adopts it, or awaits its due time. (The others are the
// leader's own, or adopted at its start.)
func (s *Sessions) recordAdded(obj any) {
	hook := s.recordHook.Load()
	o, ok := obj.(*corev1.Pod)
	if hook == nil || !ok {
		return
	}
	if r, err := record(o); err == nil && r[session.RecordCreatedAlone] != "" {
		(*hook)(r)
	}
}

// recordChanged hands the record of a Pod whose info annotation changed
// from was to o to the hook WatchRecords set, if any.
func (s *Sessions) recordChanged(was, o any) {
	hook := s.recordHook.Load()
	before, ok1 := was.(*corev1.Pod)
	after, ok2 := o.(*corev1.Pod)
	if hook == nil || !ok1 || !ok2 || before.Annotations[AnnInfo] == after.Annotations[AnnInfo] {
		return
	}
	if r, err := record(after); err == nil {
		(*hook)(r)
	}
}

func (e *podEnds) listen(name string) chan session.Exit {
	ch := make(chan session.Exit, 1)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.waiting[name] == nil {
		e.waiting[name] = map[chan session.Exit]struct{}{}
	}
	e.waiting[name][ch] = struct{}{}
	return ch
}

func (e *podEnds) forget(name string, ch chan session.Exit) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.waiting[name], ch)
	if len(e.waiting[name]) == 0 {
		delete(e.waiting, name)
	}
}

func (e *podEnds) end(name string, code int) {
	e.mu.Lock()
	chs := e.waiting[name]
	delete(e.waiting, name)
	e.mu.Unlock()
	for ch := range chs {
		ch <- session.Exit{Code: code} // buffered, and sent to once
	}
}

var errNoFreeze = errors.New("the kubernetes backend cannot freeze a Pod")

func (p *pod) Freeze(context.Context) error { return errNoFreeze }
func (p *pod) Thaw(context.Context) error   { return nil } // never frozen

// Remove deletes the Pod and waits until it is gone (its containers
// stopped), within ctx.
func (p *pod) Remove(ctx context.Context) error {
	if err := p.s.b.Delete(ctx, p.id, time.Second); err != nil {
		return err
	}
	return p.s.b.Gone(ctx, p.id)
}

// Exec runs a command through the Pod exec API, as the session's user.
func (p *pod) Exec(ctx context.Context, spec session.ExecSpec, env []string) (session.ExecProc, error) {
	if spec.Root {
		return nil, &session.PublicError{Class: session.ErrInvalid, Msg: "commands cannot run as root under the kubernetes backend: session Pods run as non-root"}
	}
	if len(spec.Env) > 0 {
		// The exec API takes no environment: it would travel in the exec
		// request's URL, which the API server's audit log keeps.
		return nil, &session.PublicError{Class: session.ErrInvalid, Msg: "env is not passed to commands under the kubernetes backend: it would travel in the Pod exec request's URL, which the API server logs; write it to a file in the session instead"}
	}
	cwd := spec.Cwd
	if strings.HasPrefix(cwd, "/") {
		cwd = path.Clean(cwd)
	}
	e := Exec{Args: spec.Args, Env: env, Cwd: cwd, Stdin: spec.Stdin, StdinSize: spec.StdinSize, Stdout: spec.Stdout, Stderr: spec.Stderr, Terminal: spec.Terminal}
	if err := e.Check(); err != nil { // refused now, not as the command's end
		return nil, &session.PublicError{Class: session.ErrInvalid, Msg: "the command cannot run in the session: " + strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "), Err: err}
	}
	ctx, cancel := context.WithCancel(ctx)
	pp := &podProc{exited: make(chan session.Exit, 1), done: make(chan struct{}), cancel: cancel}
	if spec.Terminal {
		pp.sizes = make(chan TermSize, 4)
		pp.sizes <- TermSize{Cols: max(spec.Cols, 1), Rows: max(spec.Rows, 1)}
		e.Sizes = pp.sizes
	}
	go func() {
		defer close(pp.done)
		defer cancel() // ends the terminal size queue with the stream
		code, err := p.s.b.Run(ctx, p.id, e)
		if errors.Is(err, ErrInvalid) {
			err = &session.PublicError{Class: session.ErrInvalid, Msg: "the command cannot run in the session", Err: err}
		}
		pp.exited <- session.Exit{Code: code, Err: err}
	}()
	return pp, nil
}

// podProc is a command run through the exec API: its stream is the
// command, as far as the API lets the gateway see it.
type podProc struct {
	exited chan session.Exit
	done   chan struct{} // closed when the stream has ended
	cancel context.CancelFunc
	sizes  chan TermSize
	mu     sync.Mutex
}

func (pp *podProc) Exited() <-chan session.Exit { return pp.exited }

// Copied: the stream carries the output, so it is copied once it ends.
func (pp *podProc) Copied() <-chan struct{} { return pp.done }
func (pp *podProc) CancelIO()               { pp.cancel() }

// Signal closes the stream for SIGKILL and SIGTERM; the exec API carries
// no signals.
func (pp *podProc) Signal(_ context.Context, sig syscall.Signal) error {
	if sig != syscall.SIGKILL && sig != syscall.SIGTERM {
		return fmt.Errorf("the kubernetes backend cannot send %v to a command", sig)
	}
	pp.cancel()
	return nil
}

// Resize passes the terminal's new size on, dropping one not yet sent.
func (pp *podProc) Resize(_ context.Context, cols, rows uint16) error {
	if pp.sizes == nil {
		return errors.New("the command has no terminal")
	}
	pp.mu.Lock()
	defer pp.mu.Unlock()
	select {
	case <-pp.done:
		return errors.New("the command has ended")
	default:
	}
	for {
		select {
		case pp.sizes <- TermSize{Cols: cols, Rows: rows}:
			return nil
		default:
			select {
			case <-pp.sizes:
			default:
			}
		}
	}
}

// Delete ends the stream and waits for it, within ctx.
func (pp *podProc) Delete(ctx context.Context) error {
	pp.cancel()
	select {
	case <-pp.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
