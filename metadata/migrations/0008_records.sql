-- Records by content: objects, layers, chains, images, names; the first schema's tables as views.
--
-- Each fact is stored once. Words, here and everywhere in the project:
--   object      an S3 object (bucket, key, ETag, size) we downloaded;
--   layer       the content of a layer tarball, by the SHA-256 of the bytes
--               we downloaded and hashed ourselves (its diff ID);
--   chain       a layer on top of a parent chain (OCI chain ID): one
--               committed snapshot, so one thin device;
--   image       what `pull` makes from an S3 source (one key, or a prefix
--               whose .tar objects are its layers): ordered layers, a top
--               chain, and an activation;
--   activation  an image's active snapshot, key 'snap-' || image_id;
--   name        a reference under which an image is registered in
--               containerd.
-- A device's id and name live in thin_devices, owned by the snapshot in
-- cd_snapshots whose key is the chain ID or the activation key: they are
-- joined, never copied. The tables of migrations 1 and 2 (images,
-- unpacked_images, snapshots, image_locks) become read-only views over these
-- facts, with their columns, for operators; exclusivity is the unique index
-- of live runs in fsm_runs (one live run per machine and idempotency id),
-- which image_locks now lists.
--
-- Rows of the previous schema are carried over: every pulled image with its
-- layers, objects, chains and names; layer files by digest. Failed downloads
-- of single objects are not (they described no image). Times are INTEGER
-- unix nanoseconds (UTC). Never edit this file's statements: the ledger
-- records its SHA-256.

-- A layer's tarball as downloaded and validated, by content.
CREATE TABLE layers (
    digest        TEXT PRIMARY KEY,          -- "sha256:<hex>", the diff ID
    path          TEXT NOT NULL,             -- <download_dir>/blobs/sha256/<hex>
    size_bytes    INTEGER NOT NULL CHECK (size_bytes >= 0),
    has_rootfs    INTEGER NOT NULL DEFAULT 0 CHECK (has_rootfs IN (0, 1)),
    entries       INTEGER NOT NULL DEFAULT 0 CHECK (entries >= 0),
    -- the file's identity when its SHA-256 was last computed: an unchanged
    -- file is not hashed again
    stat_size     INTEGER NOT NULL,
    stat_mtime_ns INTEGER NOT NULL,
    stat_ino      INTEGER NOT NULL,
    created_ns    INTEGER NOT NULL
);

-- The S3 objects we downloaded, and the layer their bytes were. A download
-- is skipped only for the same bucket, key, ETag and size.
CREATE TABLE s3_objects (
    bucket        TEXT NOT NULL,
    key           TEXT NOT NULL,
    etag          TEXT NOT NULL,
    version_id    TEXT NOT NULL DEFAULT '',
    size_bytes    INTEGER NOT NULL CHECK (size_bytes >= 0),
    digest        TEXT NOT NULL,             -- layers.digest (the file may be evicted; the fact stays)
    downloaded_ns INTEGER NOT NULL,
    PRIMARY KEY (bucket, key)
);
CREATE INDEX s3_objects_digest ON s3_objects (digest);

-- Unpacked chains. The committed snapshot whose key is chain_id holds the
-- device; a row is written only after that snapshot was committed with its
-- layout verified.
CREATE TABLE chains (
    chain_id        TEXT PRIMARY KEY,
    parent_chain_id TEXT NOT NULL DEFAULT '',  -- '' for a first layer
    diff_id         TEXT NOT NULL,
    size_bytes      INTEGER NOT NULL DEFAULT 0 CHECK (size_bytes >= 0), -- bytes extracted
    file_count      INTEGER NOT NULL DEFAULT 0 CHECK (file_count >= 0),
    unpacked_ns     INTEGER NOT NULL
);
CREATE INDEX chains_parent ON chains (parent_chain_id);

-- Images by source. image_id is derived from the source; the activation's
-- key from image_id.
CREATE TABLE s3_images (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    image_id       TEXT NOT NULL UNIQUE,
    source         TEXT NOT NULL UNIQUE,       -- s3://bucket/key or s3://bucket/prefix/
    failure_reason TEXT,                       -- why the last pull failed; NULL after a success
    created_ns     INTEGER NOT NULL,
    pulled_ns      INTEGER                     -- last successful pull; NULL before the first
);

