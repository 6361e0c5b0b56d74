package thinpool

import (
	"fmt"
	"strconv"
	"strings"
)

// parsePoolStatus parses a thin-pool status line:
//
//	<transaction id> <used meta>/<total meta> <used data>/<total data>
//	<held metadata root|-> rw|ro|out_of_data_space
//	discard_passdown|no_discard_passdown|ignore_discard
//	error_if_no_space|queue_if_no_space needs_check|- [<metadata low watermark>]
//
// or the single words "Fail" / "Error" (ModeFail, ModeError).
func parsePoolStatus(line string) (PoolStatus, error) {
	f := strings.Fields(line)
	if len(f) == 1 {
		switch f[0] {
		case "Fail":
			return PoolStatus{Mode: ModeFail}, nil
		case "Error":
			return PoolStatus{Mode: ModeError}, nil
		}
	}
	if len(f) < 5 {
		return PoolStatus{}, fmt.Errorf("thin-pool status %q: %d fields, want at least 5", line, len(f))
	}
	var s PoolStatus
	var err error
	if s.TransactionID, err = strconv.ParseUint(f[0], 10, 64); err != nil {
		return PoolStatus{}, fmt.Errorf("thin-pool status %q: transaction id: %w", line, err)
	}
	if s.UsedMetadataBlocks, s.TotalMetadataBlocks, err = parseFraction(f[1]); err != nil {
		return PoolStatus{}, fmt.Errorf("thin-pool status %q: metadata blocks: %w", line, err)
	}
	if s.UsedDataBlocks, s.TotalDataBlocks, err = parseFraction(f[2]); err != nil {
		return PoolStatus{}, fmt.Errorf("thin-pool status %q: data blocks: %w", line, err)
	}
	if f[3] != "-" {
		if s.HeldMetadataRoot, err = strconv.ParseUint(f[3], 10, 64); err != nil {
			return PoolStatus{}, fmt.Errorf("thin-pool status %q: held metadata root: %w", line, err)
		}
		s.HasHeldRoot = true
	}
	switch m := PoolMode(f[4]); m {
	case ModeReadWrite, ModeReadOnly, ModeOutOfDataSpace:
		s.Mode = m
	default:
		return PoolStatus{}, fmt.Errorf("thin-pool status %q: unknown mode %q", line, f[4])
	}
	// Old kernels stop after the mode; newer ones add these words.
	for i, w := range f[5:] {
		switch w {
		case "discard_passdown":
			s.DiscardPassdown = true
		case "no_discard_passdown":
		case "ignore_discard":
			s.DiscardIgnored = true
		case "error_if_no_space":
			s.ErrorIfNoSpace = true
		case "queue_if_no_space":
			s.QueueIfNoSpace = true
		case "needs_check":
			s.NeedsCheck = true
		case "-":
		default:
			if i+5 == len(f)-1 {
				if n, err := strconv.ParseUint(w, 10, 64); err == nil {
					s.MetadataLowWatermark = n
					continue
				}
			}
			return PoolStatus{}, fmt.Errorf("thin-pool status %q: unknown word %q", line, w)
		}
	}
	return s, nil
}

func parseFraction(s string) (used, total uint64, err error) {
	a, b, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, fmt.Errorf("%q is not <used>/<total>", s)
	}
	if used, err = strconv.ParseUint(a, 10, 64); err != nil {
		return 0, 0, err
	}
	if total, err = strconv.ParseUint(b, 10, 64); err != nil {
		return 0, 0, err
	}
	if used > total {
		return 0, 0, fmt.Errorf("%q: used above total", s)
	}
	return used, total, nil
}

