package control

import (
	"errors"
	"fmt"
	"io/fs"
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
// at path sets it, or DefaultSocket when the file leaves it out. With
// optional, a missing file is no error and also gives DefaultSocket. Only
// this key is read: the daemon validates the whole file when it starts, and
// a client that only talks to it need not link the rules of every section.
func SocketFromConfig(path string, optional bool) (string, error) {
	data, err := os.ReadFile(path)
	if optional && errors.Is(err, fs.ErrNotExist) {
		return DefaultSocket, nil
	}
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
