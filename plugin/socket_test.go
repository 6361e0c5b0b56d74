package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// dialEnv makes the test binary, re-run by asOther, a client of the socket
// it names instead of running tests: it POSTs to it and prints the status
// and body, or the dial error.
const dialEnv = "PLUGIN_TEST_DIAL_SOCKET"

func TestMain(m *testing.M) {
	if sock := os.Getenv(dialEnv); sock != "" {
		os.Exit(dialAndPrint(sock))
	}
	if sock := os.Getenv(applyEnv); sock != "" {
		os.Exit(applyAndPrint(sock))
	}
	if sock := os.Getenv(commitEnv); sock != "" {
		os.Exit(commitAndPrint(sock))
	}
	os.Exit(m.Run())
}

func dialAndPrint(sock string) int {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	resp, err := hc.Post("http://control/v1/activate", "application/json", strings.NewReader(`{"ref":"x"}`))
	if err != nil {
		fmt.Println("error:", err)
		return 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("status %d %s", resp.StatusCode, body)
	return 0
}

// asOther runs the dial helper as uid and gid 65534 (nobody), with the
// supplementary groups given, and returns what it printed.
func asOther(t *testing.T, sock string, groups ...uint32) string {
	t.Helper()
	return runAsOther(t, []string{dialEnv + "=" + sock}, groups...)
}

// runAsOther runs a copy of the test binary, with env added to its
// environment (naming the helper TestMain runs instead of the tests), as
// uid and gid 65534 (nobody) with the supplementary groups given, and
// returns what it printed.
func runAsOther(t *testing.T, env []string, groups ...uint32) string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Fatal("this test needs root, to run a client as another user")
	}
	// The test binary's own directory is private to root: run a copy.
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(socketDir(t), "client")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: groups}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client as uid 65534: %v: %s", err, out)
	}
	return string(out)
}

// socketDir is a directory anyone may traverse (t.TempDir is 0700).
func socketDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for _, p := range []string{d, filepath.Dir(d)} {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// TestListenUnixModeAndGroup: the socket has mode 0660 and the group asked
// for even under a permissive umask, nothing of its binding is left beside
// it, and closing removes it.
func TestListenUnixModeAndGroup(t *testing.T) {
	dir := socketDir(t)
	sock := filepath.Join(dir, "s.sock")
	old := unix.Umask(0)
	lis, err := ListenUnix(context.Background(), sock, SocketMode, 4242)
	unix.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(sock, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o660 || st.Gid != 4242 || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		t.Errorf("socket mode %o gid %d, want a socket, 0660, gid 4242", st.Mode, st.Gid)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory holds %d entries, want the socket only", len(ents))
	}
	if out := asOther(t, sock); !strings.Contains(out, "permission denied") {
		t.Errorf("uid 65534 connecting: %q, want permission denied", out)
	}
	lis.Close()
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after Close: %v", err)
	}
}

// TestPeerCheckRefusesOthers: behind PeerCheck, a caller that is neither
// root nor in the group gets a 403 naming its uid and the rule, even when
// the socket's mode would let it in; root gets through.
func TestPeerCheckRefusesOthers(t *testing.T) {
	ctx := context.Background()
	sock := filepath.Join(socketDir(t), "control.sock")
	lis, err := ListenUnix(ctx, sock, SocketMode, 4242)
	if err != nil {
		t.Fatal(err)
	}
	lis = PeerCheck(ctx, lis, 4242)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "served") })}
	go srv.Serve(lis)
	defer srv.Close()
	if err := os.Chmod(sock, 0o666); err != nil { // as a careless operator might
		t.Fatal(err)
	}
	out := asOther(t, sock)
	status, body, _ := strings.Cut(out, " {")
	var ans struct{ Error string }
	if status != "status 403" || json.Unmarshal([]byte("{"+body), &ans) != nil {
		t.Fatalf("uid 65534: %q, want a 403 with a JSON error", out)
	}
	if !strings.Contains(ans.Error, "uid 65534") || !strings.Contains(ans.Error, ErrPeerRefused.Error()) || !strings.Contains(ans.Error, "4242") {
		t.Errorf("refusal %q does not name the uid, the rule and the group", ans.Error)
	}
	var buf bytes.Buffer
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	resp, err := hc.Get("http://control/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(&buf, resp.Body)
	resp.Body.Close()
	if buf.String() != "served" {
		t.Errorf("root: %q", buf.String())
	}
	// A member of the group by a supplementary group only.
	if out := asOther(t, sock, 100, 4242); out != "status 200 served" {
		t.Errorf("uid 65534 with supplementary group 4242: %q, want served", out)
	}
}

// TestListenUnixAtTheLongestPathValidateTakes: a socket path as long as
// daemon.socket may be (107 bytes), with a short name in a deep directory,
// is listened on and answers. The socket is bound under a private
// directory beside it first, whose longer path must not be what a unix
// address has to hold.
func TestListenUnixAtTheLongestPathValidateTakes(t *testing.T) {
	base := socketDir(t)
	name := "s.sock"
	dir := filepath.Join(base, strings.Repeat("d", 107-len(base)-2-len(name)))
	sock := filepath.Join(dir, name)
	if len(sock) != 107 {
		t.Fatalf("socket path is %d bytes, want 107", len(sock))
	}
	c := DefaultConfig()
	c.Daemon.Socket = sock
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate refuses the path: %v", err)
	}
	lis, err := ListenUnix(context.Background(), sock, SocketMode, 0)
	if err != nil {
		t.Fatalf("ListenUnix at a %d-byte path Validate accepts: %v", len(sock), err)
	}
	defer lis.Close()
	go func() {
		if c, err := lis.Accept(); err == nil {
			c.Close()
		}
	}()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("dial %s: %v", sock, err)
	}
	conn.Close()
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory holds %d entries, want the socket only", len(ents))
	}
}
