-- 0012_containerd_pending: the names recorded for an image that containerd
-- does not have yet, per containerd namespace ('' is the registrar's own):
-- its socket was absent when the activate run registered them (the daemon
-- starts before containerd at boot; containerd restarts). While a row is
-- here, containerd's garbage collector may not remove the image's chains
-- (it removes every backend snapshot it does not know), and the daemon
-- registers the name as soon as containerd answers. The name's image is
-- read from image_names, where it is recorded once; replace is the pull's
-- --replace (the name may repoint a containerd image this daemon did not
-- create).
CREATE TABLE containerd_pending (
    name      TEXT    NOT NULL REFERENCES image_names (name) ON DELETE CASCADE,
    namespace TEXT    NOT NULL DEFAULT '',
    replace   INTEGER NOT NULL DEFAULT 0 CHECK (replace IN (0, 1)),
    since_ns  INTEGER NOT NULL,
    PRIMARY KEY (name, namespace)
);
