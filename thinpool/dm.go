package thinpool

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file is the device-mapper ioctl layer: every request is one struct
// dm_ioctl header (unix.DmIoctl) followed by a payload in the same buffer,
// sent to /dev/mapper/control. Layout facts the kernel relies on:
//   - Version {4,0,0}: the kernel accepts any 4.x minor at or below its own.
//   - Data_size is the size of the whole buffer (header included); the
//     payload starts at Data_start = sizeof(struct dm_ioctl).
//   - A table (TABLE_LOAD) is Target_count dm_target_spec records, each
//     followed by its NUL-terminated parameters; Next is the offset from the
//     start of one spec to the next, a multiple of 8.
//   - A target message (TARGET_MSG) is a uint64 sector then the text.
//   - Replies that do not fit set DM_BUFFER_FULL_FLAG: retry bigger.

const (
	dmControlPath  = MapperDir + "/control"
	dmInitialBuf   = 16 << 10
	dmMaxBuf       = 64 << 20
	dmHeaderSize   = unix.SizeofDmIoctl
	dmSpecSize     = unix.SizeofDmTargetSpec
	dmTargetMsgLen = 8 // struct dm_target_msg: __u64 sector
)

// dmCmdNames names ioctl requests in error messages.
var dmCmdNames = map[uint]string{
	unix.DM_VERSION:      "DM_VERSION",
	unix.DM_LIST_DEVICES: "DM_LIST_DEVICES",
	unix.DM_DEV_CREATE:   "DM_DEV_CREATE",
	unix.DM_DEV_REMOVE:   "DM_DEV_REMOVE",
	unix.DM_DEV_SUSPEND:  "DM_DEV_SUSPEND",
	unix.DM_DEV_STATUS:   "DM_DEV_STATUS",
	unix.DM_TABLE_LOAD:   "DM_TABLE_LOAD",
	unix.DM_TABLE_CLEAR:  "DM_TABLE_CLEAR",
	unix.DM_TABLE_DEPS:   "DM_TABLE_DEPS",
	unix.DM_TABLE_STATUS: "DM_TABLE_STATUS",
	unix.DM_TARGET_MSG:   "DM_TARGET_MSG",
	unix.DM_DEV_WAIT:     "DM_DEV_WAIT",
}

// dmTarget is one line of a device-mapper table.
type dmTarget struct {
	Start, Length uint64
	Type          string
	Params        string
}

// dmRequest is what a caller puts in the header and payload.
type dmRequest struct {
	name        string
	uuid        string
	flags       uint32
	dev         uint64
	targetCount uint32
	eventNr     uint32 // DM_DEV_WAIT: the counter to wait past
	payload     []byte
}

// dmReply is the kernel's answer: the header and the payload area it filled
// (from Data_start to Data_size).
type dmReply struct {
	hdr  unix.DmIoctl
	data []byte
}

// dmControl is an open /dev/mapper/control. ioctls on one descriptor may run
// concurrently; the kernel serialises what needs it.
type dmControl struct {
	fd int
}

var (
	controlOnce sync.Once
	controlFD   *dmControl
	controlErr  error
)

// control returns the process-wide handle on /dev/mapper/control, opening
// it (and making the node from /proc/misc when absent) on first use.
func control() (*dmControl, error) {
	controlOnce.Do(func() {
		controlFD, controlErr = openControl()
	})
	return controlFD, controlErr
}

func openControl() (*dmControl, error) {
	fd, err := unix.Open(dmControlPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil && os.IsNotExist(err) {
		if mkErr := makeControlNode(); mkErr != nil {
			return nil, fmt.Errorf("open %s: %w (making the node: %v)", dmControlPath, err, mkErr)
		}
		fd, err = unix.Open(dmControlPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dmControlPath, err)
	}
	c := &dmControl{fd: fd}
	if _, err := c.ioctl(unix.DM_VERSION, dmRequest{}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("device-mapper version check: %w", err)
	}
	return c, nil
}

// makeControlNode creates /dev/mapper/control from the misc minor the
// kernel lists for "device-mapper" in /proc/misc.
func makeControlNode() error {
	b, err := os.ReadFile("/proc/misc")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[1] == "device-mapper" {
			minor, err := strconv.Atoi(f[0])
			if err != nil {
				return fmt.Errorf("/proc/misc line %q: %w", line, err)
			}
			if err := os.MkdirAll(MapperDir, 0o755); err != nil {
				return err
			}
			return unix.Mknod(dmControlPath, unix.S_IFCHR|0o600, int(unix.Mkdev(10, uint32(minor))))
		}
	}
	return fmt.Errorf("no device-mapper entry in /proc/misc (dm-mod not loaded?)")
}

