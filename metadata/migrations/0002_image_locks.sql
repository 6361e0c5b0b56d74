-- Image locks for concurrency control (version 2).
--
-- One row per image being unpacked; the PRIMARY KEY on image_id makes
-- acquisition atomic. locked_at is INTEGER unix seconds (SQLite's
-- unixepoch('now')). Never edit this file: the ledger records its SHA-256.

CREATE TABLE IF NOT EXISTS image_locks (
    image_id TEXT PRIMARY KEY,
    locked_at INTEGER NOT NULL,
    locked_by TEXT NOT NULL
);

CREATE INDEX IF NOT EXISTS idx_image_locks_locked_at ON image_locks(locked_at);
