// Package clients holds end-to-end tests (build tag dm, run in the VM
// harness) of the snapshotter under the clients people use with it: a real
// OCI registry (distribution's registry on loopback) serving an image that
// `ctr image pull --snapshotter flyio`, `nerdctl --snapshotter flyio` and
// containerd's CRI plugin (the Kubernetes container runtime interface, with
// "flyio" as the CRI image snapshotter) pull and run. The programs are the
// ones integration/tools/build.sh pins and builds on the host.
package clients
