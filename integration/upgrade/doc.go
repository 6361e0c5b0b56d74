// Package upgrade is the device-mapper test (build tag dm, run in the VM by
// integration/vm/suite.sh) of what docs/operating.md's "Upgrade and
// rollback" promises an operator: the previous release, built from a commit
// of this repository (testdata/previous-release, built on the host by
// prepare.sh), runs with real containerd and a local S3 server, with images
// pulled, a container running and a pull in flight; the current binary
// takes over the same root, migrates the database and keeps everything
// going; a plain restart does the same; and the documented rollback brings
// the previous release back on the copy the upgrade took.
package upgrade