-- The layers an image was last pulled as, bottom first: the objects listed
-- then (key in the image's bucket, ETag, size) and the chain each made.
CREATE TABLE image_layers (
    image_id   TEXT NOT NULL REFERENCES s3_images (image_id) ON DELETE CASCADE,
    position   INTEGER NOT NULL CHECK (position >= 1),
    key        TEXT NOT NULL,
    etag       TEXT NOT NULL DEFAULT '',
    version_id TEXT NOT NULL DEFAULT '',
    size_bytes INTEGER NOT NULL CHECK (size_bytes >= 0),
    chain_id   TEXT NOT NULL,
    PRIMARY KEY (image_id, position)
);
CREATE INDEX image_layers_chain ON image_layers (chain_id);

-- The names under which images are registered in containerd.
CREATE TABLE image_names (
    name          TEXT PRIMARY KEY,
    image_id      TEXT NOT NULL REFERENCES s3_images (image_id) ON DELETE CASCADE,
    registered_ns INTEGER NOT NULL
);
CREATE INDEX image_names_image ON image_names (image_id);

-- Carry the previous schema's rows over.
INSERT INTO layers (digest, path, size_bytes, has_rootfs, entries, stat_size, stat_mtime_ns, stat_ino, created_ns)
    SELECT digest, path, size_bytes, has_rootfs, entries, stat_size, stat_mtime_ns, stat_ino, created_ns FROM pipeline_blobs;

INSERT INTO chains (chain_id, parent_chain_id, diff_id, size_bytes, file_count, unpacked_ns)
    SELECT c.chain_id, c.parent_chain_id, c.diff_id, COALESCE(u.size_bytes, 0), COALESCE(u.file_count, 0), c.created_ns
      FROM pipeline_chains c LEFT JOIN unpacked_images u ON u.image_id = c.image_id;

INSERT INTO s3_images (image_id, source, created_ns, pulled_ns)
    SELECT image_id, source, MIN(updated_ns), MAX(updated_ns) FROM pipeline_images GROUP BY image_id ORDER BY MIN(updated_ns);

INSERT INTO image_layers (image_id, position, key, etag, size_bytes, chain_id)
    SELECT p.image_id, CAST(j.key AS INTEGER) + 1, json_extract(j.value, '$.key'),
           COALESCE(json_extract(j.value, '$.etag'), ''), json_extract(j.value, '$.size'), json_extract(j.value, '$.chain_id')
      FROM pipeline_images p, json_each(p.layers) j
     WHERE p.ref = (SELECT q.ref FROM pipeline_images q WHERE q.image_id = p.image_id ORDER BY q.updated_ns DESC LIMIT 1);

INSERT OR REPLACE INTO s3_objects (bucket, key, etag, size_bytes, digest, downloaded_ns)
    SELECT substr(p.source, 6, instr(substr(p.source, 6), '/') - 1), json_extract(j.value, '$.key'),
           COALESCE(json_extract(j.value, '$.etag'), ''), json_extract(j.value, '$.size'), json_extract(j.value, '$.diff_id'), p.updated_ns
      FROM pipeline_images p, json_each(p.layers) j
     ORDER BY p.updated_ns;

INSERT INTO image_names (name, image_id, registered_ns)
    SELECT ref, image_id, updated_ns FROM pipeline_images;

DROP TABLE snapshots;
DROP TABLE pipeline_chains;
DROP TABLE unpacked_images;
DROP TABLE pipeline_etags;
DROP TABLE pipeline_blobs;
DROP TABLE pipeline_images;
DROP TABLE image_locks;
DROP TABLE images;

-- The first schema's tables, derived. Text times as that schema had them.
CREATE VIEW images AS
SELECT i.id, i.image_id, i.source AS s3_key,
       COALESCE((SELECT l.path FROM image_layers il JOIN layers l ON l.digest =
                   (SELECT c.diff_id FROM chains c WHERE c.chain_id = il.chain_id)
                  WHERE il.image_id = i.image_id ORDER BY il.position DESC LIMIT 1), '') AS local_path,
       (SELECT il.chain_id FROM image_layers il WHERE il.image_id = i.image_id
         ORDER BY il.position DESC LIMIT 1) AS checksum,
       COALESCE((SELECT SUM(il.size_bytes) FROM image_layers il WHERE il.image_id = i.image_id), 0) AS size_bytes,
       CASE WHEN i.pulled_ns IS NOT NULL THEN 'completed'
            WHEN i.failure_reason IS NOT NULL THEN 'failed'
            ELSE 'pending' END AS download_status,
       CASE WHEN EXISTS (SELECT 1 FROM cd_snapshots a WHERE a.key = 'snap-' || i.image_id AND a.kind = 'active') THEN 'active'
            WHEN i.failure_reason IS NOT NULL AND i.pulled_ns IS NOT NULL THEN 'failed'
            ELSE 'inactive' END AS activation_status,
       datetime(i.created_ns / 1000000000, 'unixepoch') AS created_at,
       datetime(i.pulled_ns / 1000000000, 'unixepoch') AS downloaded_at,
       (SELECT datetime(a.created_ns / 1000000000, 'unixepoch') FROM cd_snapshots a
         WHERE a.key = 'snap-' || i.image_id AND a.kind = 'active') AS activated_at,
       datetime(MAX(i.created_ns, COALESCE(i.pulled_ns, 0)) / 1000000000, 'unixepoch') AS updated_at,
       i.failure_reason
  FROM s3_images i;

-- One row per image whose top chain is unpacked; its device is the top
-- chain's, its sizes the sums over its chains.
CREATE VIEW unpacked_images AS
SELECT i.id, i.image_id, CAST(s.device_id AS TEXT) AS device_id, d.name AS device_name,
       '/dev/mapper/' || d.name AS device_path,
       (SELECT COALESCE(SUM(c2.size_bytes), 0) FROM image_layers x JOIN chains c2 ON c2.chain_id = x.chain_id
         WHERE x.image_id = i.image_id) AS size_bytes,
       (SELECT COALESCE(SUM(c2.file_count), 0) FROM image_layers x JOIN chains c2 ON c2.chain_id = x.chain_id
         WHERE x.image_id = i.image_id) AS file_count,
       1 AS layout_verified,
       datetime(c.unpacked_ns / 1000000000, 'unixepoch') AS created_at,
       datetime(c.unpacked_ns / 1000000000, 'unixepoch') AS unpacked_at,
       datetime(c.unpacked_ns / 1000000000, 'unixepoch') AS updated_at
  FROM s3_images i
  JOIN image_layers il ON il.image_id = i.image_id
   AND il.position = (SELECT MAX(x.position) FROM image_layers x WHERE x.image_id = i.image_id)
  JOIN chains c ON c.chain_id = il.chain_id
  JOIN cd_snapshots s ON s.key = c.chain_id AND s.kind = 'committed'
  JOIN thin_devices d ON d.device_id = s.device_id;

-- One row per activation.
CREATE VIEW snapshots AS
SELECT a.id, i.image_id, CAST(p.device_id AS TEXT) || '-snap-' || i.image_id AS snapshot_id,
       a.key AS snapshot_name, '/dev/mapper/' || d.name AS device_path,
       CAST(p.device_id AS TEXT) AS origin_device_id, 1 AS active,
       datetime(a.created_ns / 1000000000, 'unixepoch') AS created_at, NULL AS deactivated_at,
       datetime(a.updated_ns / 1000000000, 'unixepoch') AS updated_at
  FROM s3_images i
  JOIN cd_snapshots a ON a.key = 'snap-' || i.image_id AND a.kind = 'active'
  JOIN thin_devices d ON d.device_id = a.device_id
  JOIN cd_snapshots p ON p.id = a.parent_id;

-- What each live run holds: its machine and idempotency id.
CREATE VIEW image_locks AS
SELECT idempotency_id AS image_id, COALESCE(started_at, created_at) / 1000000000 AS locked_at,
       fsm || ':' || run_id AS locked_by
  FROM fsm_runs WHERE state = 'running';

-- Lookups on hot paths.
CREATE INDEX IF NOT EXISTS idx_cd_snapshots_key ON cd_snapshots (key);
