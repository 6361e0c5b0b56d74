// Package stack starts, on one machine with real device-mapper, the whole
// system the end-to-end run needs: a local S3-compatible server (versitygw,
// real SigV4, a public-read bucket policy) seeded with the layer tarballs of
// integration/e2e/mkimage.sh, our snapshotter daemon on its embedded
// loop-file pool, and real containerd with our proxy plugin. The README's
// demo (integration/e2e/cmd/flyio-demo) and the dm test of integration/e2e
// both build on it, so the demo a newcomer runs is the run `make test`
// checks. Every process logs to a file of its own, named in the errors.
//
// Its process helpers (Proc, WaitDial, Run, RepoRoot, ToolsDir) also start
// and watch the daemons of integration/containerd's tests.
package stack
