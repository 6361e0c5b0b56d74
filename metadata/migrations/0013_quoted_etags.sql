-- 0013_quoted_etags: ETags are recorded in S3's quoted form ("..."), the
-- form the S3 reader now gives whatever form a server lists them in. A
-- server that lists them unquoted (NetApp ONTAP, some Ceph releases) left
-- them unquoted here; without this, the first pull of every unchanged image
-- from such a server would download its layers again. Weak ETags (W/"...")
-- are left as they are: the reader refuses them.
UPDATE s3_objects SET etag = '"' || etag || '"'
 WHERE etag <> '' AND etag NOT LIKE '"%"' AND etag NOT LIKE 'W/%';
UPDATE image_layers SET etag = '"' || etag || '"'
 WHERE etag <> '' AND etag NOT LIKE '"%"' AND etag NOT LIKE 'W/%';