// alignedBuf returns a zeroed byte slice of n bytes (n a multiple of 8)
// whose first byte is 8-byte aligned, as struct dm_ioctl needs.
func alignedBuf(n int) []byte {
	words := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
}

// encodeRequest lays out header and payload in a buffer of size bytes.
func encodeRequest(req dmRequest, size int) ([]byte, error) {
	if len(req.name) >= len(unix.DmIoctl{}.Name) {
		return nil, fmt.Errorf("device name %q longer than %d bytes: %w", req.name, len(unix.DmIoctl{}.Name)-1, ErrInvalid)
	}
	if len(req.uuid) >= len(unix.DmIoctl{}.Uuid) {
		return nil, fmt.Errorf("device uuid %q longer than %d bytes: %w", req.uuid, len(unix.DmIoctl{}.Uuid)-1, ErrInvalid)
	}
	if size < dmHeaderSize+len(req.payload) {
		size = dmHeaderSize + len(req.payload)
	}
	size = (size + 7) &^ 7
	buf := alignedBuf(size)
	hdr := (*unix.DmIoctl)(unsafe.Pointer(&buf[0]))
	hdr.Version = [3]uint32{4, 0, 0}
	hdr.Data_size = uint32(len(buf))
	hdr.Data_start = dmHeaderSize
	hdr.Target_count = req.targetCount
	hdr.Flags = req.flags
	hdr.Dev = req.dev
	hdr.Event_nr = req.eventNr
	copy(hdr.Name[:], req.name)
	copy(hdr.Uuid[:], req.uuid)
	copy(buf[dmHeaderSize:], req.payload)
	return buf, nil
}

// decodeReply copies the header out of buf and slices the payload the
// kernel filled.
func decodeReply(buf []byte) dmReply {
	hdr := *(*unix.DmIoctl)(unsafe.Pointer(&buf[0]))
	start, end := int(hdr.Data_start), int(hdr.Data_size)
	if end > len(buf) {
		end = len(buf)
	}
	if start > end {
		start = end
	}
	return dmReply{hdr: hdr, data: buf[start:end]}
}

// ioctl sends one request, growing the buffer while the kernel reports
// DM_BUFFER_FULL_FLAG. The error wraps the errno (match with errors.Is).
func (c *dmControl) ioctl(cmd uint, req dmRequest) (dmReply, error) {
	size := dmInitialBuf
	for {
		buf, err := encodeRequest(req, size)
		if err != nil {
			return dmReply{}, err
		}
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(c.fd), uintptr(cmd), uintptr(unsafe.Pointer(&buf[0])))
		if errno != 0 {
			return dmReply{}, &dmError{cmd: cmd, name: req.name, errno: errno}
		}
		rep := decodeReply(buf)
		if rep.hdr.Flags&unix.DM_BUFFER_FULL_FLAG != 0 {
			if size >= dmMaxBuf {
				return dmReply{}, fmt.Errorf("%s %q: reply larger than %d bytes", dmCmdName(cmd), req.name, dmMaxBuf)
			}
			size *= 4
			continue
		}
		return rep, nil
	}
}

func dmCmdName(cmd uint) string {
	if n, ok := dmCmdNames[cmd]; ok {
		return n
	}
	return fmt.Sprintf("dm ioctl %#x", cmd)
}

// dmError is a failed ioctl: which request, on which device, which errno.
type dmError struct {
	cmd   uint
	name  string
	errno unix.Errno
}

func (e *dmError) Error() string {
	return fmt.Sprintf("%s %q: %v", dmCmdName(e.cmd), e.name, e.errno)
}

// Unwrap exposes the errno to errors.Is(err, unix.EBUSY) and friends.
func (e *dmError) Unwrap() error { return e.errno }

