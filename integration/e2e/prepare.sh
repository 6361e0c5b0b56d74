#!/usr/bin/env bash
# Host-side preparation of the end-to-end run (scripts/demo.sh and the dm
# test TestEndToEnd both need it; the VM has no network): builds our binary,
# containerd's tools and versitygw, makes the Debian image's layers
# (mkimage.sh), builds the demo driver and seeds the versitygw store of the
# image (bucket, public-read policy, layers, generated keys). Each step is
# cached; a second call takes seconds. Prints the image folder and records
# it with versitygw's path in .cache/e2e/inputs.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd "$here/../.." && pwd -P)
cd "$repo"
say() { echo "prepare: $*" >&2; }
say "Debian packages (scripts/install-deps.sh: debootstrap, qemu, ...)"
./scripts/install-deps.sh >&2
say "bin/containerd-flyio-snapshotter"
# Run from `make -j2 test`, it gets no share of that make's jobs: its own
# make of the binary runs apart (MAKEFLAGS emptied).
MAKEFLAGS= make --no-print-directory build >/dev/null
say "containerd, containerd-shim-runc-v2, ctr (integration/tools/build.sh)"
./integration/tools/build.sh containerd >/dev/null
say "versitygw (scripts/install-versitygw.sh)"
vgw=$(./scripts/install-versitygw.sh)
say "Debian image layers (integration/e2e/mkimage.sh)"
images=$(./integration/e2e/mkimage.sh)
say "demo driver (.cache/e2e/bin/flyio-demo)"
mkdir -p .cache/e2e/bin
CGO_ENABLED=0 go build -o .cache/e2e/bin/flyio-demo.tmp ./integration/e2e/cmd/flyio-demo
mv .cache/e2e/bin/flyio-demo.tmp .cache/e2e/bin/flyio-demo
say "versitygw store with the layers ($images/s3)"
.cache/e2e/bin/flyio-demo seed --images "$images" --versitygw "$vgw" >/dev/null
# What TestEndToEnd reads inside the VM (it cannot run these scripts there).
printf 'images=%s\nversitygw=%s\n' "$images" "$vgw" > .cache/e2e/inputs.tmp
mv .cache/e2e/inputs.tmp .cache/e2e/inputs
echo "$images"
