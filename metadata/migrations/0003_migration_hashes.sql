-- Migration ledger hashes (integrity rule): sql_sha256 per version.
--
-- sql_sha256 is the hex SHA-256 of the migration file's text with leading and
-- trailing white space trimmed. The runner records it for every migration
-- from this one on; versions 1 and 2 are back-filled here with the hashes of
-- the embedded 0001_initial.sql and 0002_image_locks.sql. Opening a database
-- whose recorded hash differs from the embedded migration's is refused.
-- Never edit this file: the ledger records its SHA-256.

ALTER TABLE schema_migrations ADD COLUMN sql_sha256 TEXT;

UPDATE schema_migrations
   SET sql_sha256 = 'ec5b78dca89d36101c7ac576c742121be8673f68dff052d6eade27c27b4f0072'
 WHERE version = 1 AND sql_sha256 IS NULL;

UPDATE schema_migrations
   SET sql_sha256 = '680b60b4c1e683201cfa06a9e50e2ac7b863bc4286752d49a8a2f585278433da'
 WHERE version = 2 AND sql_sha256 IS NULL;
