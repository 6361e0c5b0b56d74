// Package pullbench holds the pull benchmark (build tag dm, run in the VM
// harness): the same generated gzip images pulled cold, in alternating
// rounds, from a local registry into containerd's devmapper snapshotter,
// into overlayfs and into our daemon, and with our CLI's pull from a local
// S3 server, against the hardware's floor measured in the same run
// (fetching the compressed bytes, inflating the largest layer on one core,
// writing the unpacked files to a fresh ext4 thin device). It prints a
// markdown table per image and where the time of one S3 pull goes.
// docs/benchmarks.md says how to run it at full size.
package pullbench
