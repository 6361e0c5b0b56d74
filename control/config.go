package control

import (
	"fmt"
	"os"

	"github.com/pelletier/go-toml/v2"
)

// DefaultSocket is the default of daemon.control_socket.
const DefaultSocket = "/run/containerd-flyio-snapshotter/control.sock"

// Config is the control socket's key in the daemon's [daemon] section. The
// daemon's configuration embeds it; a client reads it alone with
// SocketFromConfig, so the key is spelled once.
type Config struct {
	// ControlSocket is the unix socket of the daemon's operator API; empty
	// disables it.
	ControlSocket string `toml:"control_socket"`
}

// SocketFromConfig returns daemon.control_socket as the daemon's TOML file
// at path sets it, or DefaultSocket when the file leaves it out or path is
// empty (no file: the built-in defaults, as the daemon's LoadConfig reads
// ""). Only this key is read: the daemon validates the whole file when it
// starts, and a client that only talks to it need not link the rules of
// every section.
func SocketFromConfig(path string) (string, error) {
	if path == "" {
		return DefaultSocket, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("config: %w", err)
	}
	file := struct {
		Daemon Config `toml:"daemon"`
	}{Daemon: Config{ControlSocket: DefaultSocket}}
	if err := toml.Unmarshal(data, &file); err != nil {
		return "", fmt.Errorf("config %s: %w", path, err)
	}
	return file.Daemon.ControlSocket, nil
}
