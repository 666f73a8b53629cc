// Package kube runs sessions as Kubernetes Pods: one Pod per session,
// under the RuntimeClass of the runtime asked for, with the hardening the
// containerd backend gives its containers. Exec, shells and files go
// through the Pod exec API. It uses client-go only: scheduling, restarts
// and garbage collection are the cluster's.
//
// Sessions (sessions.go) is this backend behind the session manager's
// Backend interface: `backend: kubernetes` in the gateway's config.
package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/sandgate/sandgate/ids"
)

// Labels and annotations on session Pods. The Pod is the session's
// record: a gateway that restarts, or another replica, reads it back.
const (
	LabelManaged = "app.kubernetes.io/managed-by"
	managedBy    = "sandgate"
	LabelSession = "sandgate.io/session"
	LabelTenant  = "sandgate.io/tenant"
	LabelExpires = "sandgate.io/expires" // unix seconds
	AnnInfo      = "sandgate.io/info"    // the session's stored info, JSON
)

// The session's container; its name in exec requests.
const containerName = "session"

// Ports the session image serves on the Pod's address.
const (
	CDPPort = 9222
	VNCPort = 5900
)

// Session processes run as this user, created in the image.
const sessionUID = 1000

// Config is what the backend needs to know about its cluster.
type Config struct {
	// Kubeconfig is the path of a kubeconfig; empty means in-cluster.
	Kubeconfig string
	// Namespace holds the session Pods.
	Namespace string
	// Image is the session image as the nodes know it.
	Image      string
	PullPolicy corev1.PullPolicy
	// RuntimeClasses maps a Sandgate runtime (kata, gvisor, runc) to the
	// RuntimeClass its Pods name. A runtime missing here is refused.
	RuntimeClasses map[string]string
	// Seccomp maps a runtime to the Localhost seccomp profile its Pods
	// run under (a path below the kubelet's seccomp directory, holding
	// what `sandgate seccomp-profile RUNTIME` prints). A runtime not
	// named runs under RuntimeDefault. Under gVisor through the runc
	// shim, RuntimeDefault answers clone3 with EPERM (runsc ignores the
	// profile's errno), and Chromium cannot start: name a profile there.
	Seccomp map[string]string
	// Owner, when set, owns every session Pod (the gateway's Deployment,
	// say), so the cluster removes them with it.
	Owner *metav1.OwnerReference
}

// Backend creates and drives session Pods.
type Backend struct {
	cfg    Config
	rest   *rest.Config
	client kubernetes.Interface
}

// New connects to the cluster named by cfg.
func New(cfg Config) (*Backend, error) {
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	if cfg.Namespace == "" {
		return nil, errors.New("kubernetes: a namespace is required")
	}
	if cfg.PullPolicy == "" {
		cfg.PullPolicy = corev1.PullIfNotPresent
	}
	// client-go's default (5 a second, bursts of 10) is one client's
	// share; the gateway's one client serves every session, its exec
	// streams, the leases and the hold.
	if rc.QPS == 0 {
		rc.QPS, rc.Burst = 50, 100
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &Backend{cfg: cfg, rest: rc, client: client}, nil
}

// Namespace is where the backend's Pods are.
func (b *Backend) Namespace() string { return b.cfg.Namespace }

// Client is the backend's API client.
func (b *Backend) Client() kubernetes.Interface { return b.client }

// ErrRuntimeMissing is returned when the cluster has no RuntimeClass for
// the runtime asked for. The backend never falls back to another.
var ErrRuntimeMissing = errors.New("runtime not available on this cluster")

// Spec is one session Pod.
type Spec struct {
	ID      string
	Tenant  string
	Runtime string // kata, gvisor, runc
	Expires time.Time
	// Deadline, when set, is the latest the session may ever run to
	// (its tenant's longest TTL): the Pod's activeDeadlineSeconds, so it
	// ends even when no gateway is left to delete it. Kubernetes lets a
	// deadline shrink, never grow: an extension cannot pass it.
	Deadline time.Time
	CPUs     float64
	MemoryMB int
	Env      []string // KEY=VALUE
	// Info is stored as an annotation (the session's record).
	Info string
}

// Pod is a session Pod as the backend sees it.
type Pod struct {
	ID      string
	Tenant  string
	Runtime string
	Expires time.Time
	Info    string
	Phase   corev1.PodPhase
	Addr    netip.Addr // the Pod's IP; invalid until it has one
}

// CDP and VNC are where the session's services answer.
func (p Pod) CDP() netip.AddrPort { return netip.AddrPortFrom(p.Addr, CDPPort) }
func (p Pod) VNC() netip.AddrPort { return netip.AddrPortFrom(p.Addr, VNCPort) }

// RuntimeClass returns the RuntimeClass for a runtime, checking that the
// cluster has it.
func (b *Backend) RuntimeClass(ctx context.Context, runtime string) (string, error) {
	name, ok := b.cfg.RuntimeClasses[runtime]
	if !ok || name == "" {
		return "", fmt.Errorf("%w: runtime %q has no RuntimeClass in the configuration", ErrRuntimeMissing, runtime)
	}
	if _, err := b.client.NodeV1().RuntimeClasses().Get(ctx, name, metav1.GetOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("%w: the cluster has no RuntimeClass %q (runtime %q)", ErrRuntimeMissing, name, runtime)
		}
		return "", fmt.Errorf("look up RuntimeClass %q: %w", name, err)
	}
	return name, nil
}