// marshalTable encodes targets as TABLE_LOAD's payload.
func marshalTable(targets []dmTarget) ([]byte, error) {
	var out bytes.Buffer
	for i, t := range targets {
		if len(t.Type) >= 16 {
			return nil, fmt.Errorf("target type %q longer than 15 bytes: %w", t.Type, ErrInvalid)
		}
		if strings.IndexByte(t.Params, 0) >= 0 {
			return nil, fmt.Errorf("target %d parameters contain a NUL byte: %w", i, ErrInvalid)
		}
		recLen := (dmSpecSize + len(t.Params) + 1 + 7) &^ 7
		rec := make([]byte, recLen)
		binary.NativeEndian.PutUint64(rec[0:], t.Start)
		binary.NativeEndian.PutUint64(rec[8:], t.Length)
		binary.NativeEndian.PutUint32(rec[16:], 0) // status
		if i < len(targets)-1 {
			binary.NativeEndian.PutUint32(rec[20:], uint32(recLen)) // relative to this spec
		}
		copy(rec[24:40], t.Type)
		copy(rec[dmSpecSize:], t.Params)
		out.Write(rec)
	}
	return out.Bytes(), nil
}

// parseTargets decodes the payload of TABLE_STATUS: count specs, each
// followed by a NUL-terminated string; Next is the offset of the next spec
// from the start of the payload.
func parseTargets(data []byte, count uint32) ([]dmTarget, error) {
	var out []dmTarget
	off := 0
	for i := uint32(0); i < count; i++ {
		if off+dmSpecSize > len(data) {
			return nil, fmt.Errorf("target %d at offset %d: payload only %d bytes", i, off, len(data))
		}
		rec := data[off:]
		t := dmTarget{
			Start:  binary.NativeEndian.Uint64(rec[0:]),
			Length: binary.NativeEndian.Uint64(rec[8:]),
			Type:   cString(rec[24:40]),
			Params: cString(rec[dmSpecSize:]),
		}
		out = append(out, t)
		next := int(binary.NativeEndian.Uint32(rec[20:]))
		if i+1 < count && next <= off {
			return nil, fmt.Errorf("target %d: next offset %d does not advance past %d", i, next, off)
		}
		off = next
	}
	return out, nil
}

// marshalMessage encodes TARGET_MSG's payload.
func marshalMessage(sector uint64, msg string) []byte {
	b := make([]byte, dmTargetMsgLen+len(msg)+1)
	binary.NativeEndian.PutUint64(b, sector)
	copy(b[dmTargetMsgLen:], msg)
	return b
}

// dmNameEntry is one device of LIST_DEVICES.
type dmNameEntry struct {
	Name    string
	Dev     uint64
	UUID    string
	HasUUID bool // the kernel reported whether the device has a uuid
}

// parseNameList decodes LIST_DEVICES' payload: struct dm_name_list records
// {u64 dev; u32 next; char name[]}, then (kernels >= 5.14) an aligned
// {u32 event_nr; u32 flags} and, with DM_UUID_FLAG, the uuid.
func parseNameList(data []byte) ([]dmNameEntry, error) {
	var out []dmNameEntry
	if len(data) < 12 {
		return nil, nil
	}
	off := 0
	for {
		if off+12 > len(data) {
			return nil, fmt.Errorf("name list entry at %d past payload of %d bytes", off, len(data))
		}
		rec := data[off:]
		dev := binary.NativeEndian.Uint64(rec[0:])
		next := int(binary.NativeEndian.Uint32(rec[8:]))
		if dev == 0 && off == 0 && next == 0 && cString(rec[12:]) == "" {
			return nil, nil // "no devices"
		}
		name := cString(rec[12:])
		e := dmNameEntry{Name: name, Dev: dev}
		// Optional trailer after the name, inside this record.
		tail := (12 + len(name) + 1 + 7) &^ 7
		end := len(rec)
		if next != 0 {
			end = next
		}
		if tail+8 <= end {
			flags := binary.NativeEndian.Uint32(rec[tail+4:])
			switch {
			case flags&unix.DM_NAME_LIST_FLAG_HAS_UUID != 0 && tail+8 < end:
				e.UUID = cString(rec[tail+8 : end])
				e.HasUUID = true
			case flags&unix.DM_NAME_LIST_FLAG_DOESNT_HAVE_UUID != 0:
				e.HasUUID = true
			}
		}
		out = append(out, e)
		if next == 0 {
			return out, nil
		}
		off += next
	}
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}

// ---- typed requests ----

// create makes an empty device (no table) and returns its dev number.
func (c *dmControl) create(name, uuid string) (uint64, error) {
	r, err := c.ioctl(unix.DM_DEV_CREATE, dmRequest{name: name, uuid: uuid})
	return r.hdr.Dev, err
}

