package snapshotter

// Typed queries for the snapshotter's tables (migration 0004_snapshotter.sql
// of package metadata): cd_snapshots, thin_devices, device_intents and
// quarantined_thin_ids. Values are plain Go types; the rest of this package
// maps them to containerd's types.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
)

// Snapshot kinds stored in cd_snapshots.kind.
const (
	SnapKindActive    = "active"
	SnapKindView      = "view"
	SnapKindCommitted = "committed"
)

// Thin device roles and states stored in thin_devices.
const (
	ThinRoleBase     = "base"
	ThinRoleSnapshot = "snapshot"

	ThinStateActive   = "active"
	ThinStateInactive = "inactive"
	ThinStateRemoved  = "removed"
)

// Device intent operations stored in device_intents.op.
const (
	intentCreate     = "create"
	intentFormatBase = "format_base"
)

// CDSnapshot is one containerd snapshot record joined with its device's name
// and its parent's key.
type CDSnapshot struct {
	ID         int64
	Key        string
	Kind       string // SnapKindActive, SnapKindView or SnapKindCommitted
	ParentID   int64  // 0 when the snapshot has no parent
	ParentKey  string // "" when the snapshot has no parent
	DeviceID   uint32
	DeviceName string
	Labels     map[string]string // nil when the snapshot has no labels
	CreatedNs  int64
	UpdatedNs  int64
	SizeBytes  int64
	Inodes     int64
}

// ThinDevice is one thin device record.
type ThinDevice struct {
	ID        uint32
	Name      string
	OriginID  uint32 // 0 when created with create_thin (the base)
	Role      string // ThinRoleBase or ThinRoleSnapshot
	State     string // ThinStateActive, ThinStateInactive or ThinStateRemoved
	SizeBytes int64
	FSType    string
	CreatedNs int64
	UpdatedNs int64
}

// DeviceIntent is device work announced before it is done.
type DeviceIntent struct {
	ID        int64
	Op        string // intentCreate or intentFormatBase
	DeviceID  uint32
	Name      string
	OriginID  uint32 // 0 when the device has no origin
	Key       string // "" for the base device
	CreatedNs int64
}

// QuarantinedID is a thin id that is never reused.
type QuarantinedID struct {
	DeviceID      uint32
	Reason        string
	Deleted       bool
	QuarantinedNs int64
}

// Records runs the snapshotter's typed queries on either the database's
// single statements (reads outside a transaction) or a write transaction
// from (*metadata.DB).WithTx. Writes must go through RecordsTx so that a
// snapshot record and its device record change together.
//
// The snapshotter keeps every record in one keyspace (see keyspace), so
// the queries write the namespace column of cd_snapshots and
// device_intents as the empty string and match it as the empty string,
// which keeps the indexes that lead with that column usable.
type Records struct {
	q metadata.Querier
}

// ReadRecords returns the snapshotter's queries on db's single statements,
// for reads that need no transaction.
func ReadRecords(db *metadata.DB) Records {
	return Records{q: db.Statements()}
}

// ReadRecordsIn returns the snapshotter's queries on q, for reads that
// must all see one state of the database: q is the one given by
// (*metadata.DB).ReadSnapshot.
func ReadRecordsIn(q metadata.Querier) Records {
	return Records{q: q}
}

// RecordsTx returns the snapshotter's queries inside tx, a transaction
// given by (*metadata.DB).WithTx.
func RecordsTx(tx *sql.Tx) Records {
	return Records{q: tx}
}

const cdSnapshotColumns = `s.id, s.key, s.kind, IFNULL(s.parent_id, 0), IFNULL(p.key, ''),
	s.device_id, d.name, s.labels, s.created_ns, s.updated_ns, s.size_bytes, s.inodes
	FROM cd_snapshots s
	JOIN thin_devices d ON d.device_id = s.device_id
	LEFT JOIN cd_snapshots p ON p.id = s.parent_id`

