-- Image failure reason: why an image's download, validation or activation failed.
--
-- Nullable text on images, NULL unless the image is marked failed
-- (download_status = 'failed' or activation_status = 'failed'); a later
-- successful store-metadata or activation clears it. The pipelines
-- mark an image failed with the reason; the schema of migration 1 has no column
-- for it. Never edit this file: the ledger records its SHA-256.

ALTER TABLE images ADD COLUMN failure_reason TEXT;
