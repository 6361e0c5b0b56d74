// Package tarball validates and extracts the tar archives that S3 images are
// made of, under the extraction policy listed below (for operators:
// docs/images.md, "The extraction policy"). An archive
// may be stored plain or compressed with gzip or zstd: the stream's first
// bytes say which, and a compressed one is decompressed on the way (its
// checksum, for gzip, checked at its end). Every rule and limit applies to
// the tar stream, which is bounded too (ErrStreamTooLong), so a small
// compressed object cannot make us read without end. A layer's identity
// is the SHA-256 of its tar stream (Report.DiffID), whatever its storage.
//
//   - no absolute entry names (ErrAbsoluteName), no ".." climbing above the
//     root (ErrTraversal); names are used cleaned ("a/./b/" is "a/b"); with
//     Limits.RootRelativeNames an absolute name is taken from the root;
//   - symlinks: absolute targets are allowed and kept as written (they
//     resolve inside the container, like Debian's /etc/alternatives); a
//     relative target must not climb above the root (ErrSymlinkEscape), or
//     above rootfs/ when that folder is stripped. No symlink is ever
//     followed while extracting: an entry, hard link target or whiteout
//     below a symlink is rejected (ErrThroughSymlink), whether the symlink
//     comes from the archive or from a lower layer already in the target
//     (with Limits.LowerSymlinks a lower layer's is followed, its target
//     resolved inside the root);
//   - hard links must point at an earlier non-directory entry of the same
//     archive (ErrHardlinkTarget), inside the root (ErrHardlinkEscape);
//     with Limits.LowerHardlinks also at a file of the tree extracted
//     onto, which Extract finds there;
//   - no setuid bit, no setgid bit except on directories, no
//     security.capability xattr (ErrSetID, ErrFileCapability), unless
//     Limits.AllowSetID; a hard link's header counts, since Extract gives
//     the file its owner, mode, attributes and times, as containerd's
//     applier does;
//   - no character or block devices (ErrDeviceNode), unless
//     Limits.AllowDeviceNodes, and then none whose major or minor number
//     does not fit 32 bits (ErrDeviceNumber). Named pipes (FIFOs) are
//     allowed: they give no access to any device or kernel object, and
//     images occasionally carry them; they are created, never opened;
//   - at most Limits.MaxEntries entries, Limits.MaxFileSize per file,
//     Limits.MaxTotalSize of files and extended attributes in total, and
//     at most MaxEntries parent directories implied by names but not
//     listed (ErrTooManyDirs), at most MaxRootEntries entries for the
//     archive root "./" (ErrTooManyRootEntries); the defaults are the
//     Default* constants;
//   - per entry, at most Limits.MaxXattrs extended attributes
//     (ErrTooManyXattrs) of Limits.MaxXattrBytes together
//     (ErrXattrsTooLarge), and a PAX header of no more
//     records than those and the standard keywords need
//     (ErrTooManyPAXRecords) (Limits): each record costs parsing, and each
//     attribute a system call; extended attributes count against the
//     space budget of extraction (ExtractOptions.MaxDataBytes) too;
//   - OCI whiteouts: ".wh.<name>" removes <name> from the lower layers,
//     ".wh..wh..opq" empties its directory of lower content; either makes
//     its directory when missing, as containerd's applier does; a whiteout
//     is told by its name, whatever its type (a hard link among them
//     links nothing), and must not name "", "." or ".."
//     (ErrWhiteoutEscape); other ".wh..wh." names (aufs metadata) are
//     ignored, whatever their type;
//   - the stream must be a complete tar archive, end-of-archive marker
//     included (Limits.AllowMissingEndMarker lets it end after any
//     entry without one), and compressed data must decode to its end (a
//     *FormatError, matching ErrMalformed, otherwise); after the marker
//     only zeros, at most MaxPadding of them (ErrTrailingData).
//
// Every string of the archive a message names (entries, link targets,
// directories) is quoted with its control characters escaped, so printing
// a rejection cannot act on a terminal. Rules lists every rule.
//
// Validate checks all of it in one streaming pass; Extract applies it again
// while writing, confined with os.Root, so it is safe on an archive never
// validated. VerifyLayout checks the final tree of an image.
//
// In the pipelines: the Download FSM's validate step calls Validate on the
// downloaded file; IsRejection(err) means abort (remove the file, mark the
// image failed with err's message, which names the entry and the rule),
// any other error is an I/O problem worth a retry. The Unpack FSM extracts
// layer n with Extract into the mounted snapshot of layer n-1, with
// ExtractOptions.StripRootfs set from that layer's Report.HasRootfs, and
// calls VerifyLayout on the mount of the top layer only.
package tarball
