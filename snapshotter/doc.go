// Package snapshotter implements containerd v2's snapshots.Snapshotter and
// snapshots.Cleaner on a device-mapper thin pool (package thinpool), with its
// records in the project's SQLite database (package metadata).
//
// Every snapshot is a thin device. A parentless snapshot is a create_snap of
// the pool's base device, which is created and formatted once per pool; a
// child is a create_snap of its parent's device. Committing records the
// device's mapped bytes as its usage and deactivates it; a view is a snapshot
// mounted read-only. With Config.AsyncRemove (the daemon's default) removing
// is asynchronous: the record goes at once and Cleanup deletes the device;
// otherwise Remove deletes the device before it returns.
//
// Device work is never done inside a database write transaction. Creating a
// device records an intent row first (with the thin id chosen), then does the
// dm calls, then records the outcome and drops the intent in one transaction.
// New reconciles the database with the pool on start-up: it rolls back what a
// crash left half made, deactivates what should not be active, activates what
// should, and quarantines thin ids that nothing explains; those ids are never
// reused.
//
// Keys are not scoped by the request's containerd namespace, as with
// containerd's built-in snapshotters: containerd's metadata store puts the
// namespace into every key it sends, and its garbage collector calls with no
// namespace at all.
package snapshotter
