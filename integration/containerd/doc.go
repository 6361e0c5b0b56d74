// Package containerdtest runs real containerd v2.4 (built from the module
// proxy by integration/tools/build.sh) against our snapshotter daemon,
// configured as a containerd proxy plugin, and against containerd's
// built-in devmapper snapshotter as the benchmark anchor. Its tests need
// real device-mapper: they live in files with the dm build tag and run only
// inside the VM harness (integration/vm/suite.sh). Package ociimage builds
// the test image they import; package integration/stack starts and watches
// the daemons (containerd, ours).
package containerdtest
