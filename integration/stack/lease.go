package stack

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// Lease is a containerd client holding a lease in Namespace. Snapshots
// made through Ctx belong to the lease, so containerd's garbage collector,
// which removes from a proxy plugin every snapshot its records do not
// hold, leaves them alone until End.
type Lease struct {
	Client *client.Client
	// Ctx carries Namespace and the lease: the context for the client's
	// calls.
	Ctx   context.Context
	id    string
	ended bool
}

// Leased dials c and takes a lease.
func (c *Containerd) Leased(ctx context.Context) (*Lease, error) {
	cli, err := client.New(c.Socket)
	if err != nil {
		return nil, fmt.Errorf("containerd client on %s: %w", c.Socket, err)
	}
	lctx, _, err := cli.WithLease(namespaces.WithNamespace(ctx, Namespace))
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("containerd lease: %w", err)
	}
	id, _ := leases.FromContext(lctx)
	return &Lease{Client: cli, Ctx: lctx, id: id}, nil
}

// End deletes the lease synchronously (containerd runs its collection
// before answering, so what only the lease held is gone when End returns)
// and closes the client. Later calls do nothing.
func (l *Lease) End(ctx context.Context) error {
	if l.ended {
		return nil
	}
	l.ended = true
	defer l.Client.Close()
	if err := l.Client.LeasesService().Delete(namespaces.WithNamespace(ctx, Namespace), leases.Lease{ID: l.id}, leases.SynchronousDelete); err != nil {
		return fmt.Errorf("delete containerd lease %s: %w", l.id, err)
	}
	return nil
}

// CollectGarbage runs containerd's garbage collection to completion in
// ctx's namespace: deleting a lease synchronously waits for a full
// collection, which removes, through proxy plugins too, every snapshot
// no image, container or lease references any more.
func CollectGarbage(ctx context.Context, c *client.Client) error {
	ls := c.LeasesService()
	l, err := ls.Create(ctx, leases.WithRandomID())
	if err != nil {
		return fmt.Errorf("create lease: %w", err)
	}
	if err := ls.Delete(ctx, l, leases.SynchronousDelete); err != nil {
		return fmt.Errorf("delete lease %s synchronously (garbage collection): %w", l.ID, err)
	}
	return nil
}
