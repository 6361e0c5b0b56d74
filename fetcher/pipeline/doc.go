// Package pipeline runs the three durable state machines on the fsm runner
// and composes them into a pull of an S3 image (docs/architecture.md has
// the data model and each step's retries and cleanup):
//
//   - "download-image" per object as listed (queue "downloads"):
//     check-exists → download → validate → store-metadata. The tarball goes
//     to a temp file with a single-pass SHA-256 and validation, fsync and an
//     atomic rename into <download_dir>/blobs/sha256/<hex> (content
//     addressed: identical layers are stored once); a body cut mid-way
//     resumes with a Range request. A download is skipped only for the same
//     bucket, key, ETag and size as one we downloaded and hashed.
//   - "unpack-image" per chain (queue "unpacking"), keyed by the OCI chain
//     ID: chainID(1) = diffID(1), chainID(n) = sha256(chainID(n-1) + " " +
//     diffID(n)), where diffID is the SHA-256 of the layer's uncompressed
//     tar (a gzip or zstd object is hashed as it decompresses, so the same
//     layer stored plain or compressed has one diff ID). Stripping a rootfs/ folder changes the bytes a registry
//     would have hashed, but containerd names and finds unpacked snapshots
//     only by chain IDs built from the diff IDs the image config lists, and
//     we write that config from the same digests, so the names agree.
//     check-unpacked → create-device → extract-layers → verify-layout →
//     update-db. Devices are made only through the snapshotter:
//     Prepare("flyio-extract-<chain>", parent chain), extract into its
//     mount, Commit(chain ID).
//   - "activate-image" per image: check-snapshot → create-snapshot →
//     register. The activation is Prepare("snap-<image id>", top chain);
//     an activation of the image's previous top chain is removed only once
//     the new top's layout passed its check through View("flyio-verify-<image
//     id>", top chain); register records the image's layers and name and registers the name
//     in containerd.
//
// Pull asks S3 what the image is now, answers an unchanged, pulled image
// from the records, and otherwise chains the machines: one parent id per
// pull; Unpack n runs after Download n and Unpack n-1; Activate after the
// last Unpack. Every start is idempotent (one live run per object, chain or
// image), so concurrent pulls of one image share one download, one unpack
// and one device per chain; a pull that finds the image's activate run live
// for other layers waits for it to end and starts its own.
package pipeline
