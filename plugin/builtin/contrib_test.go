package builtin

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	srvconfig "github.com/containerd/containerd/v2/cmd/containerd/server/config"
	"github.com/containerd/platforms"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/plugin"
)

// differID is the name the snippet gives the daemon as containerd's diff
// plugin.
const differID = "flyio-diff"

// TestContainerdSnippetLoads reads contrib/containerd/config.toml.snippet
// with containerd's own config loader, prefixed with each config version
// it claims to support, and checks the entries containerd will act on.
func TestContainerdSnippetLoads(t *testing.T) {
	snippet, err := os.ReadFile("../../contrib/containerd/config.toml.snippet")
	if err != nil {
		t.Fatal(err)
	}
	for _, version := range []string{"3", "4"} {
		t.Run("version "+version, func(t *testing.T) {
			path := t.TempDir() + "/config.toml"
			if err := os.WriteFile(path, append([]byte("version = "+version+"\n"), snippet...), 0o644); err != nil {
				t.Fatal(err)
			}
			var cc srvconfig.Config
			if err := srvconfig.LoadConfig(context.Background(), path, &cc); err != nil {
				t.Fatal(err)
			}
			p, ok := cc.ProxyPlugins[ID]
			if !ok || p.Type != "snapshot" || p.Address != plugin.DefaultSocket {
				t.Errorf("proxy_plugins.%s = %+v (present %v), want a snapshot plugin on %s", ID, p, ok, plugin.DefaultSocket)
			}
			d, ok := cc.ProxyPlugins[differID]
			if !ok || d.Type != "diff" || d.Address != plugin.DefaultSocket {
				t.Errorf("proxy_plugins.%s = %+v (present %v), want a diff plugin on %s", differID, d, ok, plugin.DefaultSocket)
			}
			var transfer struct {
				UnpackConfig []struct {
					Platform    string `toml:"platform"`
					Snapshotter string `toml:"snapshotter"`
					Differ      string `toml:"differ"`
					Optional    bool   `toml:"optional"`
				} `toml:"unpack_config"`
			}
			if _, err := cc.Decode(context.Background(), "io.containerd.transfer.v1.local", &transfer); err != nil {
				t.Fatal(err)
			}
			// containerd parses each entry's platform and unpacks the
			// images that platforms.Only of it matches: the flyio entry
			// must match this host's platform, whatever its architecture.
			host := platforms.DefaultSpec()
			var found bool
			for _, u := range transfer.UnpackConfig {
				p, err := platforms.Parse(u.Platform)
				if err != nil {
					t.Errorf("unpack_config entry %+v: platform: %v", u, err)
					continue
				}
				if u.Snapshotter == ID && !u.Optional && platforms.Only(p).Match(host) {
					found = true
					if u.Differ != differID {
						t.Errorf("the %s unpack_config entry's differ is %q, want %q (the daemon's diff service)", ID, u.Differ, differID)
					}
				}
				// With two diff plugins for the platform, an entry that
				// names none makes containerd warn at every start.
				if u.Differ == "" {
					t.Errorf("unpack_config entry %+v names no differ", u)
				}
			}
			if !found {
				t.Errorf("no mandatory unpack_config entry for %s matching this host's platform %s: %+v", ID, platforms.Format(host), transfer.UnpackConfig)
			}
		})
	}
}

// TestSystemdUnit checks the unit's settings the daemon relies on.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile("../../contrib/systemd/containerd-flyio-snapshotter.service")
	if err != nil {
		t.Fatal(err)
	}
	// section -> key -> values (a key may repeat, e.g. ExecStartPre).
	unit := map[string]map[string][]string{}
	section := ""
	for n, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "[") && strings.HasSuffix(l, "]"):
			section = l[1 : len(l)-1]
			unit[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok || section == "" {
				t.Fatalf("line %d: %q is neither a section nor key=value", n+1, l)
			}
			unit[section][k] = append(unit[section][k], v)
		}
	}
	want := map[string]map[string]string{
		"Unit":    {"Before": "containerd.service"},
		"Service": {"Type": "notify", "ExecStart": "/usr/local/bin/containerd-flyio-snapshotter serve --config /etc/containerd-flyio-snapshotter/config.toml", "Restart": "always", "LimitNOFILE": "1048576"},
		"Install": {"WantedBy": "multi-user.target"},
	}
	for sec, kv := range want {
		for k, v := range kv {
			if got := unit[sec][k]; len(got) != 1 || got[0] != v {
				t.Errorf("[%s] %s = %q, want %q", sec, k, got, v)
			}
		}
	}
	// The runs a stopped daemon left resume at its start and read S3 at
	// once: started before the network is up, they would spend their
	// transitions' few retries in seconds and fail their pulls. systemd
	// documents Wants= and After= network-online.target for a service
	// that talks to the network as it starts.
	for _, k := range []string{"Wants", "After"} {
		if !slices.Contains(strings.Fields(strings.Join(unit["Unit"][k], " ")), "network-online.target") {
			t.Errorf("[Unit] %s = %q, want network-online.target among them", k, unit["Unit"][k])
		}
	}
}

// installUnit runs `make install-unit` with prefix and the unit directory
// under dest, and returns the installed unit's text.
func installUnit(t *testing.T, dest, prefix string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make is needed to check the installed unit: %v", err)
	}
	cmd := exec.Command("make", "-s", "-C", "../..", "install-unit", "DESTDIR="+dest, "PREFIX="+prefix, "UNITDIR=/units")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install-unit: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dest, "units", "containerd-flyio-snapshotter.service"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestInstalledUnitNamesPrefix checks that `make install PREFIX=/usr`
// installs a unit that starts the binary it installed, not the template's
// /usr/local one.
func TestInstalledUnitNamesPrefix(t *testing.T) {
	unit := installUnit(t, t.TempDir(), "/usr")
	want := "ExecStart=/usr/bin/containerd-flyio-snapshotter serve --config /etc/containerd-flyio-snapshotter/config.toml\n"
	if !strings.Contains(unit, want) {
		t.Errorf("installed unit has no line %q:\n%s", want, unit)
	}
	if strings.Contains(unit, "/usr/local") {
		t.Errorf("installed unit still names /usr/local:\n%s", unit)
	}
}

// TestSystemdAnalyzeVerify runs systemd's own checker over the installed
// unit (its ExecStart pointing at a real executable, as after make install):
// any warning, such as a key in the wrong section, fails the test. It needs
// systemd-analyze (Debian's systemd package).
func TestSystemdAnalyzeVerify(t *testing.T) {
	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (apt-get install systemd)")
	}
	dest := t.TempDir()
	prefix := filepath.Join(dest, "prefix")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(prefix, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(exe, filepath.Join(prefix, "bin", "containerd-flyio-snapshotter")); err != nil {
		t.Fatal(err)
	}
	installUnit(t, dest, prefix)
	out, err := exec.Command(tool, "verify", filepath.Join(dest, "units", "containerd-flyio-snapshotter.service")).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}
