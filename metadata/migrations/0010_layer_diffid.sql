-- A layer file's diff ID, apart from its digest.
--
-- A layer may be stored plain or compressed (gzip, zstd). The file we
-- downloaded is kept and found by the SHA-256 of its bytes (digest); the
-- layer's identity, which names its chains and what containerd is told, is
-- the SHA-256 of its uncompressed tar (diff_id), so the same layer stored
-- plain under one key and compressed under another makes the same chains.
-- Every file recorded before this migration is a plain tar: its diff ID is
-- its digest. Never edit this file's statements: the ledger records its
-- SHA-256.
ALTER TABLE layers ADD COLUMN diff_id TEXT NOT NULL DEFAULT '';
UPDATE layers SET diff_id = digest;
CREATE INDEX layers_diff_id ON layers (diff_id);
