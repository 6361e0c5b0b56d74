package thinpool

import "path/filepath"

// MapperDir is where device nodes for device-mapper names live.
const MapperDir = "/dev/mapper"

// DevicePath returns /dev/mapper/<name>, the node path of device-mapper
// device name. The package makes the node itself (no udev) when it
// activates a device, and removes it when it deactivates it.
func DevicePath(name string) string { return filepath.Join(MapperDir, name) }
