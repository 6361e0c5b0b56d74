package tarball

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

// rules holds every rule of the extraction policy, in the order they are
// declared; newRule adds one, so a rule cannot exist without being listed.
var rules []error

// newRule makes a rule of the extraction policy and lists it in rules.
func newRule(msg string) error {
	r := errors.New(msg)
	rules = append(rules, r)
	return r
}

// Rules returns every rule a *PolicyError of Validate or Extract can carry
// (the Err* rule values below, once each). It is the list to count or
// label rejections by: a rule added to the package is in it.
func Rules() []error { return slices.Clone(rules) }

// Rules of the extraction policy. Every rejection by Validate or Extract is a
// *PolicyError whose Rule is one of these values, so callers match a rule
// with errors.Is(err, tarball.ErrSetID) and so on.
var (
	// ErrInvalidName: an entry name (or symlink target) that is empty.
	ErrInvalidName = newRule("invalid name")
	// ErrAbsoluteName: an entry name that starts with "/".
	ErrAbsoluteName = newRule("absolute entry name")
	// ErrTraversal: an entry name whose ".." components climb above the root.
	ErrTraversal = newRule("path climbs above the root")
	// ErrNameTooLong: a name longer than 4095 bytes, a path component longer
	// than 255 bytes, or a symlink target longer than 4095 bytes.
	ErrNameTooLong = newRule("name too long")
	// ErrSymlinkEscape: a relative symlink whose target climbs above the root
	// (for a tarball with a rootfs/ folder: above rootfs/, which is stripped).
	ErrSymlinkEscape = newRule("relative symlink climbs above the root")
	// ErrThroughSymlink: an entry written, linked or whited out through a
	// path component that is a symlink (from this archive or a lower layer).
	// Extraction never follows symlinks.
	ErrThroughSymlink = newRule("path goes through a symlink")
	// ErrParentNotDir: an entry below a name that is not a directory.
	ErrParentNotDir = newRule("parent is not a directory")
	// ErrRootNotDir: the archive root ("." or, when stripped, "rootfs")
	// given as something other than a directory.
	ErrRootNotDir = newRule("archive root is not a directory")
	// ErrHardlinkEscape: a hard link whose target is absolute or climbs above
	// the archive root (or lies outside rootfs/ when it is stripped).
	ErrHardlinkEscape = newRule("hard link target outside the archive root")
	// ErrHardlinkTarget: a hard link whose target is not an earlier
	// non-directory entry of the same archive (unknown, a directory, itself),
	// or, with Limits.LowerHardlinks, not a non-directory of the tree
	// extracted onto either.
	ErrHardlinkTarget = newRule("hard link target is not an earlier non-directory entry of the archive")
	// ErrSetID: a setuid bit on any entry, or a setgid bit on anything but a
	// directory (setgid directories only make new files inherit the group).
	ErrSetID = newRule("setuid/setgid bit")
	// ErrFileCapability: a security.capability extended attribute, which
	// grants privileges the way a setuid bit does.
	ErrFileCapability = newRule("file capability xattr")
	// ErrDeviceNode: a character or block device entry.
	ErrDeviceNode = newRule("device node")
	// ErrDeviceNumber: a device entry, where they are allowed, whose
	// major or minor number is negative or does not fit 32 bits: made,
	// it would be another device than the one the header names.
	ErrDeviceNumber = newRule("device number out of range")
	// ErrUnsupportedType: an entry type the extractor does not create
	// (volume headers, multi-volume continuations, GNU dumpdirs, ...). A
	// whiteout of such a type is not one: it creates nothing.
	ErrUnsupportedType = newRule("unsupported entry type")
	// ErrBadOwner: a uid or gid outside 0..4294967294.
	ErrBadOwner = newRule("invalid owner")
	// ErrTooManyEntries: more entries than Limits.MaxEntries.
	ErrTooManyEntries = newRule("too many entries")
	// ErrTooManyRootEntries: more than MaxRootEntries entries for the
	// archive root ("." or "./").
	ErrTooManyRootEntries = newRule("too many entries for the archive root")
	// ErrTooManyDirs: more parent directories implied by entry names (not
	// listed as entries themselves) than Limits.MaxEntries. Without it, a
	// small archive of deep unique paths would make millions of directories.
	ErrTooManyDirs = newRule("too many implicit parent directories")
	// ErrFileTooLarge: a file larger than Limits.MaxFileSize.
	ErrFileTooLarge = newRule("file too large")
	// ErrTotalTooLarge: files and extended attributes adding up to more
	// than Limits.MaxTotalSize.
	ErrTotalTooLarge = newRule("total size too large")
	// ErrStreamTooLong: a tar stream (decompressed, for a gzip or zstd
	// layer) longer than the limits allow: Limits.MaxTotalSize of files
	// plus 8 KiB of headers and padding per admitted entry. It bounds what a
	// small compressed object can make us read.
	ErrStreamTooLong = newRule("tar stream too long")
	// ErrOverBudget: an archive whose file data (runs of zeros aside) and
	// extended attributes are more than ExtractOptions.MaxDataBytes, the
	// space the caller has.
	ErrOverBudget = newRule("file data over the space budget")
	// ErrWhiteoutEscape: a whiteout whose target is "", "." or "..", which
	// would remove its own directory or climb above it.
	ErrWhiteoutEscape = newRule("whiteout escapes its directory")
	// ErrOutsideRootfs: with rootfs/ stripping on, an entry outside rootfs/.
	ErrOutsideRootfs = newRule("entry outside rootfs/")
	// ErrTooManyXattrs: an entry with more extended attribute records
	// (PAX SCHILY.xattr.*) than Limits.MaxXattrs. Each is a system call
	// when extracted, and one PAX header holds tens of thousands.
	ErrTooManyXattrs = newRule("too many extended attributes")
	// ErrTooManyPAXRecords: a PAX extended header with more records than
	// the entry's extended attributes and the standard keywords can need
	// (twice Limits.MaxXattrs, as libarchive writes each attribute in two
	// forms, plus 64). Every record costs parsing time whatever its key,
	// and one header holds tens of thousands.
	ErrTooManyPAXRecords = newRule("too many PAX records")
	// ErrXattrsTooLarge: an entry whose extended attributes (names and
	// values) add up to more than Limits.MaxXattrBytes.
	ErrXattrsTooLarge = newRule("extended attributes too large")
	// ErrTrailingData: after the end-of-archive marker, a byte that is not
	// zero, or more than MaxPadding bytes of zeros. Without the bound, a
	// small compressed object of zeros would be read up to the whole
	// stream limit.
	ErrTrailingData = newRule("data after the end-of-archive marker")
)

