//go:build dm

package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
)

// TestSocketDialHelperProcess is not a test: started by asNobody with
// FLYIO_DIAL_HELPER set to a socket path, it connects to that socket and
// prints "connected" or the error.
func TestSocketDialHelperProcess(t *testing.T) {
	sock := os.Getenv("FLYIO_DIAL_HELPER")
	if sock == "" {
		t.Skip("helper process for TestHostileCallers")
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Println(err)
		os.Exit(0)
	}
	c.Close()
	fmt.Println("connected")
	os.Exit(0)
}

// asNobody runs a copy of this test binary (its own directory may be
// private to root) as uid and gid 65534 with no supplementary groups, the
// way `setpriv --reuid=65534 --regid=65534 --clear-groups` would, and
// returns its exit code and output.
func asNobody(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(os.Getenv("VM_SCRATCH"), "nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "client")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, string(out)
}

// poolUsed is the pool's allocated data, in bytes.
func (e *pullEnv) poolUsed() int64 {
	e.t.Helper()
	st, err := e.pool.Status(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return int64(st.UsedDataBlocks) * int64(st.BlockSizeSectors) * 512
}

// imageLayer is a layer GNU tar makes of an image tree holding three
// files of 1 GiB each with 4 KiB of data at their end (sparse: about 10 KB
// of archive for 3 GiB of files, more than a whole device holds), or,
// without sparse, the same three files holding only their 4 KiB. id
// tells layers apart (os-release's ID).
func imageLayer(t *testing.T, id string, sparse bool) []byte {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"etc", "usr", "var"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "os-release"), []byte("ID="+id+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	at := int64(0)
	if sparse {
		at = 1<<30 - 4096
	}
	for i := range 3 {
		f, err := os.Create(filepath.Join(dir, "var", fmt.Sprintf("bomb%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(bytes.Repeat([]byte{'x'}, 4096), at); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	out := filepath.Join(t.TempDir(), "layer.tar")
	if b, err := exec.Command("tar", "--sparse", "--format=posix", "-C", dir, "-cf", out, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar --sparse: %v: %s", err, b)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > 64<<10 {
		t.Fatalf("layer of %d bytes: GNU tar did not write it sparse", len(data))
	}
	return data
}

// TestHostileCallers: with the daemon running, (1) a second `serve` on the
// same root exits non-zero at once naming the lock file and the first
// daemon's pid; (2) a user that is neither root nor in daemon.socket_group
// gets a permission error from the control socket and from the snapshots
// socket; (3) the first daemon still serves a pull: a sparse-bomb layer
// (3 GiB of files in 10 KB) allocates about its real data in the pool.
func TestHostileCallers(t *testing.T) {
	e := newPullEnv(t)

	t0 := time.Now()
	code, _, errOut := runCommand(t, nil, "serve", "--config", e.cfgPath)
	lock := filepath.Join(e.cfg.Daemon.RootDir, plugin.LockFileName)
	if code == 0 || !strings.Contains(errOut, lock) || !strings.Contains(errOut, "pid "+strconv.Itoa(e.d.cmd.Process.Pid)) {
		t.Errorf("second serve: exit %d, stderr %q; want non-zero naming %s and pid %d", code, errOut, lock, e.d.cmd.Process.Pid)
	}
	if took := time.Since(t0); took > 30*time.Second {
		t.Errorf("second serve took %v to give up", took)
	}

	// Let anyone reach the sockets' directory: only the sockets' own mode
	// and the peer check stand in the way.
	for _, d := range []string{e.cfg.Daemon.RootDir, filepath.Dir(e.cfg.Daemon.Socket), filepath.Dir(e.cfg.Daemon.ControlSocket)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	for _, sock := range []string{e.cfg.Daemon.Socket, e.cfg.Daemon.ControlSocket} {
		_, out := asNobody(t, []string{"FLYIO_DIAL_HELPER=" + sock}, "-test.run=^TestSocketDialHelperProcess$")
		if !strings.Contains(out, "permission denied") {
			t.Errorf("uid 65534 connecting to %s: %q, want permission denied", sock, out)
		}
	}
	code, out := asNobody(t, []string{"FLYIO_VALIDATE_HELPER=1"}, "-test.run=^TestValidateCommandHelperProcess$", "--",
		"pull", "--control-socket", e.cfg.Daemon.ControlSocket, "s3://"+e.srv.Bucket+"/bomb.tar")
	if code == 0 || !strings.Contains(out, "permission denied") {
		t.Errorf("pull as uid 65534: exit %d, %q; want a permission error", code, out)
	}

	// The same tree with its 12 KiB of data and no holes is the anchor:
	// what a layer device costs the pool whatever its content. The first
	// pull also makes the base device, which the others share.
	e.srv.Put(t, "warm.tar", imageLayer(t, "warm", false))
	e.srv.Put(t, "plain.tar", imageLayer(t, "plain", false))
	e.srv.Put(t, "bomb.tar", imageLayer(t, "bomb", true))
	grow := func(key string) int64 {
		before := e.poolUsed()
		res, err := e.pull(key, strings.TrimSuffix(key, ".tar"))
		if err != nil {
			t.Fatalf("pull %s from the first daemon: %v", key, err)
		}
		grew := e.poolUsed() - before
		e.checkActive(res, "var/bomb0", "var/bomb2")
		return grew
	}
	grow("warm.tar")
	plain, bomb := grow("plain.tar"), grow("bomb.tar")
	t.Logf("pool grew by %d KiB for the plain layer, %d KiB for the sparse one (3 GiB of files)", plain>>10, bomb>>10)
	if bomb > plain+1<<20 {
		t.Errorf("the sparse layer took %d KiB of pool, the same data without holes %d KiB", bomb>>10, plain>>10)
	}
	e.checkClean()
}

// TestLayerOverPoolRefused: a layer bigger than the whole pool is refused
// before the download, saying so, and leaves nothing in the pool.
func TestLayerOverPoolRefused(t *testing.T) {
	e := newPullEnvTB(t, func(c *plugin.Config) { c.Pool.DataSize = 192 << 20 })
	// A small image first: it makes the base device every layer starts from.
	e.srv.Put(t, "small.tar", imageLayer(t, "small", false))
	if _, err := e.pull("small.tar", "small"); err != nil {
		t.Fatal(err)
	}
	e.srv.Put(t, "big/01.tar", genLayer(t, 1, "big", 256, 1<<20, true))
	before := e.poolUsed()
	_, err := e.pull("big/", "big")
	// The headroom check before the download says it first; the extraction
	// budget would say it again if a layer's size lied.
	if err == nil || !strings.Contains(err.Error(), "more than the pool's whole data space (192.0 MiB)") {
		t.Fatalf("pull of a 256 MiB layer into a 192 MiB pool: %v; want a refusal naming the pool's size", err)
	}
	if after := e.poolUsed(); after > before+1<<20 {
		t.Errorf("pool grew from %d to %d KiB for a refused layer", before>>10, after>>10)
	}
	e.checkClean()
}

// xattrLayer is a zstd-compressed layer of an image tree (etc, usr, var)
// with files var/x<i>, entries of them, each carrying perEntry user.*
// extended attributes of valueLen bytes.
func xattrLayer(t *testing.T, id string, entries, perEntry, valueLen int) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	write := func(h *tar.Header, body string) {
		h.Size, h.Mode, h.ModTime = int64(len(body)), 0o644, time.Unix(1700000000, 0)
		if h.Typeflag == tar.TypeDir {
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"etc/", "usr/", "var/"} {
		write(&tar.Header{Typeflag: tar.TypeDir, Name: d}, "")
	}
	write(&tar.Header{Typeflag: tar.TypeReg, Name: "etc/os-release"}, "ID="+id+"\n")
	value := strings.Repeat("v", valueLen)
	for i := range entries {
		records := map[string]string{}
		for j := range perEntry {
			records[fmt.Sprintf("SCHILY.xattr.user.x%d", j)] = value
		}
		write(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("var/x%d", i), Format: tar.FormatPAX, PAXRecords: records}, "x")
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	zw, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	return zw.EncodeAll(buf.Bytes(), nil)
}

// TestXattrLayerStopsAtBudgetXFS: on an xfs pool, whose inodes take
// extended attributes far past the one block ext4 gives them, with
// pipeline.max_total_size at 1 MiB: a small compressed layer of 300 files
// carrying 100 attributes of 600 bytes each (within the per-entry bounds,
// 18 MB in all) is refused by the total its attributes add up to, and the
// pool keeps nothing of it; a layer whose attributes fit the budget is
// pulled with them in place.
func TestXattrLayerStopsAtBudgetXFS(t *testing.T) {
	e := newPullEnvTB(t, func(c *plugin.Config) {
		c.Pool.FSType = "xfs"
		c.Pipeline.MaxTotalSize = 1 << 20
	})
	e.srv.Put(t, "fits.tar.zst", xattrLayer(t, "fits", 5, 4, 100))
	fits, err := e.pull("fits.tar.zst", "fits")
	if err != nil {
		t.Fatalf("pull of a layer with 2 KB of xattrs: %v", err)
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-o", "ro,norecovery", fits.Snapshot.DevicePath, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v: %s", fits.Snapshot.DevicePath, err, out)
	}
	val := make([]byte, 256)
	n, err := unix.Getxattr(filepath.Join(dir, "var/x4"), "user.x3", val)
	exec.Command("umount", dir).Run()
	if err != nil || string(val[:n]) != strings.Repeat("v", 100) {
		t.Errorf("var/x4's user.x3 on the xfs image: %q, %v; want 100 bytes of v", val[:max(n, 0)], err)
	}

	heavy := xattrLayer(t, "heavy", 300, 100, 600)
	e.srv.Put(t, "heavy.tar.zst", heavy)
	before := e.poolUsed()
	t0 := time.Now()
	_, err = e.pull("heavy.tar.zst", "heavy")
	took := time.Since(t0)
	if err == nil || !strings.Contains(err.Error(), "total size too large") || !strings.Contains(err.Error(), "extended attributes") {
		t.Fatalf("pull of %d bytes carrying 18 MB of xattrs: %v; want the total size refused", len(heavy), err)
	}
	grew := e.poolUsed() - before
	t.Logf("layer of %d bytes with 18 MB of xattrs refused in %v; the pool grew by %d KiB", len(heavy), took.Round(time.Millisecond), grew>>10)
	if grew > 1<<20 {
		t.Errorf("the pool grew by %d KiB for a refused layer", grew>>10)
	}
	e.checkClean()
}