func scanCDSnapshot(sc interface{ Scan(...any) error }) (CDSnapshot, error) {
	var (
		s      CDSnapshot
		labels string
	)
	if err := sc.Scan(&s.ID, &s.Key, &s.Kind, &s.ParentID, &s.ParentKey,
		&s.DeviceID, &s.DeviceName, &labels, &s.CreatedNs, &s.UpdatedNs, &s.SizeBytes, &s.Inodes); err != nil {
		return CDSnapshot{}, err
	}
	l, err := decodeLabels(labels)
	if err != nil {
		return CDSnapshot{}, fmt.Errorf("snapshot %q: %w", s.Key, err)
	}
	s.Labels = l
	return s, nil
}

func decodeLabels(text string) (map[string]string, error) {
	if text == "" || text == "{}" {
		return nil, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		return nil, fmt.Errorf("decode labels %q: %w", text, err)
	}
	if len(m) == 0 {
		return nil, nil
	}
	return m, nil
}

func encodeLabels(m map[string]string) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(m) // keys sorted: stable text
	if err != nil {
		return "", fmt.Errorf("encode labels: %w", err)
	}
	return string(b), nil
}

// Snapshot returns the snapshot keyed key; ok is false when there is none.
func (s Records) Snapshot(ctx context.Context, key string) (snap CDSnapshot, ok bool, err error) {
	row := s.q.QueryRowContext(ctx, `SELECT `+cdSnapshotColumns+` WHERE s.namespace = '' AND s.key = ?`, key)
	snap, err = scanCDSnapshot(row)
	if errors.Is(err, sql.ErrNoRows) {
		return CDSnapshot{}, false, nil
	}
	if err != nil {
		return CDSnapshot{}, false, fmt.Errorf("read snapshot %q: %w", key, err)
	}
	return snap, true, nil
}

// snapshotByID returns the snapshot whose row id is id; ok is false when
// there is none.
func (s Records) snapshotByID(ctx context.Context, id int64) (snap CDSnapshot, ok bool, err error) {
	row := s.q.QueryRowContext(ctx, `SELECT `+cdSnapshotColumns+` WHERE s.id = ?`, id)
	snap, err = scanCDSnapshot(row)
	if errors.Is(err, sql.ErrNoRows) {
		return CDSnapshot{}, false, nil
	}
	if err != nil {
		return CDSnapshot{}, false, fmt.Errorf("read snapshot row %d: %w", id, err)
	}
	return snap, true, nil
}

// Snapshots returns every snapshot, ordered by row id.
func (s Records) Snapshots(ctx context.Context) ([]CDSnapshot, error) {
	return s.snapshotsWhere(ctx, snapshotFilter{})
}