// PolicyError is a rejection of one entry by the extraction policy. Its
// message names the entry (as written in the archive) and the rule; Unwrap
// returns the Rule so errors.Is matches it.
type PolicyError struct {
	Entry  string // the entry's name as written in the archive
	Rule   error  // one of the Err* rule values of this package
	Detail string // optional specifics (the link target, the size, ...)
}

// Error names the entry (quoted), the rule and any detail; no control
// character of the archive's reaches the message unescaped.
func (e *PolicyError) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("entry %s: %v", quote(e.Entry), e.Rule)
	}
	return fmt.Sprintf("entry %s: %v: %s", quote(e.Entry), e.Rule, Escape(e.Detail))
}

// Unwrap returns the rule broken.
func (e *PolicyError) Unwrap() error { return e.Rule }

// ErrMalformed is matched (errors.Is) by every *FormatError: the stream is
// not a well-formed tar archive (not a tar at all, a bad header, truncated).
var ErrMalformed = errors.New("malformed tar archive")

// FormatError reports a structural problem in the tar stream: where it was
// found (byte offset in the stream), in or after which entry, and why.
type FormatError struct {
	Offset int64  // bytes of the stream consumed when the problem was found
	Entry  string // the entry being read, or the last complete one; "" before the first
	Err    error  // archive/tar's error or a description
}

// Error says where in the stream the archive broke and why.
func (e *FormatError) Error() string {
	where := fmt.Sprintf("at offset %d", e.Offset)
	if e.Entry != "" {
		where += fmt.Sprintf(" (entry %s)", quote(e.Entry))
	}
	return fmt.Sprintf("%v %s: %s", ErrMalformed, where, Escape(e.Err.Error()))
}

// Unwrap returns the underlying cause.
func (e *FormatError) Unwrap() error { return e.Err }

// Is makes every FormatError match ErrMalformed.
func (e *FormatError) Is(target error) bool { return target == ErrMalformed }

// IsRejection reports whether err means the archive itself is unacceptable
// (a policy rejection or a malformed archive), as opposed to an I/O failure
// reading it or writing the tree; a pipeline aborts on the former and may
// retry the latter.
func IsRejection(err error) bool {
	var pe *PolicyError
	return errors.As(err, &pe) || errors.Is(err, ErrMalformed)
}

// ErrExhausted is matched (errors.Is) by an extraction error caused by
// running out of a resource while writing the tree: space or inodes
// (ENOSPC), quota (EDQUOT), links to one inode (EMLINK), or file
// descriptors (EMFILE, ENFILE). Such an error also matches its errno.
// Trying the same layer again on the same device fails the same way, so a
// pipeline gives up on it (see IsPermanent) rather than retrying.
var ErrExhausted = errors.New("out of resources")

// exhausted tags err with ErrExhausted when its cause is one of the errnos
// of running out.
func exhausted(err error) error {
	for _, e := range []error{unix.ENOSPC, unix.EDQUOT, unix.EMLINK, unix.EMFILE, unix.ENFILE} {
		if errors.Is(err, e) {
			return fmt.Errorf("%w: %w", ErrExhausted, err)
		}
	}
	return err
}

// IsPermanent reports whether trying the same archive again cannot
// succeed: a rejection (IsRejection) or running out of a resource while
// extracting (ErrExhausted).
func IsPermanent(err error) bool {
	return IsRejection(err) || errors.Is(err, ErrExhausted)
}

func reject(entry string, rule error, detail string, args ...any) *PolicyError {
	if len(args) > 0 {
		detail = fmt.Sprintf(detail, args...)
	}
	return &PolicyError{Entry: entry, Rule: rule, Detail: detail}
}
