// Package vm holds the checks of the VM test harness. The harness itself is
// shell: run.sh runs a command against real device-mapper (directly on a
// host that has it, otherwise in a QEMU TCG guest booting the host's Debian
// kernel) and suite.sh runs every `//go:build dm` test package in one boot.
// The tests of this package (build tag dm, run only inside the harness)
// prove that the guest offers what the other packages' dm tests rely on.
// See README.md in this folder.
package vm
