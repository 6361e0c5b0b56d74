package main

import (
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/cmd/internal/cli"

	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
)

func writeTar(t *testing.T, path string, hdrs ...*tar.Header) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("a"), int(h.Size)))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestValidateCommandHelperProcess is not a test: it runs the binary's
// main dispatch when started by TestValidateCommand.
func TestValidateCommandHelperProcess(t *testing.T) {
	if os.Getenv("FLYIO_VALIDATE_HELPER") != "1" {
		t.Skip("helper process for TestValidateCommand")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	os.Exit(cli.Main(args))
}

// commandProc is `containerd-flyio-snapshotter ARGS...` running as a
// process (this test binary re-executed), started by startCommand.
type commandProc struct {
	cmd *exec.Cmd
	// exited receives cmd.Wait's result once the process has ended.
	exited chan error
	// stderr is what the process wrote there so far.
	stderr *stack.LockedBuffer
}

// startCommand starts `containerd-flyio-snapshotter ARGS...` with env
// added to the test's environment. At the test's cleanup, if it still
// runs, it is stopped as systemd stops the daemon: SIGTERM, then SIGKILL
// a minute later.
func startCommand(t testing.TB, env []string, args ...string) *commandProc {
	t.Helper()
	p := &commandProc{exited: make(chan error, 1), stderr: &stack.LockedBuffer{}}
	p.cmd = exec.Command(os.Args[0], append([]string{"-test.run=^TestValidateCommandHelperProcess$", "--"}, args...)...)
	p.cmd.Env = append(append(os.Environ(), "FLYIO_VALIDATE_HELPER=1"), env...)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		err := p.cmd.Wait()
		close(done)
		p.exited <- err
	}()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(time.Minute):
			p.cmd.Process.Signal(syscall.SIGKILL)
			<-done
		}
	})
	return p
}

// runCommand runs `containerd-flyio-snapshotter ARGS...` as a process (this
// test binary re-executed) and returns its exit status and output.
func runCommand(t testing.TB, stdin []byte, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestValidateCommandHelperProcess$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), "FLYIO_VALIDATE_HELPER=1")
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