// snapshotOnDevice returns the snapshot that owns thin device id, whatever
// its namespace column holds; ok is false when none does.
func (s Records) snapshotOnDevice(ctx context.Context, id uint32) (snap CDSnapshot, ok bool, err error) {
	snap, err = scanCDSnapshot(s.q.QueryRowContext(ctx, `SELECT `+cdSnapshotColumns+` WHERE s.device_id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return CDSnapshot{}, false, nil
	}
	if err != nil {
		return CDSnapshot{}, false, fmt.Errorf("snapshot on thin device %d: %w", id, err)
	}
	return snap, true, nil
}

// refTarget returns the key of a committed snapshot whose parent's key is
// parentKey ("" for none) and whose label labelKey equals target; "" when
// there is none. It is how a Prepare carrying containerd's snapshot.ref
// label finds a layer that is already there. Only the label counts, not a
// key equal to target: containerd's metadata store takes the Prepare's
// AlreadyExists as a match and then looks the target up with a Walk on
// that label and the parent, which must find it. The lookup is indexed
// (for the label, only containerd.io/snapshot.ref has an index), so the
// cost does not grow with the number of snapshots.
func (s Records) refTarget(ctx context.Context, labelKey, target, parentKey string) (string, error) {
	label, err := labelExpr("s", labelKey)
	if err != nil {
		return "", fmt.Errorf("find ref target: %w", err)
	}
	var key string
	err = s.q.QueryRowContext(ctx, refTargetSQL(label), parentKey, target).Scan(&key)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("find committed snapshot for ref %q on parent %q: %w", target, parentKey, err)
	}
	return key, nil
}

// refTargetSQL is RefTarget's query, label the expression of its label
// (labelExpr); its parameters are the parent's key and the target.
func refTargetSQL(label string) string {
	return `SELECT s.key FROM cd_snapshots s LEFT JOIN cd_snapshots p ON p.id = s.parent_id
		 WHERE ` + label + ` = ?2 AND s.kind = 'committed' AND s.namespace = '' AND IFNULL(p.key, '') = ?1
		 ORDER BY s.id LIMIT 1`
}

// labelExpr is the SQL expression of label key of the cd_snapshots row
// aliased alias, written the way the label index of migration 10 is (the
// JSON path a literal, not a parameter), so that SQLite can use it.
func labelExpr(alias, key string) (string, error) {
	if key == "" || strings.ContainsAny(key, `\"'`) {
		return "", fmt.Errorf("label key %q must be non-empty, without quotes or backslashes", key)
	}
	return `json_extract(` + alias + `.labels, '$."` + key + `"')`, nil
}

// snapshotFilter narrows snapshotsWhere: every field set must hold (the
// zero value selects every snapshot).
type snapshotFilter struct {
	Key    string            // the key, when not ""
	Kind   string            // SnapKind*, when not ""
	Parent *string           // the parent's key ("" for none), when not nil
	Labels map[string]string // label key -> value, each must be equal
}

// snapshotsWhere returns the snapshots that f selects,
// ordered by row id. A filter on the key, on the parent or on
// containerd.io/snapshot.ref is answered from an index.
func (s Records) snapshotsWhere(ctx context.Context, f snapshotFilter) ([]CDSnapshot, error) {
	q, args, err := snapshotsWhereSQL(f)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	out, err := metadata.QueryAll(ctx, s.q, func(r *sql.Rows) (CDSnapshot, error) { return scanCDSnapshot(r) }, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	return out, nil
}

// snapshotsWhereSQL is snapshotsWhere's query and its arguments.
func snapshotsWhereSQL(f snapshotFilter) (string, []any, error) {
	where := []string{"s.namespace = ''"}
	var args []any
	if f.Key != "" {
		where = append(where, "s.key = ?")
		args = append(args, f.Key)
	}
	if f.Kind != "" {
		where = append(where, "s.kind = ?")
		args = append(args, f.Kind)
	}
	if f.Parent != nil {
		if *f.Parent == "" {
			where = append(where, "s.parent_id IS NULL")
		} else {
			where = append(where, "s.parent_id = (SELECT id FROM cd_snapshots WHERE namespace = '' AND key = ?)")
			args = append(args, *f.Parent)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(f.Labels)) {
		expr, err := labelExpr("s", k)
		if err != nil {
			return "", nil, err
		}
		where = append(where, expr+" = ?")
		args = append(args, f.Labels[k])
	}
	return `SELECT ` + cdSnapshotColumns + ` WHERE ` + strings.Join(where, " AND ") + ` ORDER BY s.id`, args, nil
}

// childCount returns how many snapshots name row id as their parent.
func (s Records) childCount(ctx context.Context, id int64) (int, error) {
	var n int
	if err := s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM cd_snapshots WHERE parent_id = ?`, id).Scan(&n); err != nil {
		return 0, fmt.Errorf("count children of snapshot row %d: %w", id, err)
	}
	return n, nil
}

// InsertSnapshot records a new snapshot and returns its row id. The device
// snap.DeviceID must already be recorded (InsertThinDevice) in the same
// transaction.
func (s Records) InsertSnapshot(ctx context.Context, snap CDSnapshot) (int64, error) {
	labels, err := encodeLabels(snap.Labels)
	if err != nil {
		return 0, fmt.Errorf("insert snapshot %q: %w", snap.Key, err)
	}
	var parent any
	if snap.ParentID != 0 {
		parent = snap.ParentID
	}
	res, err := s.q.ExecContext(ctx, `INSERT INTO cd_snapshots
		(namespace, key, kind, parent_id, device_id, labels, created_ns, updated_ns, size_bytes, inodes)
		VALUES ('', ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		snap.Key, snap.Kind, parent, snap.DeviceID, labels,
		snap.CreatedNs, snap.UpdatedNs, snap.SizeBytes, snap.Inodes)
	if err != nil {
		return 0, fmt.Errorf("insert snapshot %q: %w", snap.Key, err)
	}
	return res.LastInsertId()
}

// commitSnapshot turns the active snapshot at row id into the committed
// snapshot named name, replacing its labels and times and recording its
// usage.
func (s Records) commitSnapshot(ctx context.Context, id int64, name string, labels map[string]string, nowNs, sizeBytes, inodes int64) error {
	text, err := encodeLabels(labels)
	if err != nil {
		return fmt.Errorf("commit snapshot row %d as %q: %w", id, name, err)
	}
	res, err := s.q.ExecContext(ctx, `UPDATE cd_snapshots SET key = ?, kind = 'committed', labels = ?,
		created_ns = ?, updated_ns = ?, size_bytes = ?, inodes = ? WHERE id = ? AND kind = 'active'`,
		name, text, nowNs, nowNs, sizeBytes, inodes, id)
	if err != nil {
		return fmt.Errorf("commit snapshot row %d as %q: %w", id, name, err)
	}
	return expectOneRow(res, fmt.Sprintf("commit snapshot row %d as %q: no active snapshot with that id", id, name))
}

// updateSnapshotLabels replaces the labels and the update time of row id.
func (s Records) updateSnapshotLabels(ctx context.Context, id int64, labels map[string]string, nowNs int64) error {
	text, err := encodeLabels(labels)
	if err != nil {
		return fmt.Errorf("update labels of snapshot row %d: %w", id, err)
	}
	res, err := s.q.ExecContext(ctx, `UPDATE cd_snapshots SET labels = ?, updated_ns = ? WHERE id = ?`, text, nowNs, id)
	if err != nil {
		return fmt.Errorf("update labels of snapshot row %d: %w", id, err)
	}
	return expectOneRow(res, fmt.Sprintf("update labels of snapshot row %d: no such snapshot", id))
}

// RemoveSnapshot drops the record of snapshot key and marks
// its device removed, in at most three statements, unless the snapshot has
// children (other snapshots naming it as parent, or create intents using its
// device as origin). It returns the device, the number of children, and
// whether the snapshot exists; nothing is written when found is false or
// children is not 0.
func (s Records) RemoveSnapshot(ctx context.Context, key string, nowNs int64) (dev ThinDevice, children int, found bool, err error) {
	var rowID int64
	err = s.q.QueryRowContext(ctx, `SELECT s.id, d.device_id, d.name, IFNULL(d.origin_id, 0), d.role, d.state, d.size_bytes,
		d.fs_type, d.created_ns, d.updated_ns,
		(SELECT COUNT(*) FROM cd_snapshots c WHERE c.parent_id = s.id) +
		(SELECT COUNT(*) FROM device_intents i WHERE i.origin_id = s.device_id)
		FROM cd_snapshots s JOIN thin_devices d ON d.device_id = s.device_id
		WHERE s.namespace = '' AND s.key = ?`, key).Scan(&rowID, &dev.ID, &dev.Name, &dev.OriginID, &dev.Role,
		&dev.State, &dev.SizeBytes, &dev.FSType, &dev.CreatedNs, &dev.UpdatedNs, &children)
	if errors.Is(err, sql.ErrNoRows) {
		return ThinDevice{}, 0, false, nil
	}
	if err != nil {
		return ThinDevice{}, 0, false, fmt.Errorf("remove snapshot %q: %w", key, err)
	}
	if children > 0 {
		return dev, children, true, nil
	}
	if err := s.deleteSnapshot(ctx, rowID); err != nil {
		return dev, 0, true, err
	}
	if err := s.setThinDeviceState(ctx, dev.ID, ThinStateRemoved, nowNs); err != nil {
		return dev, 0, true, err
	}
	dev.State, dev.UpdatedNs = ThinStateRemoved, nowNs
	return dev, 0, true, nil
}

// deleteSnapshot drops the snapshot record at row id. The caller checks for
// children first (the foreign key refuses otherwise).
func (s Records) deleteSnapshot(ctx context.Context, id int64) error {
	res, err := s.q.ExecContext(ctx, `DELETE FROM cd_snapshots WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete snapshot row %d: %w", id, err)
	}
	return expectOneRow(res, fmt.Sprintf("delete snapshot row %d: no such snapshot", id))
}

// moveDevice makes snapshot row id own device deviceID in place of device
// from (freed by the caller first: a device has one snapshot), with
// sizeBytes recorded as its mapped bytes. It moves nothing and fails with
// errdefs.ErrFailedPrecondition when the row is gone or no longer owns
// from: another replacement went first, and writing over it would leave
// that one's device owned by no snapshot.
func (s Records) moveDevice(ctx context.Context, id int64, from, deviceID uint32, sizeBytes, nowNs int64) error {
	res, err := s.q.ExecContext(ctx, `UPDATE cd_snapshots SET device_id = ?, size_bytes = ?, updated_ns = ? WHERE id = ? AND device_id = ?`,
		int64(deviceID), sizeBytes, nowNs, id, int64(from))
	if err != nil {
		return fmt.Errorf("move device %d to snapshot row %d: %w", deviceID, id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("move device %d to snapshot row %d: %w", deviceID, id, err)
	}
	if n != 1 {
		return fmt.Errorf("move device %d to snapshot row %d: no such snapshot, or it no longer owns device %d: %w", deviceID, id, from, errdefs.ErrFailedPrecondition)
	}
	return nil
}

func expectOneRow(res sql.Result, msg string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: %w", msg, err)
	}
	if n != 1 {
		return errors.New(msg)
	}
	return nil
}

const thinDeviceColumns = `device_id, name, IFNULL(origin_id, 0), role, state, size_bytes, fs_type, created_ns, updated_ns FROM thin_devices`

func scanThinDevice(sc interface{ Scan(...any) error }) (ThinDevice, error) {
	var d ThinDevice
	err := sc.Scan(&d.ID, &d.Name, &d.OriginID, &d.Role, &d.State, &d.SizeBytes, &d.FSType, &d.CreatedNs, &d.UpdatedNs)
	return d, err
}

// InsertThinDevice records a thin device.
func (s Records) InsertThinDevice(ctx context.Context, d ThinDevice) error {
	var origin any
	if d.OriginID != 0 {
		origin = d.OriginID
	}
	if _, err := s.q.ExecContext(ctx, `INSERT INTO thin_devices
		(device_id, name, origin_id, role, state, size_bytes, fs_type, created_ns, updated_ns)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		d.ID, d.Name, origin, d.Role, d.State, d.SizeBytes, d.FSType, d.CreatedNs, d.UpdatedNs); err != nil {
		return fmt.Errorf("insert thin device %d (%s): %w", d.ID, d.Name, err)
	}
	return nil
}

// thinDevice returns the device record of thin id id; ok is false when there
// is none.
func (s Records) thinDevice(ctx context.Context, id uint32) (d ThinDevice, ok bool, err error) {
	d, err = scanThinDevice(s.q.QueryRowContext(ctx, `SELECT `+thinDeviceColumns+` WHERE device_id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return ThinDevice{}, false, nil
	}
	if err != nil {
		return ThinDevice{}, false, fmt.Errorf("read thin device %d: %w", id, err)
	}
	return d, true, nil
}

// baseDevice returns the pool's base device record; ok is false until the
// base has been formatted.
func (s Records) baseDevice(ctx context.Context) (d ThinDevice, ok bool, err error) {
	d, err = scanThinDevice(s.q.QueryRowContext(ctx, `SELECT `+thinDeviceColumns+` WHERE role = 'base'`))
	if errors.Is(err, sql.ErrNoRows) {
		return ThinDevice{}, false, nil
	}
	if err != nil {
		return ThinDevice{}, false, fmt.Errorf("read base device: %w", err)
	}
	return d, true, nil
}

// ThinDevices returns every device record, or only those in state when
// state is not "", ordered by id.
func (s Records) ThinDevices(ctx context.Context, state string) ([]ThinDevice, error) {
	q, args := `SELECT `+thinDeviceColumns+` ORDER BY device_id`, []any(nil)
	if state != "" {
		q, args = `SELECT `+thinDeviceColumns+` WHERE state = ? ORDER BY device_id`, []any{state}
	}
	out, err := metadata.QueryAll(ctx, s.q, func(r *sql.Rows) (ThinDevice, error) { return scanThinDevice(r) }, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list thin devices (state %q): %w", state, err)
	}
	return out, nil
}

// setThinDeviceState records that device id is now in state.
func (s Records) setThinDeviceState(ctx context.Context, id uint32, state string, nowNs int64) error {
	res, err := s.q.ExecContext(ctx, `UPDATE thin_devices SET state = ?, updated_ns = ? WHERE device_id = ?`, state, nowNs, id)
	if err != nil {
		return fmt.Errorf("set thin device %d state %q: %w", id, state, err)
	}
	return expectOneRow(res, fmt.Sprintf("set thin device %d state %q: no such device", id, state))
}

// deleteThinDevice drops the record of device id, once the device is gone
// from the pool. Deleting an absent record is not an error.
func (s Records) deleteThinDevice(ctx context.Context, id uint32) error {
	if _, err := s.q.ExecContext(ctx, `DELETE FROM thin_devices WHERE device_id = ?`, id); err != nil {
		return fmt.Errorf("delete thin device %d: %w", id, err)
	}
	return nil
}

// deleteRemovedThinDevice drops the record of device id only while it is
// still the removed device name, and reports whether it did. A reclaim
// deletes the row of the device it deleted from the pool, never a record
// that has since taken the same id.
func (s Records) deleteRemovedThinDevice(ctx context.Context, id uint32, name string) (bool, error) {
	res, err := s.q.ExecContext(ctx, `DELETE FROM thin_devices WHERE device_id = ? AND name = ? AND state = 'removed'`, id, name)
	if err != nil {
		return false, fmt.Errorf("delete removed thin device %d (%s): %w", id, name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("delete removed thin device %d (%s): %w", id, name, err)
	}
	return n == 1, nil
}

// insertIntent records device work about to be done. It fails when the
// device id, or the key, is already reserved by another
// intent.
func (s Records) insertIntent(ctx context.Context, in DeviceIntent) (int64, error) {
	var origin, ns, key any
	if in.OriginID != 0 {
		origin = in.OriginID
	}
	if in.Key != "" {
		ns, key = "", in.Key
	}
	res, err := s.q.ExecContext(ctx, `INSERT INTO device_intents
		(op, device_id, name, origin_id, namespace, key, created_ns) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		in.Op, in.DeviceID, in.Name, origin, ns, key, in.CreatedNs)
	if err != nil {
		return 0, fmt.Errorf("record %s intent for device %d (%s): %w", in.Op, in.DeviceID, in.Name, err)
	}
	return res.LastInsertId()
}

// Intents returns every recorded intent, oldest first.
func (s Records) Intents(ctx context.Context) ([]DeviceIntent, error) {
	out, err := metadata.QueryAll(ctx, s.q, func(r *sql.Rows) (DeviceIntent, error) {
		var in DeviceIntent
		err := r.Scan(&in.ID, &in.Op, &in.DeviceID, &in.Name, &in.OriginID, &in.Key, &in.CreatedNs)
		return in, err
	}, `SELECT id, op, device_id, name, IFNULL(origin_id, 0),
		IFNULL(key, ''), created_ns FROM device_intents ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list device intents: %w", err)
	}
	return out, nil
}

// keyReserved reports whether an intent reserves key.
func (s Records) keyReserved(ctx context.Context, key string) (bool, error) {
	var n int
	if err := s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM device_intents WHERE namespace = '' AND key = ?`, key).Scan(&n); err != nil {
		return false, fmt.Errorf("check intents for key %q: %w", key, err)
	}
	return n > 0, nil
}

// intentsWithOrigin returns how many intents create a device from origin.
func (s Records) intentsWithOrigin(ctx context.Context, origin uint32) (int, error) {
	var n int
	if err := s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM device_intents WHERE origin_id = ?`, origin).Scan(&n); err != nil {
		return 0, fmt.Errorf("count intents with origin %d: %w", origin, err)
	}
	return n, nil
}

// deleteIntent drops intent id. Deleting an absent intent is not an error.
func (s Records) deleteIntent(ctx context.Context, id int64) error {
	if _, err := s.q.ExecContext(ctx, `DELETE FROM device_intents WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delete device intent %d: %w", id, err)
	}
	return nil
}

// Quarantine records thin id id as never to be reused, with the reason and
// whether its device was deleted from the pool. Quarantining an id again
// updates the reason and the deleted flag (which never goes back to 0).
func (s Records) Quarantine(ctx context.Context, id uint32, reason string, deleted bool, nowNs int64) error {
	del := 0
	if deleted {
		del = 1
	}
	if _, err := s.q.ExecContext(ctx, `INSERT INTO quarantined_thin_ids (device_id, reason, deleted, quarantined_ns)
		VALUES (?, ?, ?, ?) ON CONFLICT(device_id) DO UPDATE SET reason = excluded.reason,
		deleted = MAX(deleted, excluded.deleted)`, id, reason, del, nowNs); err != nil {
		return fmt.Errorf("quarantine thin id %d: %w", id, err)
	}
	return nil
}

// releaseQuarantined forgets the quarantine of thin id id, which may then
// be chosen for a new device; false when it was not quarantined.
func (s Records) releaseQuarantined(ctx context.Context, id uint32) (bool, error) {
	res, err := s.q.ExecContext(ctx, `DELETE FROM quarantined_thin_ids WHERE device_id = ?`, id)
	if err != nil {
		return false, fmt.Errorf("release quarantined thin id %d: %w", id, err)
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// QuarantinedIDs returns every quarantined thin id, ordered by id.
func (s Records) QuarantinedIDs(ctx context.Context) ([]QuarantinedID, error) {
	out, err := metadata.QueryAll(ctx, s.q, func(r *sql.Rows) (QuarantinedID, error) {
		var q QuarantinedID
		err := r.Scan(&q.DeviceID, &q.Reason, &q.Deleted, &q.QuarantinedNs)
		return q, err
	}, `SELECT device_id, reason, deleted, quarantined_ns FROM quarantined_thin_ids ORDER BY device_id`)
	if err != nil {
		return nil, fmt.Errorf("list quarantined thin ids: %w", err)
	}
	return out, nil
}

// thinIDUsed reports whether thin id id is taken: recorded as a device,
// reserved by an intent, or quarantined.
func (s Records) thinIDUsed(ctx context.Context, id uint32) (bool, error) {
	var n int
	if err := s.q.QueryRowContext(ctx, `SELECT
		(SELECT COUNT(*) FROM thin_devices WHERE device_id = ?1) +
		(SELECT COUNT(*) FROM device_intents WHERE device_id = ?1) +
		(SELECT COUNT(*) FROM quarantined_thin_ids WHERE device_id = ?1)`, id).Scan(&n); err != nil {
		return false, fmt.Errorf("check whether thin id %d is used: %w", id, err)
	}
	return n > 0, nil
}

// DeviceStateCounts returns how many devices are in each state the
// snapshotter reports: "active", "view" and "committed" (snapshots by kind),
// "removed-pending" (devices awaiting Cleanup), "quarantined" (quarantined
// ids whose device may still be in the pool) and "base". Every key is
// present, zero when nothing is in that state.
func (s Records) DeviceStateCounts(ctx context.Context) (map[string]int, error) {
	out := map[string]int{"active": 0, "view": 0, "committed": 0, "removed-pending": 0, "quarantined": 0, "base": 0}
	rows, err := s.q.QueryContext(ctx, `SELECT kind, COUNT(*) FROM cd_snapshots GROUP BY kind
		UNION ALL SELECT 'removed-pending', COUNT(*) FROM thin_devices WHERE state = 'removed'
		UNION ALL SELECT 'base', COUNT(*) FROM thin_devices WHERE role = 'base'
		UNION ALL SELECT 'quarantined', COUNT(*) FROM quarantined_thin_ids WHERE deleted = 0`)
	if err != nil {
		return nil, fmt.Errorf("count devices by state: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			k string
			n int
		)
		if err := rows.Scan(&k, &n); err != nil {
			return nil, fmt.Errorf("count devices by state: %w", err)
		}
		out[k] += n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count devices by state: %w", err)
	}
	return out, nil
}
