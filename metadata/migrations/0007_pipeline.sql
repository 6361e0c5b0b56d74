-- S3 pipelines: content-addressed blobs, ETag reuse, unpacked
-- layer chains and pulled images.
--
-- Times are INTEGER unix nanoseconds (UTC). Never edit this file: the ledger
-- records its SHA-256.

-- One row per downloaded and validated layer tarball, by content. The file
-- lives at path (<download_dir>/blobs/sha256/<hex>); stat_* is the file's
-- identity when its SHA-256 was last computed, so an unchanged file is not
-- hashed again by every idempotent check.
CREATE TABLE IF NOT EXISTS pipeline_blobs (
    digest TEXT PRIMARY KEY,                 -- "sha256:<hex>", the layer's diff ID
    path TEXT NOT NULL,
    size_bytes INTEGER NOT NULL CHECK (size_bytes >= 0),
    has_rootfs INTEGER NOT NULL DEFAULT 0 CHECK (has_rootfs IN (0, 1)),
    entries INTEGER NOT NULL DEFAULT 0 CHECK (entries >= 0),
    stat_size INTEGER NOT NULL,
    stat_mtime_ns INTEGER NOT NULL,
    stat_ino INTEGER NOT NULL,
    created_ns INTEGER NOT NULL
);

-- S3 objects whose (non-multipart) ETag and size identify a blob already
-- stored: another key with the same ETag and size is not downloaded again.
CREATE TABLE IF NOT EXISTS pipeline_etags (
    etag TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    digest TEXT NOT NULL REFERENCES pipeline_blobs(digest) ON DELETE CASCADE,
    PRIMARY KEY (etag, size_bytes)
);

-- One row per unpacked layer chain (OCI chain ID): the committed snapshot
-- named chain_id holds layers 1..n; its device record is the
-- unpacked_images row of image_id (the images row of the layer's S3 key
-- that first unpacked this chain).
CREATE TABLE IF NOT EXISTS pipeline_chains (
    chain_id TEXT PRIMARY KEY,
    parent_chain_id TEXT NOT NULL,           -- '' for the first layer
    diff_id TEXT NOT NULL,
    image_id TEXT NOT NULL UNIQUE REFERENCES unpacked_images(image_id) ON DELETE CASCADE,
    created_ns INTEGER NOT NULL
);

CREATE INDEX IF NOT EXISTS idx_pipeline_chains_parent ON pipeline_chains(parent_chain_id);

-- Pulled images by reference: what a re-pull reuses without asking S3.
CREATE TABLE IF NOT EXISTS pipeline_images (
    ref TEXT PRIMARY KEY,                    -- --name, or the s3:// source
    source TEXT NOT NULL,                    -- s3://bucket/key-or-prefix as pulled
    image_id TEXT NOT NULL,                  -- images.image_id carrying the activation
    layers TEXT NOT NULL,                    -- JSON array of the layers (key, size, etag, diff id)
    top_chain_id TEXT NOT NULL,
    snapshot_key TEXT NOT NULL,              -- the active snapshot's key
    updated_ns INTEGER NOT NULL
);

CREATE INDEX IF NOT EXISTS idx_pipeline_images_source ON pipeline_images(source);
