// Package e2e is the end-to-end test of the whole system, the README's demo
// checked (TestEndToEnd, a dm test run by integration/vm/suite.sh): a Debian
// image made with debootstrap (mkimage.sh) served by a local S3 server with
// real SigV4 (versitygw), pulled by our daemon into its thin pool, run by
// real containerd with `ctr run --snapshotter flyio`, then removed to the
// last device and row. Package integration/stack starts the pieces;
// cmd/flyio-demo is the demo driver scripts/demo.sh runs.
package e2e