func TestValidateCommand(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.tar")
	writeTar(t, good,
		&tar.Header{Typeflag: tar.TypeDir, Name: "rootfs/", Mode: 0o755},
		&tar.Header{Typeflag: tar.TypeDir, Name: "rootfs/etc/", Mode: 0o755},
		&tar.Header{Typeflag: tar.TypeReg, Name: "rootfs/etc/hostname", Mode: 0o644, Size: 5},
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "rootfs/etc/vi", Linkname: "/usr/bin/vim", Mode: 0o777},
	)
	bad := filepath.Join(dir, "bad.tar")
	writeTar(t, bad,
		&tar.Header{Typeflag: tar.TypeReg, Name: "usr/bin/su", Mode: 0o4755, Size: 3},
	)
	escape := filepath.Join(dir, "escape.tar")
	writeTar(t, escape, &tar.Header{Typeflag: tar.TypeReg, Name: "../../etc/cron.d/x", Mode: 0o644, Size: 1})
	notTar := filepath.Join(dir, "notes.txt")
	os.WriteFile(notTar, bytes.Repeat([]byte("plain text\n"), 200), 0o644)
	goodBytes, _ := os.ReadFile(good)
	goodSum := sha256.Sum256(goodBytes)
	goodDiff := "sha256:" + hex.EncodeToString(goodSum[:])
	gz := filepath.Join(dir, "good.tar.gz")
	var gzBuf bytes.Buffer
	zw := gzip.NewWriter(&gzBuf)
	zw.Write(goodBytes)
	zw.Close()
	os.WriteFile(gz, gzBuf.Bytes(), 0o644)
	zs := filepath.Join(dir, "good.zstd-under-a-tar-name.tar")
	zsw, _ := zstd.NewWriter(nil)
	os.WriteFile(zs, zsw.EncodeAll(goodBytes, nil), 0o644)
	cut := filepath.Join(dir, "cut.tar.gz")
	os.WriteFile(cut, gzBuf.Bytes()[:gzBuf.Len()/2], 0o644)

	cases := []struct {
		name   string
		stdin  []byte
		args   []string
		code   int
		stdout string // substring
		stderr string // substring
	}{
		{"accepted", nil, []string{"validate", good}, 0,
			good + ": ok: 4 entries (1 files, 2 dirs, 1 symlinks, 0 hard links, 0 whiteouts), 5 bytes of files, rootfs/ folder", ""},
		{"stdin", goodBytes, []string{"validate", "-"}, 0, "-: ok: 4 entries", ""},
		{"plain-diff-id", nil, []string{"validate", good}, 0, "(stripped at extraction); plain, diff ID " + goodDiff + "\n", ""},
		{"gzip", nil, []string{"validate", gz}, 0, gz + ": ok: 4 entries (1 files, 2 dirs, 1 symlinks, 0 hard links, 0 whiteouts), 5 bytes of files, rootfs/ folder (stripped at extraction); gzip, diff ID " + goodDiff + "\n", ""},
		{"zstd", nil, []string{"validate", zs}, 0, zs + ": ok: 4 entries (1 files, 2 dirs, 1 symlinks, 0 hard links, 0 whiteouts), 5 bytes of files, rootfs/ folder (stripped at extraction); zstd, diff ID " + goodDiff + "\n", ""},
		{"gzip-truncated", nil, []string{"validate", cut}, 1, "", cut + ": malformed tar archive"},
		{"setuid", nil, []string{"validate", bad}, 1, "", bad + `: entry "usr/bin/su": setuid/setgid bit`},
		{"setuid-allowed", nil, []string{"validate", "--allow-setid", bad}, 0, bad + ": ok", ""},
		{"traversal", nil, []string{"validate", escape}, 1, "", escape + `: entry "../../etc/cron.d/x": path climbs above the root`},
		{"not-a-tar", nil, []string{"validate", notTar}, 1, "", notTar + ": malformed tar archive at offset"},
		{"missing-file", nil, []string{"validate", filepath.Join(dir, "nope.tar")}, 2, "", "no such file"},
		{"no-args", nil, []string{"validate"}, 2, "", "expected exactly one"},
		{"help", nil, []string{"validate", "--help"}, 0, "Exit status: 0", ""},
	}
	setidCfg := filepath.Join(dir, "setid.toml")
	os.WriteFile(setidCfg, []byte("[pipeline]\nallow_setid = true\n"), 0o644)
	entriesCfg := filepath.Join(dir, "entries.toml")
	os.WriteFile(entriesCfg, []byte("[pipeline]\nmax_entries = 3\n"), 0o644)
	fileCfg := filepath.Join(dir, "file.toml")
	os.WriteFile(fileCfg, []byte("[pipeline]\nmax_file_size = 4\n"), 0o644)
	totalCfg := filepath.Join(dir, "total.toml")
	os.WriteFile(totalCfg, []byte("[pipeline]\nmax_total_size = 4\n"), 0o644)
	cases = append(cases, []struct {
		name   string
		stdin  []byte
		args   []string
		code   int
		stdout string
		stderr string
	}{
		// The config's policy is the daemon's: a file admitting setuid
		// binaries makes validate admit them too, flags before or after
		// the tarball.
		{"config-allows-setid", nil, []string{"validate", "--config", setidCfg, bad}, 0, bad + ": ok", ""},
		{"config-after-file", nil, []string{"validate", bad, "--config", setidCfg}, 0, bad + ": ok", ""},
		{"config-max-entries", nil, []string{"validate", "--config", entriesCfg, good}, 1, "", good + `: entry "rootfs/etc/vi": too many entries: more than 3`},
		{"config-max-file-size", nil, []string{"validate", "--config", fileCfg, good}, 1, "", good + `: entry "rootfs/etc/hostname": file too large: 5 bytes, limit 4`},
		{"config-max-total-size", nil, []string{"validate", "--config", totalCfg, good}, 1, "", good + `: entry "rootfs/etc/hostname": total size too large`},
		{"bad-config", nil, []string{"validate", "--config", filepath.Join(dir, "nope.toml"), good}, 2, "", "nope.toml"},
	}...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := runCommand(t, c.stdin, c.args...)
			if code != c.code || !strings.Contains(stdout, c.stdout) || !strings.Contains(stderr, c.stderr) {
				t.Errorf("exit %d, stdout %q, stderr %q\nwant exit %d, stdout with %q, stderr with %q",
					code, stdout, stderr, c.code, c.stdout, c.stderr)
			}
			if c.code == 0 && strings.Count(stdout, "\n") != 1 && c.name != "help" {
				t.Errorf("summary is not one line: %q", stdout)
			}
		})
	}
}

