package pipeline

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/api"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/snapshotter"
)

// A name is pending when it is recorded for an image but containerd does
// not have it yet: containerd's socket was absent when it was registered
// (at boot the daemon starts before containerd; containerd restarts). The
// image is then usable from the records, and two things keep it so:
//   - containerd's garbage collector removes every backend snapshot it does
//     not know, and does not know the image's chains: containerdView.Remove
//     refuses to remove a chain of an image with a pending name
//     (guardPending);
//   - RegisterPending registers the name once containerd answers
//     (RegisterPendingEvery runs it in the daemon).

// RegisterPendingInterval is how often RegisterPendingEvery tries to
// register the pending names.
const RegisterPendingInterval = 10 * time.Second

// pendingName is a name containerd does not have yet, in namespace ns
// ("" is the registrar's own); Replace is the --replace of the pull that
// named it.
type pendingName struct {
	Name, Namespace string
	Replace         bool
}

// markPending records that containerd does not have name in namespace ns,
// to be registered with replace (a later naming's replace is kept: the
// name is registered as it was last asked for).
func (r Records) markPending(ctx context.Context, name, ns string, replace bool) error {
	if _, err := r.db.Statements().ExecContext(ctx, `INSERT INTO containerd_pending (name, namespace, replace, since_ns) VALUES (?, ?, ?, ?)
		ON CONFLICT (name, namespace) DO UPDATE SET replace = excluded.replace`, name, ns, replace, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("pipeline: record name %q as not yet registered in containerd: %w", name, err)
	}
	return nil
}

// clearPending records that containerd has name in namespace ns.
func (r Records) clearPending(ctx context.Context, name, ns string) error {
	if _, err := r.db.Statements().ExecContext(ctx, `DELETE FROM containerd_pending WHERE name = ? AND namespace = ?`, name, ns); err != nil {
		return fmt.Errorf("pipeline: record name %q as registered in containerd: %w", name, err)
	}
	return nil
}

// namePending reports whether containerd lacks name in some namespace.
func (r Records) namePending(ctx context.Context, name string) (bool, error) {
	var n int
	if err := r.db.Statements().QueryRowContext(ctx, `SELECT COUNT(*) FROM containerd_pending WHERE name = ?`, name).Scan(&n); err != nil {
		return false, fmt.Errorf("pipeline: pending registration of %q: %w", name, err)
	}
	return n > 0, nil
}

// pendingNamespaces lists the namespaces where containerd lacks name.
func (r Records) pendingNamespaces(ctx context.Context, name string) ([]string, error) {
	return queryAll(ctx, r.db.Statements(), "list pending namespaces of "+name, func(s rowScanner) (string, error) {
		var ns string
		return ns, s.Scan(&ns)
	}, `SELECT namespace FROM containerd_pending WHERE name = ? ORDER BY namespace`, name)
}

// pendingNames lists the pending names, oldest first.
func (r Records) pendingNames(ctx context.Context) ([]pendingName, error) {
	return queryAll(ctx, r.db.Statements(), "list pending registrations", func(s rowScanner) (pendingName, error) {
		var p pendingName
		return p, s.Scan(&p.Name, &p.Namespace, &p.Replace)
	}, `SELECT name, namespace, replace FROM containerd_pending ORDER BY since_ns, name, namespace`)
}

// guardPending refuses, inside the transaction that removes a chain's
// snapshot, the removal of chain while an image whose layers it is has a
// name containerd does not have yet: containerd's collector would take it
// for a snapshot of no image.
func guardPending(chain string) snapshotter.RemoveGuard {
	return func(ctx context.Context, tx *sql.Tx) error {
		var name string
		err := tx.QueryRowContext(ctx, `SELECT p.name FROM containerd_pending p JOIN image_names n ON n.name = p.name
			JOIN image_layers l ON l.image_id = n.image_id WHERE l.chain_id = ? LIMIT 1`, chain).Scan(&name)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("remove %s: pending registrations: %w", chain, err)
		}
		return fmt.Errorf("remove %s: a chain of image %q, which containerd does not have yet (its socket was absent when the image was pulled; it is registered once containerd answers): %w",
			chain, name, errdefs.ErrFailedPrecondition)
	}
}