func podName(id string) string { return "sandgate-" + id }

// ErrInvalid is returned for a spec or command the backend will not run.
var ErrInvalid = errors.New("invalid")

// check refuses what the API server would take but mean something else
// by: a zero limit is no limit to the kubelet.
func (s Spec) check() error {
	switch {
	case !ids.IsSession(s.ID):
		return fmt.Errorf("%w: %q is not a session id", ErrInvalid, s.ID)
	case !(s.CPUs >= 0.1 && s.CPUs <= 64):
		return fmt.Errorf("%w: cpus %v is not between 0.1 and 64", ErrInvalid, s.CPUs)
	case s.MemoryMB < 128 || s.MemoryMB > 1<<20:
		return fmt.Errorf("%w: memory %d MiB is not between 128 MiB and 1 TiB", ErrInvalid, s.MemoryMB)
	case !s.Expires.After(time.Now()):
		return fmt.Errorf("%w: the session expires in the past", ErrInvalid)
	case !s.Deadline.IsZero() && s.Deadline.Before(s.Expires):
		return fmt.Errorf("%w: the deadline is before the expiry", ErrInvalid)
	}
	for _, kv := range s.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("%w: environment entry %q is not KEY=VALUE", ErrInvalid, kv)
		}
	}
	return nil
}

// Create creates the session's Pod. It returns once the Pod exists; Wait
// waits for it to run.
func (b *Backend) Create(ctx context.Context, s Spec) error {
	if err := s.check(); err != nil {
		return err
	}
	rc, err := b.RuntimeClass(ctx, s.Runtime)
	if err != nil {
		return err
	}
	pod := b.pod(s, rc)
	if _, err := b.client.CoreV1().Pods(b.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", pod.Name, err)
	}
	return nil
}

