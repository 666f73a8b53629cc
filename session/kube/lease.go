package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
)

// Leases gives one gateway replica (Identity) exclusive, expiring
// ownership of named pieces of work, a session's recording say, through
// coordination.k8s.io Leases: the owner renews; when it stops (it died),
// another replica takes the work over once the lease has run out. Every
// write is conditional on the object's resourceVersion, so two replicas
// that try at once cannot both win. A lease has run out when this
// replica has seen it unchanged for Duration, by its own clock (as
// client-go's leader election judges it): replicas' clocks need not
// agree, and a replica that has just started waits a full Duration
// before it takes anything over.
type Leases struct {
	Client    kubernetes.Interface
	Namespace string
	Identity  string
	// Duration is how long a lease holds without a renewal.
	Duration time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Annotations are written on the lease whenever this replica takes
	// it (where the holder can be reached, say).
	Annotations map[string]string
	// Refuse, when set, keeps Acquire off a lease it returns true for
	// (work asked to stop, say). It judges the version the take would
	// replace, so a lease changed after it was judged is not taken.
	Refuse func(*coordinationv1.Lease) bool
	// Existing keeps Acquire from creating a lease: it takes only what
	// another placed (and not what has been removed since).
	Existing bool
	// Dead, when set, names holders known to be dead (an earlier run of
	// this replica's container, see Predecessor): their leases count as
	// run out at once. Set before the Leases are used.
	Dead func(holder string) bool

	mu   sync.Mutex
	seen map[string]observed // lease name: the version last seen, and when
}

type observed struct {
	version string
	at      time.Time
}

// runOut reports whether le has stayed unchanged for its duration since
// this replica first saw it so.
func (l *Leases) runOut(le *coordinationv1.Lease) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]observed{}
	}
	now := l.now()
	holder := deref(le.Spec.HolderIdentity)
	if holder == "" {
		return true // given back: free at once
	}
	if l.Dead != nil && l.Dead(holder) {
		return true
	}
	o, ok := l.seen[le.Name]
	if !ok || o.version != le.ResourceVersion {
		l.seen[le.Name] = observed{version: le.ResourceVersion, at: now}
		return false
	}
	d := time.Duration(deref(le.Spec.LeaseDurationSeconds)) * time.Second
	return now.After(o.at.Add(d))
}

// ErrLeaseLost is returned by Renew when another replica holds the lease.
var ErrLeaseLost = errors.New("the lease is held by another replica")

const labelLeaseFor = "sandgate.io/lease-for"

func (l *Leases) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// Acquire takes the lease name for this replica if nobody holds it, it
// has run out, or this replica holds it already. It reports whether this
// replica holds it now; the holder's identity is returned either way.
// what labels the lease (a session id) so List can find it.
func (l *Leases) Acquire(ctx context.Context, name, what string) (held bool, holder string, err error) {
	leases := l.Client.CoordinationV1().Leases(l.Namespace)
	now := metav1.NewMicroTime(l.now())
	secs := int32(l.Duration / time.Second)
	if secs < 1 {
		return false, "", errors.New("a lease lasts at least a second")
	}
	cur, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && l.Existing {
		return false, "", nil
	}
	if apierrors.IsNotFound(err) {
		_, err := leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelManaged: managedBy, labelLeaseFor: what}, Annotations: l.Annotations},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &l.Identity, LeaseDurationSeconds: &secs,
				AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return l.holder(ctx, name)
		}
		if err != nil {
			return false, "", fmt.Errorf("create lease %s: %w", name, err)
		}
		return true, l.Identity, nil
	}
	if err != nil {
		return false, "", fmt.Errorf("get lease %s: %w", name, err)
	}
	holder = deref(cur.Spec.HolderIdentity)
	if holder != l.Identity && !l.runOut(cur) {
		return false, holder, nil
	}
	if l.Refuse != nil && l.Refuse(cur) {
		return holder == l.Identity, holder, nil
	}
	next := cur.DeepCopy()
	if holder != l.Identity {
		next.Spec.AcquireTime = &now
		transitions := deref(next.Spec.LeaseTransitions) + 1
		next.Spec.LeaseTransitions = &transitions
	}
	next.Spec.HolderIdentity = &l.Identity
	next.Spec.LeaseDurationSeconds = &secs
	for k, v := range l.Annotations {
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		next.Annotations[k] = v
	}
	next.Spec.RenewTime = &now
	if _, err := leases.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) { // another replica wrote first
			return l.holder(ctx, name)
		}
		return false, "", fmt.Errorf("take lease %s: %w", name, err)
	}
	return true, l.Identity, nil
}

func (l *Leases) holder(ctx context.Context, name string) (bool, string, error) {
	cur, err := l.Client.CoordinationV1().Leases(l.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, "", fmt.Errorf("get lease %s: %w", name, err)
	}
	h := deref(cur.Spec.HolderIdentity)
	return h == l.Identity, h, nil
}

// ours reads a lease this replica holds: ErrLeaseLost when another
// replica holds it, the API's not-found error when there is none.
func (l *Leases) ours(ctx context.Context, name string) (*coordinationv1.Lease, error) {
	cur, err := l.Client.CoordinationV1().Leases(l.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("get lease %s: %w", name, err)
	}
	if deref(cur.Spec.HolderIdentity) != l.Identity {
		return nil, ErrLeaseLost
	}
	return cur, nil
}

// Renew extends a lease this replica holds; ErrLeaseLost when another
// replica has taken it (this one was too slow to renew).
func (l *Leases) Renew(ctx context.Context, name string) error {
	leases := l.Client.CoordinationV1().Leases(l.Namespace)
	cur, err := l.ours(ctx, name)
	if apierrors.IsNotFound(err) {
		return ErrLeaseLost
	}
	if err != nil {
		return err
	}
	now := metav1.NewMicroTime(l.now())
	next := cur.DeepCopy()
	next.Spec.RenewTime = &now
	if _, err := leases.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) {
			return ErrLeaseLost
		}
		return fmt.Errorf("renew lease %s: %w", name, err)
	}
	return nil
}

// Release removes a lease this replica holds (its work is done). A lease
// another replica holds is left alone.
func (l *Leases) Release(ctx context.Context, name string) error {
	leases := l.Client.CoordinationV1().Leases(l.Namespace)
	cur, err := l.ours(ctx, name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	rv := cur.ResourceVersion
	err = leases.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if apierrors.IsConflict(err) {
		return ErrLeaseLost
	}
	return err
}

// Lease is one lease as List sees it. Expired: unchanged for its
// duration as this replica has watched it (false the first time it is
// seen).
type Lease struct {
	Name, For, Holder string
	Expired           bool
}

// List returns the namespace's Sandgate leases: at start, a replica
// takes over the work whose lease has run out.
func (l *Leases) List(ctx context.Context) ([]Lease, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelManaged: managedBy}).String()
	list, err := l.Client.CoordinationV1().Leases(l.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, err
	}
	out := make([]Lease, 0, len(list.Items))
	for i := range list.Items {
		le := &list.Items[i]
		out = append(out, Lease{Name: le.Name, For: le.Labels[labelLeaseFor], Holder: deref(le.Spec.HolderIdentity), Expired: l.runOut(le)})
	}
	return out, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
