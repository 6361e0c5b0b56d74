// Package soak holds the long-running check of the daemon (build tag dm, run
// inside the VM harness): many Prepare/Commit/Remove cycles through a real
// containerd with the daemon as its proxy plugin, and S3 pull and remove
// cycles through the control socket, after which nothing may be left and
// the daemon's memory, goroutines and database file must not have grown.
// See README.md in this folder.
package soak