func (b *Backend) pod(s Spec, runtimeClass string) *corev1.Pod {
	env := make([]corev1.EnvVar, 0, len(s.Env))
	for _, kv := range s.Env {
		k, v, _ := strings.Cut(kv, "=")
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	cpu := resource.NewMilliQuantity(int64(s.CPUs*1000), resource.DecimalSI)
	mem := resource.NewQuantity(int64(s.MemoryMB)<<20, resource.BinarySI)
	limits := corev1.ResourceList{corev1.ResourceCPU: *cpu, corev1.ResourceMemory: *mem,
		// The workspace and the container's writable layer: what the
		// kubelet evicts the Pod over.
		corev1.ResourceEphemeralStorage: resource.MustParse("2Gi")}

	yes, no := true, false
	uid, gid := int64(sessionUID), int64(sessionUID)
	grace := int64(10)
	tmpfs := func(name, size string) corev1.Volume {
		q := resource.MustParse(size)
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &q}}}
	}
	workspace := resource.MustParse("1Gi")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: podName(s.ID),
			Labels: map[string]string{
				LabelManaged: managedBy,
				LabelSession: s.ID,
				LabelExpires: strconv.FormatInt(s.Expires.Unix(), 10),
			},
			Annotations: map[string]string{AnnInfo: s.Info},
		},
		Spec: corev1.PodSpec{
			RuntimeClassName:              &runtimeClass,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			Hostname:                      "sandgate",
			TerminationGracePeriodSeconds: &grace,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &yes,
				RunAsUser:      &uid,
				RunAsGroup:     &gid,
				FSGroup:        &gid,
				SeccompProfile: b.seccomp(s.Runtime),
			},
			Containers: []corev1.Container{{
				Name:            containerName,
				Image:           b.cfg.Image,
				ImagePullPolicy: b.cfg.PullPolicy,
				Env:             env,
				Resources:       corev1.ResourceRequirements{Limits: limits, Requests: limits},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no,
					Privileged:               &no,
					ReadOnlyRootFilesystem:   &yes,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				Ports: []corev1.ContainerPort{{Name: "cdp", ContainerPort: CDPPort}, {Name: "vnc", ContainerPort: VNCPort}},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "tmp", MountPath: "/tmp"},
					{Name: "home", MountPath: "/home/sandgate"},
					{Name: "workspace", MountPath: "/home/sandgate/workspace"},
				},
			}},
			// The image is read-only; what a session writes goes to
			// bounded memory (charged to the Pod) or its workspace.
			Volumes: []corev1.Volume{
				tmpfs("tmp", "1Gi"),
				tmpfs("home", "256Mi"),
				{Name: "workspace", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &workspace}}},
			},
		},
	}
	// A tenant name that is no label value (one ending in "-") is in
	// the record only.
	if len(validation.IsValidLabelValue(s.Tenant)) == 0 {
		pod.Labels[LabelTenant] = s.Tenant
	}
	if !s.Deadline.IsZero() {
		secs := int64(time.Until(s.Deadline).Seconds()) + 60
		pod.Spec.ActiveDeadlineSeconds = &secs
	}
	if b.cfg.Owner != nil {
		pod.OwnerReferences = []metav1.OwnerReference{*b.cfg.Owner}
	}
	return pod
}

func (b *Backend) seccomp(runtime string) *corev1.SeccompProfile {
	if path := b.cfg.Seccomp[runtime]; path != "" {
		return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: &path}
	}
	return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
}