// registration reports what a pull's result says of name: registered in
// containerd when there is a registrar and containerd has it in every
// namespace asked; pending when containerd's socket was absent and the
// daemon registers it later.
func (p *Pipelines) registration(ctx context.Context, name string) (registered, pending bool) {
	if p.opts.Registrar == nil {
		return false, false
	}
	if name == "" {
		return true, false
	}
	pending, err := RecordsOf(p.db).namePending(ctx, name)
	if err != nil {
		log.G(ctx).WithError(err).WithField("name", name).Warn("pull: reading whether the name is registered")
		return false, false
	}
	return !pending, pending
}

// RegisterPending registers in containerd every pending name, as the image
// the records give it now (with the --replace of the pull that named it),
// and reports how many are still pending. While containerd's socket is
// absent nothing changes. A name containerd has for an image this daemon
// did not create, named without --replace, is refused there
// (ErrForeignImage): the records give it up and containerd's other
// namespaces lose it where it is ours, as for a refused pull. Each
// image is held by the pool guard while its name is registered, as a pull
// holds it: no removal runs meanwhile.
func (p *Pipelines) RegisterPending(ctx context.Context) (int, error) {
	if p.opts.Registrar == nil {
		return 0, nil
	}
	pending, err := RecordsOf(p.db).pendingNames(ctx)
	if err != nil {
		return 0, err
	}
	left := 0
	var errs []error
	for _, pn := range pending {
		still, err := p.registerPendingName(ctx, pn)
		if err != nil {
			errs = append(errs, err)
		}
		if still || err != nil {
			left++
		}
	}
	return left, errors.Join(errs...)
}

// registerPendingName registers pn under its name's lock, as nameImage
// does, so that a pull naming it meanwhile is not undone, and reports
// whether it is still pending (containerd still absent).
func (p *Pipelines) registerPendingName(ctx context.Context, pn pendingName) (bool, error) {
	unlock := p.names.Lock(pn.Name)
	defer unlock()
	rec := RecordsOf(p.db)
	imageID, err := rec.ImageIDByName(ctx, pn.Name)
	if err != nil || imageID == "" {
		return false, err // a name forgotten takes its pending rows with it
	}
	// The image is held as a pull holds it while containerd gets its
	// chains: a removal of it under way (rm, a collection) ends first, and
	// none starts until the name is registered, so containerd is never
	// handed chains a removal is deleting.
	defer p.beginPull(imageID)()
	switch now, err := rec.ImageIDByName(ctx, pn.Name); {
	case err != nil:
		return true, err
	case now == "":
		return false, nil // removed while the hold waited: the name went with it
	case now != imageID:
		return true, nil // the next round registers the image the name is on now
	}
	diffs, err := queryAll(ctx, p.db.Statements(), "diff ids of image "+imageID, func(s rowScanner) (api.Layer, error) {
		var l api.Layer
		return l, s.Scan(&l.DiffID)
	}, `SELECT c.diff_id FROM image_layers l JOIN chains c ON c.chain_id = l.chain_id WHERE l.image_id = ? ORDER BY l.position`, imageID)
	if err != nil {
		return true, err
	}
	var nss []string
	if pn.Namespace != "" {
		nss = []string{pn.Namespace}
	}
	err = p.registerName(ctx, pn.Name, nss, diffs, pn.Replace)
	switch {
	case errors.Is(err, ErrForeignImage):
		log.G(ctx).WithError(err).WithField("name", pn.Name).WithField("image", imageID).
			Error("register: containerd got an image of this name, not ours, while it could not be registered; the records give the name up")
		// The name may be registered in other namespaces already (its
		// other pending rows, or a pull before): an image of ours there
		// that no record names would never be removed. Those go first,
		// so that a failure or a crash before the record is dropped
		// leaves the name pending, to be refused and taken back again.
		if err := p.opts.Registrar.Unregister(ctx, pn.Name); err != nil {
			return true, fmt.Errorf("register %s: taking back the registrations of a name given up: %w", pn.Name, err)
		}
		return false, rec.dropImageName(ctx, pn.Name, imageID)
	case err != nil:
		return true, err
	}
	still, err := rec.namePending(ctx, pn.Name)
	if err == nil && !still {
		log.G(ctx).WithField("name", pn.Name).WithField("image", imageID).Info("register: a name pulled while containerd was down is registered")
	}
	return still, err
}

// RegisterPendingEvery runs RegisterPending every interval until ctx is
// done.
func (p *Pipelines) RegisterPendingEvery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := p.RegisterPending(ctx); err != nil && ctx.Err() == nil {
			log.G(ctx).WithError(err).Warn("register: names pulled while containerd was down")
		}
	}
}