// parseThinStatus parses a thin target status line:
// "<mapped sectors> <highest mapped sector|->" or "Fail".
func parseThinStatus(line string) (ThinStatus, error) {
	f := strings.Fields(line)
	if len(f) == 1 && f[0] == "Fail" {
		return ThinStatus{Failed: true}, nil
	}
	if len(f) != 2 {
		return ThinStatus{}, fmt.Errorf("thin status %q: %d fields, want 2", line, len(f))
	}
	var s ThinStatus
	var err error
	if s.MappedSectors, err = strconv.ParseUint(f[0], 10, 64); err != nil {
		return ThinStatus{}, fmt.Errorf("thin status %q: mapped sectors: %w", line, err)
	}
	if f[1] != "-" {
		if s.HighestMappedSector, err = strconv.ParseUint(f[1], 10, 64); err != nil {
			return ThinStatus{}, fmt.Errorf("thin status %q: highest mapped sector: %w", line, err)
		}
		s.HasMapped = true
	}
	return s, nil
}

// thinTable is the parsed table of a thin target:
// "<pool dev> <thin id> [<external origin dev>]".
type thinTable struct {
	PoolDev string // "major:minor" as the kernel prints it
	ID      uint32
}

func parseThinTable(params string) (thinTable, error) {
	f := strings.Fields(params)
	if len(f) < 2 {
		return thinTable{}, fmt.Errorf("thin table %q: want <pool dev> <id>", params)
	}
	id, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil || id > MaxThinID {
		return thinTable{}, fmt.Errorf("thin table %q: bad thin id %q", params, f[1])
	}
	return thinTable{PoolDev: f[0], ID: uint32(id)}, nil
}

// poolTable is the parsed table of a thin-pool target:
// "<meta dev> <data dev> <block size> <low water mark> <#features> <features>...".
type poolTable struct {
	MetaDev, DataDev string
	BlockSize        uint32
	LowWater         uint64
	Features         []string
}

func parsePoolTable(params string) (poolTable, error) {
	f := strings.Fields(params)
	if len(f) < 5 {
		return poolTable{}, fmt.Errorf("thin-pool table %q: want at least 5 fields", params)
	}
	bs, err := strconv.ParseUint(f[2], 10, 32)
	if err != nil {
		return poolTable{}, fmt.Errorf("thin-pool table %q: block size: %w", params, err)
	}
	lw, err := strconv.ParseUint(f[3], 10, 64)
	if err != nil {
		return poolTable{}, fmt.Errorf("thin-pool table %q: low water mark: %w", params, err)
	}
	n, err := strconv.Atoi(f[4])
	if err != nil || n != len(f)-5 {
		return poolTable{}, fmt.Errorf("thin-pool table %q: feature count %q does not match %d features", params, f[4], len(f)-5)
	}
	return poolTable{MetaDev: f[0], DataDev: f[1], BlockSize: uint32(bs), LowWater: lw, Features: f[5:]}, nil
}

// poolFeatures are the thin-pool features this package loads:
//   - skip_block_zeroing: a newly provisioned block is not zeroed before
//     its first write. Every device we create is either fresh and formatted
//     by mkfs (which writes what it reads back) or a snapshot (whose blocks
//     are copied, not zeroed), so zeroing would only double the write cost
//     of a first write; the price is that a partially written new block can
//     expose stale data of a deleted device to the raw block device, which
//     only root can read here.
//
// error_if_no_space is left out on purpose: when the data space is
// exhausted, writes that need a new block wait (queue_if_no_space) for
// the kernel's no_space_timeout (Config.NoSpaceTimeout) while the pool's
// owner frees or adds space, and fail with ENOSPC only when that timeout
// expires. A write that fails makes ext4 abort its journal, so a
// container briefly short of space would otherwise lose its file system
// even when a collection or a growth was seconds away.
var poolFeatures = []string{"skip_block_zeroing"}

// unwantedFeature is the feature a table loaded by an earlier version may
// carry that poolFeatures leaves out; Adjust reloads such a table.
const unwantedFeature = "error_if_no_space"

func poolTableParams(metaDev, dataDev string, blockSize uint32, lowWater uint64) string {
	return fmt.Sprintf("%s %s %d %d %d %s", metaDev, dataDev, blockSize, lowWater, len(poolFeatures), strings.Join(poolFeatures, " "))
}