// load puts targets in the device's inactive table slot.
func (c *dmControl) load(name string, targets []dmTarget, readOnly bool) error {
	payload, err := marshalTable(targets)
	if err != nil {
		return err
	}
	var flags uint32
	if readOnly {
		flags |= unix.DM_READONLY_FLAG
	}
	_, err = c.ioctl(unix.DM_TABLE_LOAD, dmRequest{name: name, flags: flags, targetCount: uint32(len(targets)), payload: payload})
	return err
}

// suspend suspends the device, flushing IO and freezing a mounted
// filesystem (no DM_SKIP_LOCKFS_FLAG), unless noflush.
func (c *dmControl) suspend(name string, noflush bool) error {
	flags := uint32(unix.DM_SUSPEND_FLAG)
	if noflush {
		flags |= unix.DM_NOFLUSH_FLAG | unix.DM_SKIP_LOCKFS_FLAG
	}
	_, err := c.ioctl(unix.DM_DEV_SUSPEND, dmRequest{name: name, flags: flags})
	return err
}

// resume makes a loaded inactive table live (or resumes a suspended
// device) and returns the dev number.
func (c *dmControl) resume(name string) (uint64, error) {
	r, err := c.ioctl(unix.DM_DEV_SUSPEND, dmRequest{name: name})
	return r.hdr.Dev, err
}

func (c *dmControl) remove(name string) error {
	_, err := c.ioctl(unix.DM_DEV_REMOVE, dmRequest{name: name})
	return err
}

func (c *dmControl) message(name string, msg string) error {
	_, err := c.ioctl(unix.DM_TARGET_MSG, dmRequest{name: name, payload: marshalMessage(0, msg)})
	return err
}

// devInfo is DEV_STATUS' answer.
type devInfo struct {
	Dev         uint64
	OpenCount   int32
	TargetCount uint32
	Flags       uint32
	EventNr     uint32
	// UUID is the device's dm uuid, empty when it has none: the kernel
	// writes it into the header of every reply that names a device.
	UUID string
}

// infoOf reads the device's state from a reply header.
func infoOf(hdr *unix.DmIoctl) devInfo {
	return devInfo{Dev: hdr.Dev, OpenCount: hdr.Open_count, TargetCount: hdr.Target_count, Flags: hdr.Flags,
		EventNr: hdr.Event_nr, UUID: cString(hdr.Uuid[:])}
}

func (i devInfo) suspended() bool      { return i.Flags&unix.DM_SUSPEND_FLAG != 0 }
func (i devInfo) hasLiveTable() bool   { return i.Flags&unix.DM_ACTIVE_PRESENT_FLAG != 0 }
func (i devInfo) hasInactiveTbl() bool { return i.Flags&unix.DM_INACTIVE_PRESENT_FLAG != 0 }

func (c *dmControl) info(name string) (devInfo, error) {
	r, err := c.ioctl(unix.DM_DEV_STATUS, dmRequest{name: name})
	if err != nil {
		return devInfo{}, err
	}
	return infoOf(&r.hdr), nil
}

// table returns the live table (table=true) or the targets' status lines
// (table=false). noflush asks targets not to commit first (thin-pool
// commits its metadata before reporting status otherwise).
func (c *dmControl) tableStatus(name string, table, noflush bool) ([]dmTarget, devInfo, error) {
	var flags uint32
	if table {
		flags |= unix.DM_STATUS_TABLE_FLAG
	}
	if noflush {
		flags |= unix.DM_NOFLUSH_FLAG
	}
	r, err := c.ioctl(unix.DM_TABLE_STATUS, dmRequest{name: name, flags: flags})
	if err != nil {
		return nil, devInfo{}, err
	}
	info := infoOf(&r.hdr)
	t, err := parseTargets(r.data, r.hdr.Target_count)
	if err != nil {
		return nil, info, fmt.Errorf("%s %q: %w", dmCmdName(unix.DM_TABLE_STATUS), name, err)
	}
	return t, info, nil
}

// list returns every device-mapper device, with uuids where the kernel
// reports them.
func (c *dmControl) list() ([]dmNameEntry, error) {
	r, err := c.ioctl(unix.DM_LIST_DEVICES, dmRequest{flags: unix.DM_UUID_FLAG})
	if err != nil {
		return nil, err
	}
	l, err := parseNameList(r.data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dmCmdName(unix.DM_LIST_DEVICES), err)
	}
	return l, nil
}
