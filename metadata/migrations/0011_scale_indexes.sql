-- 0011_scale_indexes: indexes for the lookups that run on every call, so
-- that a call's cost does not grow with the number of snapshots, chains,
-- images or finished runs recorded.

-- A Prepare carrying containerd's snapshot.ref label looks for a committed
-- snapshot with that label (RefTarget), and containerd then walks the
-- backend for it with a filter on the same label. The expression must stay
-- the one those queries use.
CREATE INDEX cd_snapshots_ref ON cd_snapshots (json_extract(labels, '$."containerd.io/snapshot.ref"'))
    WHERE kind = 'committed';

-- Removing a snapshot counts the creations under way on its device.
CREATE INDEX device_intents_origin ON device_intents (origin_id);

-- Pruning asks, for each object, whether an image layer names its key,
-- and, for each layer file, whether a chain was unpacked from it.
CREATE INDEX image_layers_key ON image_layers (key);
CREATE INDEX chains_diff_id ON chains (diff_id);

-- Pruning and the removal guard ask whether a live run has an idempotency
-- id, whatever its machine.
CREATE INDEX fsm_runs_live_by_id ON fsm_runs (idempotency_id) WHERE state IN ('pending', 'running');
