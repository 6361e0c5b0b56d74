package control

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSocketFromConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	set := write("set.toml", "[daemon]\ncontrol_socket = \"/run/x/c.sock\"\nroot_dir = \"/var/lib/x\"\n[pool]\nname = \"p\"\n")
	unset := write("unset.toml", "[daemon]\nroot_dir = \"/var/lib/x\"\n")
	disabled := write("disabled.toml", "[daemon]\ncontrol_socket = \"\"\n")
	bad := write("bad.toml", "[daemon\n")
	for _, c := range []struct {
		name, path string
		want, err  string
	}{
		{"set, other keys and sections around it", set, "/run/x/c.sock", ""},
		{"left out", unset, DefaultSocket, ""},
		{"disabled", disabled, "", ""},
		{"no file: the built-in defaults", "", DefaultSocket, ""},
		{"missing file", filepath.Join(dir, "none.toml"), "", "none.toml"},
		{"not TOML", bad, "", "config " + bad},
	} {
		got, err := SocketFromConfig(c.path)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: SocketFromConfig = %q, %v; want an error naming %q", c.name, got, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%s: SocketFromConfig = %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}
