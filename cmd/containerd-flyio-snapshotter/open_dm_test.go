//go:build dm

package main

import (
	"os"
	"strings"
	"testing"
)

// TestRmKeepsAnImageWhoseDeviceIsOpen: an S3 image's activation device is
// what an operator gives a VM, or mounts, by its path. While a process
// holds that device open, `rm` refuses the image as in use, naming the
// open device, and leaves its records and device alone; once it is
// closed, `rm` removes the image.
func TestRmKeepsAnImageWhoseDeviceIsOpen(t *testing.T) {
	e := newPullEnvTB(t)
	e.srv.Put(t, "vm/1.tar", genLayer(t, 7, "vm", 1, 4096, true))
	res, err := e.pull("vm/", "vm-disk")
	if err != nil {
		t.Fatal(err)
	}
	disk, err := os.Open(res.Snapshot.DevicePath)
	if err != nil {
		t.Fatalf("open the activation's device as a VM would: %v", err)
	}
	defer disk.Close()
	rm := func() (int, string) {
		code, out, errOut := runCommand(t, nil, "rm", "--control-socket", e.cfg.Daemon.ControlSocket, "vm-disk")
		return code, out + errOut
	}
	if code, out := rm(); code != 1 || !strings.Contains(out, "is open: a VM, a mount or a process uses it") {
		t.Errorf("rm of an image whose device is open = %d, %q; want 1, in use", code, out)
	}
	if _, err := os.Stat(res.Snapshot.DevicePath); err != nil {
		t.Errorf("the open device after the refused rm: %v", err)
	}
	if err := disk.Close(); err != nil {
		t.Fatal(err)
	}
	if code, out := rm(); code != 0 || !strings.Contains(out, "removed ") {
		t.Errorf("rm once the device is closed = %d, %q; want 0, removed", code, out)
	}
}
