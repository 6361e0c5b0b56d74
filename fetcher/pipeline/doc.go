// Package pipeline runs seed 004's three durable state machines on the
// fsm runner, with seed 001's recovery contracts, and composes them into a
// pull of an S3 image:
//
//   - "download-image" per S3 key (queue "downloads"): check-exists →
//     download → validate → store-metadata. The tarball goes to a temp file
//     with a single-pass SHA-256, fsync and an atomic rename into
//     <download_dir>/blobs/sha256/<hex> (content addressed: identical layers
//     are stored once); a body cut mid-way resumes with a Range request; an
//     object whose non-multipart ETag and size match a stored blob is not
//     downloaded again; validate applies the tarball policy and on a
//     rejection removes the file, marks the image failed with the entry and
//     rule, and aborts.
//   - "unpack-image" per layer chain position (queue "unpacking"), keyed by
//     the OCI chain ID: chainID(1) = diffID(1), chainID(n) =
//     sha256(chainID(n-1) + " " + diffID(n)), where diffID is the SHA-256 of
//     the layer tarball as downloaded. Stripping a rootfs/ folder changes
//     the bytes a registry would have hashed, but containerd names and finds
//     unpacked snapshots only by chain IDs built from the diff IDs the image
//     config lists, and we write that config from the same digests, so the
//     names agree. Identical layer prefixes across images are unpacked once
//     and share one device. check-unpacked → create-device →
//     extract-layers → verify-layout → update-db; the chain's image lock is
//     held from check-unpacked to every exit. Devices are made only through
//     the snapshotter: Prepare("flyio-extract-<chain>", parent chain),
//     extract into its mount, Commit(chain ID).
//   - "activate-image" per image: check-snapshot → create-snapshot →
//     register. The active snapshot is Prepare("snap-<image id>", top
//     chain); snapshot_id is "<origin device id>-snap" (seed 001).
//
// Pull chains them per seed 004: one parent id per pull; Unpack n runs
// after Download n and Unpack n-1; Activate after the last Unpack. Every
// start is idempotent (one live run per key, chain or image), so concurrent
// pulls of one image share one download, one unpack and one device per
// chain position; a completed pipeline pulled again runs fresh runs whose
// first transition hands off, with no S3 request (the layers come from the
// pulled-image record), no extraction and no device created.
package pipeline
