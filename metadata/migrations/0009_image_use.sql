-- When each image was last used, for garbage collection least recently used
-- first: its last pull (one answered from the records too) or activation.
-- Times are INTEGER unix nanoseconds (UTC). Never edit this file's
-- statements: the ledger records its SHA-256.
ALTER TABLE s3_images ADD COLUMN used_ns INTEGER;
UPDATE s3_images SET used_ns = pulled_ns;