// TestValidateCommandEscapes: a crafted layer whose names and link targets
// carry terminal controls (return to the line's start, erase it, print a
// green "ok") gets its rejection printed as one line with no raw ESC or
// CR, however the strings reach the message; so does a crafted file name.
func TestValidateCommandEscapes(t *testing.T) {
	const fake = "\r\x1b[2K\x1b[32mlayer.tar: ok: 1 entries\x1b[0m\n"
	dir := t.TempDir()
	cases := map[string][]*tar.Header{
		"symlink-target":  {{Typeflag: tar.TypeSymlink, Name: "etc/x", Linkname: "../../" + fake, Mode: 0o777}},
		"hardlink-target": {{Typeflag: tar.TypeLink, Name: "etc/x", Linkname: "etc/" + fake, Mode: 0o644}},
		"parent-dir": {
			{Typeflag: tar.TypeReg, Name: "d" + fake, Mode: 0o644, Size: 1},
			{Typeflag: tar.TypeReg, Name: "d" + fake + "/f", Mode: 0o644, Size: 1},
		},
		"entry-name": {{Typeflag: tar.TypeReg, Name: "su" + fake, Mode: 0o4755, Size: 1}},
	}
	for name, hdrs := range cases {
		t.Run(name, func(t *testing.T) {
			for _, file := range []string{filepath.Join(dir, name+".tar"), filepath.Join(dir, name+fake+".tar")} {
				writeTar(t, file, hdrs...)
				code, stdout, stderr := runCommand(t, nil, "validate", file)
				if code != 1 || stdout != "" {
					t.Fatalf("exit %d, stdout %q, stderr %q; want a rejection", code, stdout, stderr)
				}
				if strings.ContainsAny(stderr, "\x1b\r") || strings.Count(stderr, "\n") != 1 {
					t.Errorf("stderr %q carries raw controls or more than one line", stderr)
				}
				if !strings.Contains(stderr, `\x1b[32m`) {
					t.Errorf("stderr %q does not show the escaped controls", stderr)
				}
			}
		})
	}
}

// TestValidateCommandXattrsAndPadding: the config's per-entry xattr bounds
// and the padding bound after the end-of-archive marker reach validate.
func TestValidateCommandXattrsAndPadding(t *testing.T) {
	dir := t.TempDir()
	xattrs := filepath.Join(dir, "xattrs.tar")
	writeTar(t, xattrs, &tar.Header{Typeflag: tar.TypeReg, Name: "f", Mode: 0o644, Size: 1, Format: tar.FormatPAX,
		PAXRecords: map[string]string{"SCHILY.xattr.user.a": "1", "SCHILY.xattr.user.b": "2"}})
	cfg := filepath.Join(dir, "xattrs.toml")
	os.WriteFile(cfg, []byte("[pipeline]\nmax_xattrs_per_entry = 1\n"), 0o644)
	if code, _, stderr := runCommand(t, nil, "validate", "--config", cfg, xattrs); code != 1 || !strings.Contains(stderr, `entry "f": too many extended attributes: 2 records, limit 1`) {
		t.Errorf("exit %d, stderr %q; want the xattr count refused", code, stderr)
	}
	if code, stdout, _ := runCommand(t, nil, "validate", xattrs); code != 0 || !strings.Contains(stdout, ": ok") {
		t.Errorf("exit %d, stdout %q; want the default bounds to accept 2 xattrs", code, stdout)
	}
	padded, _ := os.ReadFile(xattrs)
	padded = append(padded, make([]byte, 8192)...)
	if code, stdout, stderr := runCommand(t, append(padded, 'x'), "validate", "-"); code != 1 || !strings.Contains(stderr, "data after the end-of-archive marker") {
		t.Errorf("exit %d, stdout %q, stderr %q; want the trailing byte refused", code, stdout, stderr)
	}
}

// TestValidateInterruptedWhileReading: Ctrl-C ends validate while it
// waits for bytes that do not come (standard input a terminal or a pipe
// whose writer is idle), with exit status 2 and "interrupted", instead of
// going on waiting.
func TestValidateInterruptedWhileReading(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() // the writer stays open and silent while validate runs
	var stderr stack.LockedBuffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestValidateCommandHelperProcess$", "--", "validate", "-")
	cmd.Env = append(os.Environ(), "FLYIO_VALIDATE_HELPER=1")
	cmd.Stdin, cmd.Stderr = r, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// The header's first bytes, then nothing: validate is reading.
	if _, err := w.Write([]byte("etc/")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "interrupted") {
			t.Errorf("validate - interrupted: %v, stderr %q; want exit status 2 and \"interrupted\"", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Fatal("validate - went on waiting for its input 10s after Ctrl-C")
	}
}