// Wait waits until the session's Pod runs and has an address. A Pod that
// ends or cannot start (an image it cannot have, a sandbox that fails)
// is an error naming the reason, so a create fails fast rather than at
// its deadline.
func (b *Backend) Wait(ctx context.Context, id string) (Pod, error) {
	name := podName(id)
	var last string
	for {
		p, err := b.client.CoreV1().Pods(b.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return Pod{}, fmt.Errorf("pod %s: %w", name, err)
		}
		out := fromPod(p)
		switch p.Status.Phase {
		case corev1.PodRunning:
			if out.Addr.IsValid() {
				return out, nil
			}
		case corev1.PodFailed, corev1.PodSucceeded:
			return out, fmt.Errorf("pod %s ended (%s): %s", name, p.Status.Phase, why(p))
		}
		if w := why(p); w != "" {
			last = w
			if fatal(p) {
				return out, fmt.Errorf("pod %s cannot start: %s", name, w)
			}
		}
		select {
		case <-ctx.Done():
			if last == "" {
				last = string(p.Status.Phase)
			}
			return out, fmt.Errorf("pod %s did not run (%s): %w", name, last, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// why says what holds a Pod up, from its container's state.
func why(p *corev1.Pod) string {
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
			return w.Reason + ": " + w.Message
		}
		if t := c.State.Terminated; t != nil {
			return fmt.Sprintf("%s (exit %d): %s", t.Reason, t.ExitCode, t.Message)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status == corev1.ConditionFalse && c.Reason != "" {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// fatal reports a waiting reason that will not clear by itself.
func fatal(p *corev1.Pod) bool {
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
				return true
			}
		}
	}
	return false
}

func fromPod(p *corev1.Pod) Pod {
	exp, _ := strconv.ParseInt(p.Labels[LabelExpires], 10, 64)
	out := Pod{
		ID: p.Labels[LabelSession], Tenant: p.Labels[LabelTenant], Info: p.Annotations[AnnInfo],
		Expires: time.Unix(exp, 0), Phase: p.Status.Phase,
	}
	if p.Spec.RuntimeClassName != nil {
		out.Runtime = *p.Spec.RuntimeClassName
	}
	if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
		out.Addr = a
	}
	return out
}

// Delete removes the session's Pod; grace is how long its processes get
// after SIGTERM, at least a second: a grace of 0 would remove the Pod
// from the API at once, before its containers stop, and Gone would then
// prove nothing. A Pod already gone is not an error.
func (b *Backend) Delete(ctx context.Context, id string, grace time.Duration) error {
	if !ids.IsSession(id) {
		return fmt.Errorf("%w: %q is not a session id", ErrInvalid, id)
	}
	secs := max(int64(grace.Seconds()), 1)
	err := b.client.CoreV1().Pods(b.cfg.Namespace).Delete(ctx, podName(id), metav1.DeleteOptions{GracePeriodSeconds: &secs})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod for %s: %w", id, err)
	}
	return nil
}

// Gone waits until the session's Pod no longer exists: after Delete,
// until the kubelet has stopped its containers.
func (b *Backend) Gone(ctx context.Context, id string) error {
	for {
		_, err := b.client.CoreV1().Pods(b.cfg.Namespace).Get(ctx, podName(id), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod for %s still exists: %w", id, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Serves says whether the session's Pod runs with address addr: false
// once it has ended or gone, or has another address. A failure to ask
// the API server counts as serving (no Pod can be made meanwhile to be
// given the address).
func (b *Backend) Serves(ctx context.Context, id string, addr netip.Addr) bool {
	o, err := b.client.CoreV1().Pods(b.cfg.Namespace).Get(ctx, podName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		return true
	}
	if _, done := ended(o); done {
		return false
	}
	a, err := netip.ParseAddr(o.Status.PodIP)
	return err == nil && a == addr
}

// List returns every session Pod in the namespace.
func (b *Backend) List(ctx context.Context) ([]Pod, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelManaged: managedBy}).String()
	list, err := b.client.CoreV1().Pods(b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, err
	}
	out := make([]Pod, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, fromPod(&list.Items[i]))
	}
	return out, nil
}

// Exec is a command to run in a session Pod.
type Exec struct {
	Args  []string
	Env   []string // KEY=VALUE, added to the session's environment
	Cwd   string
	Stdin io.Reader
	// StdinSize is how many bytes Stdin holds, when known (0: not
	// known): the command reads that many and no more (see Run).
	StdinSize int64
	Stdout    io.Writer
	Stderr    io.Writer // ignored with Terminal
	Terminal  bool
	// Sizes, with Terminal: the first is the size at start, each later
	// one a resize. Closed when the caller has no more.
	Sizes <-chan TermSize
}

// Check refuses a command Run would not run (ErrInvalid).
func (e Exec) Check() error {
	if len(e.Args) == 0 || e.Args[0] == "" {
		return fmt.Errorf("%w: a command must name a program", ErrInvalid)
	}
	// The exec API has no environment or working directory: env sets
	// both, then runs the command without a shell. A program named like
	// an assignment would be taken for one, and a lone "-" for env's
	// option to clear the environment.
	if strings.Contains(e.Args[0], "=") || e.Args[0] == "-" {
		return fmt.Errorf("%w: program %q cannot be run through env", ErrInvalid, e.Args[0])
	}
	if e.Cwd != "" && (!strings.HasPrefix(e.Cwd, "/") || path.Clean(e.Cwd) != e.Cwd) {
		return fmt.Errorf("%w: working directory %q is not a clean absolute path", ErrInvalid, e.Cwd)
	}
	for _, kv := range e.Env {
		if !strings.Contains(kv, "=") || strings.HasPrefix(kv, "=") {
			return fmt.Errorf("%w: environment entry %q is not KEY=VALUE", ErrInvalid, kv)
		}
	}
	return nil
}

// TermSize is a terminal's size.
type TermSize struct{ Cols, Rows uint16 }

// Run runs a command in the session's Pod through the exec API and
// returns its exit code. A command that cannot start (no such program)
// is an exit code, as in a shell; a broken connection is an error.
func (b *Backend) Run(ctx context.Context, id string, e Exec) (int, error) {
	if !ids.IsSession(id) {
		return -1, fmt.Errorf("%w: %q is not a session id", ErrInvalid, id)
	}
	if err := e.Check(); err != nil {
		return -1, err
	}
	// env's own failures (a directory that is not there: 125; a
	// program that cannot run: 126, 127) come back as exit codes, as
	// they would from a shell.
	argv := []string{"/usr/bin/env"}
	if e.Cwd != "" {
		argv = append(argv, "--chdir="+e.Cwd)
	}
	argv = append(argv, "--")
	argv = append(argv, e.Env...)
	argv = append(argv, e.Args...)
	if e.Stdin != nil && !e.Terminal {
		// The command reads its input from a cat that the shell forks at
		// once, not from the exec's stdin itself: a command that replaced
		// its shell (`exec cat > file`) before it read got 192 KiB of a
		// 3 MiB upload and exit 0, over SPDY and WebSocket alike, while
		// the same command forked from its shell got all of it
		// (measured on the trial cluster's containerd 1.6 CRI). The exit
		// code is the command's, the pipeline's last.
		//
		// The stdin's end can be lost on the way: a cat still waiting
		// for it held `true` with no input for its whole timeout, twice
		// in eight runs of BenchmarkKubeRelayAlone. Input of a known
		// size is read with head, which stops at its last byte.
		if e.StdinSize > 0 {
			argv = append([]string{"/bin/sh", "-c", `n=$1; shift; /usr/bin/head -c "$n" | "$@"`, "sandgate-stdin", strconv.FormatInt(e.StdinSize, 10)}, argv...)
		} else {
			argv = append([]string{"/bin/sh", "-c", `/bin/cat | "$@"`, "sandgate-stdin"}, argv...)
		}
	}
	req := b.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(b.cfg.Namespace).
		Name(podName(id)).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: containerName, Command: argv,
			Stdin: e.Stdin != nil, Stdout: e.Stdout != nil, Stderr: e.Stderr != nil && !e.Terminal, TTY: e.Terminal,
		}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(b.rest, "GET", req.URL().String())
	if err != nil {
		return -1, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(b.rest, "POST", req.URL())
	if err != nil {
		return -1, err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return -1, err
	}
	opts := remotecommand.StreamOptions{Stdin: e.Stdin, Stdout: e.Stdout, Tty: e.Terminal}
	if !e.Terminal {
		opts.Stderr = e.Stderr
	}
	if e.Terminal && e.Sizes != nil {
		opts.TerminalSizeQueue = sizeQueue{ctx: ctx, c: e.Sizes}
	}
	err = ex.StreamWithContext(ctx, opts)
	var exit utilexec.CodeExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit):
		return exit.Code, nil
	default:
		return -1, fmt.Errorf("exec in %s: %w", id, err)
	}
}

type sizeQueue struct {
	ctx context.Context
	c   <-chan TermSize
}

func (q sizeQueue) Next() *remotecommand.TerminalSize {
	select {
	case s, ok := <-q.c:
		if !ok {
			return nil
		}
		return &remotecommand.TerminalSize{Width: s.Cols, Height: s.Rows}
	case <-q.ctx.Done():
		return nil
	}
}
