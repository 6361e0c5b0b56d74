package thinpool

import (
	"context"
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

func TestParsePoolStatus(t *testing.T) {
	cases := []struct {
		line string
		want PoolStatus
	}{
		{"0 10/4096 0/163840 - rw no_discard_passdown error_if_no_space - 1024",
			PoolStatus{UsedMetadataBlocks: 10, TotalMetadataBlocks: 4096, TotalDataBlocks: 163840,
				Mode: ModeReadWrite, ErrorIfNoSpace: true, MetadataLowWatermark: 1024}},
		{"7 300/4096 163840/163840 1234 out_of_data_space discard_passdown queue_if_no_space needs_check 1024",
			PoolStatus{TransactionID: 7, UsedMetadataBlocks: 300, TotalMetadataBlocks: 4096, UsedDataBlocks: 163840,
				TotalDataBlocks: 163840, HeldMetadataRoot: 1234, HasHeldRoot: true, Mode: ModeOutOfDataSpace,
				DiscardPassdown: true, QueueIfNoSpace: true, NeedsCheck: true, MetadataLowWatermark: 1024}},
		{"1 5/10 1/2 - ro ignore_discard queue_if_no_space -",
			PoolStatus{TransactionID: 1, UsedMetadataBlocks: 5, TotalMetadataBlocks: 10, UsedDataBlocks: 1,
				TotalDataBlocks: 2, Mode: ModeReadOnly, DiscardIgnored: true, QueueIfNoSpace: true}},
		{"Fail", PoolStatus{Mode: ModeFail}},
		{"Error", PoolStatus{Mode: ModeError}},
	}
	for _, c := range cases {
		got, err := parsePoolStatus(c.line)
		if err != nil {
			t.Errorf("parsePoolStatus(%q): %v", c.line, err)
			continue
		}
		if got != c.want {
			t.Errorf("parsePoolStatus(%q) =\n %+v, want\n %+v", c.line, got, c.want)
		}
	}
	for _, bad := range []string{"", "x 1/2 1/2 - rw", "0 3/2 0/1 - rw", "0 1/2 0/1 - sideways", "0 1/2 0/1 - rw bogus -", "0 12 0/1 - rw"} {
		if _, err := parsePoolStatus(bad); err == nil {
			t.Errorf("parsePoolStatus(%q) accepted a malformed line", bad)
		}
	}
}

func TestPoolStatusFullError(t *testing.T) {
	base := PoolStatus{UsedMetadataBlocks: 1, TotalMetadataBlocks: 10, UsedDataBlocks: 1, TotalDataBlocks: 10, Mode: ModeReadWrite}
	if err := base.FullError(); err != nil {
		t.Fatalf("healthy pool: %v", err)
	}
	data := base
	data.Mode = ModeOutOfDataSpace
	if err := data.FullError(); !errors.Is(err, ErrDataFull) || !errors.Is(err, ErrPoolFull) || errors.Is(err, ErrMetadataFull) {
		t.Errorf("out_of_data_space: got %v, want ErrDataFull (and ErrPoolFull)", err)
	}
	meta := base
	meta.UsedMetadataBlocks = 10
	meta.Mode = ModeReadOnly
	if err := meta.FullError(); !errors.Is(err, ErrMetadataFull) || !errors.Is(err, ErrPoolFull) || errors.Is(err, ErrDataFull) {
		t.Errorf("metadata full: got %v, want ErrMetadataFull", err)
	}
	check := base
	check.Mode, check.NeedsCheck = ModeReadOnly, true
	if err := check.FullError(); err == nil || errors.Is(err, ErrPoolFull) {
		t.Errorf("needs_check read-only pool: got %v, want a non-full error", err)
	}
}

func TestParseThinStatus(t *testing.T) {
	got, err := parseThinStatus("2048 4095")
	if err != nil || got != (ThinStatus{MappedSectors: 2048, HighestMappedSector: 4095, HasMapped: true}) {
		t.Errorf("parseThinStatus(2048 4095) = %+v, %v", got, err)
	}
	got, err = parseThinStatus("0 -")
	if err != nil || got != (ThinStatus{}) {
		t.Errorf("parseThinStatus(0 -) = %+v, %v", got, err)
	}
	got, err = parseThinStatus("Fail")
	if err != nil || !got.Failed {
		t.Errorf("parseThinStatus(Fail) = %+v, %v", got, err)
	}
	for _, bad := range []string{"", "1", "a b", "1 2 3"} {
		if _, err := parseThinStatus(bad); err == nil {
			t.Errorf("parseThinStatus(%q) accepted a malformed line", bad)
		}
	}
}

func TestParseTables(t *testing.T) {
	th, err := parseThinTable("253:0 42")
	if err != nil || th != (thinTable{PoolDev: "253:0", ID: 42}) {
		t.Errorf("parseThinTable = %+v, %v", th, err)
	}
	if _, err := parseThinTable("253:0 16777216"); err == nil {
		t.Error("parseThinTable accepted an id above MaxThinID")
	}
	params := poolTableParams("7:0", "7:1", 128, 32)
	pt, err := parsePoolTable(params)
	if err != nil {
		t.Fatalf("parsePoolTable(%q): %v", params, err)
	}
	want := poolTable{MetaDev: "7:0", DataDev: "7:1", BlockSize: 128, LowWater: 32, Features: poolFeatures}
	if !reflect.DeepEqual(pt, want) {
		t.Errorf("parsePoolTable(%q) = %+v, want %+v", params, pt, want)
	}
	if _, err := parsePoolTable("7:0 7:1 128 32 2 skip_block_zeroing"); err == nil {
		t.Error("parsePoolTable accepted a wrong feature count")
	}
}

// TestRequestLayout checks the header fields the kernel reads and where the
// payload lands.
func TestRequestLayout(t *testing.T) {
	payload := marshalMessage(0, "create_thin 7")
	buf, err := encodeRequest(dmRequest{name: "pool", flags: unix.DM_SUSPEND_FLAG, targetCount: 3, payload: payload}, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if len(buf) != 1024 || uintptr(unsafe.Pointer(&buf[0]))%8 != 0 {
		t.Fatalf("buffer of %d bytes at %p, want 1024 bytes 8-byte aligned", len(buf), &buf[0])
	}
	ne := binary.NativeEndian
	if v := [3]uint32{ne.Uint32(buf[0:]), ne.Uint32(buf[4:]), ne.Uint32(buf[8:])}; v != [3]uint32{4, 0, 0} {
		t.Errorf("version %v, want 4.0.0", v)
	}
	if ds := ne.Uint32(buf[12:]); ds != 1024 {
		t.Errorf("data_size %d, want the whole buffer 1024", ds)
	}
	if st := ne.Uint32(buf[16:]); st != unix.SizeofDmIoctl {
		t.Errorf("data_start %d, want %d", st, unix.SizeofDmIoctl)
	}
	if tc := ne.Uint32(buf[20:]); tc != 3 {
		t.Errorf("target_count %d, want 3", tc)
	}
	if fl := ne.Uint32(buf[28:]); fl != unix.DM_SUSPEND_FLAG {
		t.Errorf("flags %#x, want %#x", fl, unix.DM_SUSPEND_FLAG)
	}
	if name := cString(buf[48 : 48+128]); name != "pool" {
		t.Errorf("name %q at offset 48, want pool", name)
	}
	p := buf[unix.SizeofDmIoctl:]
	if sec := ne.Uint64(p); sec != 0 {
		t.Errorf("message sector %d, want 0", sec)
	}
	if msg := cString(p[8:]); msg != "create_thin 7" {
		t.Errorf("message %q, want create_thin 7", msg)
	}
	// A payload larger than the requested size grows the buffer.
	big, err := encodeRequest(dmRequest{payload: make([]byte, 5000)}, 1024)
	if err != nil || len(big) < unix.SizeofDmIoctl+5000 || len(big)%8 != 0 {
		t.Errorf("big payload: %d bytes, %v", len(big), err)
	}
	if _, err := encodeRequest(dmRequest{name: strings.Repeat("n", 128)}, 1024); !errors.Is(err, ErrInvalid) {
		t.Errorf("128-byte name: got %v, want ErrInvalid", err)
	}
}

func TestTableRoundTrip(t *testing.T) {
	in := []dmTarget{
		{Start: 0, Length: 2048, Type: "thin", Params: "253:0 1"},
		{Start: 2048, Length: 4096, Type: "thin-pool", Params: "7:0 7:1 128 0 1 skip_block_zeroing"},
		{Start: 6144, Length: 8, Type: "zero", Params: ""},
	}
	b, err := marshalTable(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(b)%8 != 0 {
		t.Fatalf("table of %d bytes, want a multiple of 8", len(b))
	}
	// TABLE_LOAD's Next is relative to each spec; TABLE_STATUS replies
	// carry offsets from the payload start. Rewrite to the reply form and
	// parse back.
	off := 0
	for i := range in {
		next := int(binary.NativeEndian.Uint32(b[off+20:]))
		if i < len(in)-1 && (next == 0 || next%8 != 0) {
			t.Fatalf("target %d: next %d, want a non-zero multiple of 8", i, next)
		}
		if i < len(in)-1 {
			binary.NativeEndian.PutUint32(b[off+20:], uint32(off+next))
		}
		off += next
	}
	out, err := parseTargets(b, uint32(len(in)))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip:\n got %+v\nwant %+v", out, in)
	}
	if _, err := marshalTable([]dmTarget{{Type: strings.Repeat("t", 16)}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("16-byte target type: got %v, want ErrInvalid", err)
	}
	if _, err := parseTargets(b[:30], 1); err == nil {
		t.Error("parseTargets accepted a truncated payload")
	}
}

// nameRecord builds one dm_name_list record as the kernel lays it out.
func nameRecord(dev uint64, name, uuid string, flags uint32, last bool) []byte {
	n := (12 + len(name) + 1 + 7) &^ 7
	rec := make([]byte, n+8)
	binary.NativeEndian.PutUint64(rec, dev)
	copy(rec[12:], name)
	binary.NativeEndian.PutUint32(rec[n+4:], flags)
	if uuid != "" {
		u := make([]byte, (len(uuid)+1+7)&^7)
		copy(u, uuid)
		rec = append(rec, u...)
	}
	if !last {
		binary.NativeEndian.PutUint32(rec[8:], uint32(len(rec)))
	}
	return rec
}

func TestParseNameList(t *testing.T) {
	var b []byte
	b = append(b, nameRecord(unix.Mkdev(253, 0), "pool", "", unix.DM_NAME_LIST_FLAG_DOESNT_HAVE_UUID, false)...)
	b = append(b, nameRecord(unix.Mkdev(253, 300), "thin-a", "thinpool-pool-5-thin-a", unix.DM_NAME_LIST_FLAG_HAS_UUID, false)...)
	b = append(b, nameRecord(unix.Mkdev(253, 2), "old", "", 0, true)...)
	got, err := parseNameList(b)
	if err != nil {
		t.Fatal(err)
	}
	want := []dmNameEntry{
		{Name: "pool", Dev: unix.Mkdev(253, 0), HasUUID: true},
		{Name: "thin-a", Dev: unix.Mkdev(253, 300), UUID: "thinpool-pool-5-thin-a", HasUUID: true},
		{Name: "old", Dev: unix.Mkdev(253, 2)},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseNameList:\n got %+v\nwant %+v", got, want)
	}
	if got, err := parseNameList(nil); err != nil || got != nil {
		t.Errorf("empty list: %v, %v", got, err)
	}
	if _, err := parseNameList(b[:len(b)-40]); err == nil {
		t.Error("parseNameList accepted a truncated list")
	}
}

func TestUUIDRoundTrip(t *testing.T) {
	p := &Pool{name: "pool"}
	u := p.thinUUID("snap-1", 77)
	if id, ok := p.idFromUUID(u, "snap-1"); !ok || id != 77 {
		t.Errorf("idFromUUID(%q) = %d, %v", u, id, ok)
	}
	// A pool whose name extends ours must not be taken for ours.
	other := &Pool{name: "pool-5"}
	if _, ok := p.idFromUUID(other.thinUUID("x", 3), "x"); ok {
		t.Error("uuid of pool-5 parsed as one of pool")
	}
	if _, ok := p.idFromUUID(u, "another-name"); ok {
		t.Error("uuid accepted for a device of another name")
	}
	if got := p.thinUUID(strings.Repeat("n", 127), 1); got != "" {
		t.Errorf("over-long uuid %q, want none", got)
	}
}

func TestCheckIDAndName(t *testing.T) {
	if err := checkID("thin id", MaxThinID); err != nil {
		t.Errorf("MaxThinID rejected: %v", err)
	}
	if err := checkID("thin id", MaxThinID+1); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "16777216") {
		t.Errorf("MaxThinID+1: got %v, want ErrInvalid naming the id", err)
	}
	for _, bad := range []string{"", "control", "a/b", strings.Repeat("x", 128)} {
		if err := checkName("device", bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("checkName(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg := Config{Name: "p", RootDir: "/tmp/x"}.withDefaults()
	if cfg.blockSizeSectors() != 128 || cfg.DataSize != DefaultDataSize || cfg.MetadataSize != DefaultMetadataSize {
		t.Errorf("defaults not applied: %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("a pool named by its name and directory: %v", err)
	}
	if err := DefaultConfig().Validate(); err == nil || !strings.Contains(err.Error(), "pool.root_dir: must be an absolute path") {
		t.Errorf("DefaultConfig without a root directory: %v, want pool.root_dir named", err)
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Name: "p"}, "pool.root_dir: must be an absolute path, got an empty value"},
		{Config{Name: "", RootDir: "/x"}, "pool.name: must not be empty"},
		{Config{Name: "p", RootDir: "/x", BlockSize: 100}, "pool.block_size: must be a multiple of 128 sectors"},
		{Config{Name: "p", DataDevice: "/dev/sda"}, "pool.metadata_device: must be set when pool.data_device is set"},
		{Config{Name: "p", RootDir: "/x", MetadataSize: 8 << 10}, "pool.metadata_size: must be a multiple of 4KiB between 2MiB and 16GiB"},
		{Config{Name: "p", RootDir: "/x", MinFreeSpace: conf.Pct(-1)}, "pool.min_free_space: must be between 0% (no reserve) and 50%, got -1%"},
		{Config{Name: "p", RootDir: "/x", MinFreeSpace: conf.Pct(100)}, "pool.min_free_space: must be between"},
		{Config{Name: "p", RootDir: "/x", NoSpaceTimeout: conf.D(1500 * time.Millisecond)}, "pool.no_space_timeout: must be whole seconds"},
		{Config{Name: "p", RootDir: "/x", NoSpaceTimeout: conf.D(-time.Second)}, "pool.no_space_timeout: must be whole seconds"},
	} {
		if err := c.cfg.withDefaults().Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.cfg, err, c.want)
		}
	}
	// Open refuses the same configurations before any device-mapper call.
	if _, err := Open(context.Background(), Config{Name: "p", RootDir: "/x", BlockSize: 100}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "pool.block_size") {
		t.Errorf("Open with a bad block size: %v, want ErrInvalid naming pool.block_size", err)
	}
}

func TestMountOptions(t *testing.T) {
	if got := MountOptions(FSXFS, true); !reflect.DeepEqual(got, []string{"ro", "nouuid"}) {
		t.Errorf("xfs ro: %v", got)
	}
	if got := MountOptions(FSExt4, false); len(got) != 0 {
		t.Errorf("ext4 rw: %v", got)
	}
}

// TestPoolModeOneCase: the kernel capitalises its failed states ("Fail",
// "Error") but not the others; the parsed mode is lowercase for all, so
// one spelling matches it in logs, metric labels and JSON.
func TestPoolModeOneCase(t *testing.T) {
	for line, want := range map[string]PoolMode{
		"Fail":  "fail",
		"Error": "error",
		"0 10/4096 0/163840 - rw no_discard_passdown queue_if_no_space - 1024":                "rw",
		"0 10/4096 0/163840 - ro no_discard_passdown queue_if_no_space needs_check 1024":      "ro",
		"0 10/4096 163840/163840 - out_of_data_space discard_passdown queue_if_no_space - 16": "out_of_data_space",
	} {
		st, err := parsePoolStatus(line)
		if err != nil || st.Mode != want {
			t.Errorf("parsePoolStatus(%q) mode = %q, %v; want %q", line, st.Mode, err, want)
		}
	}
}
