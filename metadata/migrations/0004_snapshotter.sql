-- 0004_snapshotter: containerd snapshot records, thin device records, device
-- intents and quarantined thin ids.
--
-- Time columns in these tables are INTEGER unix nanoseconds (UTC).
-- A thin id is the 24-bit device id inside the pool (1 .. 0xffffff; 0 is
-- never used). Names avoid the `snapshots` table of migration 1.

-- One row per thin device the snapshotter owns in the pool: the base device
-- (formatted once per pool) and one device per containerd snapshot. A device
-- whose snapshot was removed stays here in state 'removed' until Cleanup (or a
-- synchronous Remove) deletes it from the pool; the row is dropped in the same
-- transaction that records the deletion.
CREATE TABLE thin_devices (
    device_id  INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL UNIQUE,          -- dm name, e.g. flyio-pool-snap-1234
    origin_id  INTEGER,                          -- thin id it was snapshotted from; NULL for the base
    role       TEXT    NOT NULL,                 -- 'base' | 'snapshot'
    state      TEXT    NOT NULL,                 -- 'active' (dm device present) | 'inactive' | 'removed'
    size_bytes INTEGER NOT NULL,                 -- virtual size of the thin device
    fs_type    TEXT    NOT NULL,                 -- filesystem on it (inherited from the base)
    created_ns INTEGER NOT NULL,
    updated_ns INTEGER NOT NULL,
    CHECK (device_id BETWEEN 1 AND 16777215),
    CHECK (role IN ('base', 'snapshot')),
    CHECK (state IN ('active', 'inactive', 'removed')),
    CHECK (size_bytes > 0)
);
CREATE INDEX idx_thin_devices_state ON thin_devices(state);
CREATE UNIQUE INDEX idx_thin_devices_one_base ON thin_devices(role) WHERE role = 'base';

-- containerd's snapshot records, one namespace per containerd namespace. A
-- snapshot's parent is referenced by row id, so committing (which renames the
-- key in place) never breaks a child's link. Every snapshot owns exactly one
-- thin device.
CREATE TABLE cd_snapshots (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace   TEXT    NOT NULL,
    key         TEXT    NOT NULL,                -- key (active/view) or name (committed)
    kind        TEXT    NOT NULL,                -- 'active' | 'view' | 'committed'
    parent_id   INTEGER REFERENCES cd_snapshots(id) ON DELETE RESTRICT,
    device_id   INTEGER NOT NULL UNIQUE REFERENCES thin_devices(device_id) ON DELETE RESTRICT,
    labels      TEXT    NOT NULL DEFAULT '{}',   -- JSON object of string labels
    created_ns  INTEGER NOT NULL,
    updated_ns  INTEGER NOT NULL,
    size_bytes  INTEGER NOT NULL DEFAULT 0,      -- mapped bytes recorded at commit
    inodes      INTEGER NOT NULL DEFAULT 0,
    UNIQUE (namespace, key),
    CHECK (kind IN ('active', 'view', 'committed')),
    CHECK (size_bytes >= 0)
);
CREATE INDEX idx_cd_snapshots_parent ON cd_snapshots(parent_id);

-- Device work announced before it is done. A row is written (in its own
-- transaction) before any dm call creates a device, and removed in the same
-- transaction that records the outcome. A row found at start-up means the
-- process died in between: reconciliation rolls the device back. The
-- (namespace, key) pair reserves a key while its device is being made.
CREATE TABLE device_intents (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    op         TEXT    NOT NULL,                 -- 'create' | 'format_base'
    device_id  INTEGER NOT NULL UNIQUE,
    name       TEXT    NOT NULL,
    origin_id  INTEGER,
    namespace  TEXT,
    key        TEXT,
    created_ns INTEGER NOT NULL,
    CHECK (op IN ('create', 'format_base')),
    CHECK (device_id BETWEEN 1 AND 16777215)
);
CREATE UNIQUE INDEX idx_device_intents_key ON device_intents(namespace, key) WHERE key IS NOT NULL;

-- Thin ids found in the pool that nothing explains, or that could not be
-- cleaned up. Never reused. `deleted` = 1 when the device itself was removed
-- from the pool (by configuration); the id stays reserved either way.
CREATE TABLE quarantined_thin_ids (
    device_id      INTEGER PRIMARY KEY,
    reason         TEXT    NOT NULL,
    deleted        INTEGER NOT NULL DEFAULT 0,
    quarantined_ns INTEGER NOT NULL,
    CHECK (device_id BETWEEN 0 AND 16777215),
    CHECK (deleted IN (0, 1))
);
