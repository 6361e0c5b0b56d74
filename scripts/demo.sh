#!/usr/bin/env bash
# The README's first command: the whole system end to end on a fresh machine.
#
#   scripts/demo.sh
#
# 1. installs what it needs (Debian packages, versitygw, containerd built
#    from the module proxy) and builds our binary;
# 2. makes a Debian bookworm image with debootstrap, cut into layer tarballs
#    laid out images/<family>/<n>.tar (integration/e2e/mkimage.sh), and a
#    versitygw store holding them in a public-read bucket
#    (integration/e2e/prepare.sh; all cached under .cache/);
# 3. with real device-mapper (inside the QEMU VM of integration/vm/run.sh
#    when this host has none): starts versitygw (SigV4, generated keys) on
#    that store, checks anonymous reads work and unsigned writes do not,
#    starts containerd-flyio-snapshotter on its
#    loop-file pool and containerd with our proxy plugin, pulls each family
#    with `containerd-flyio-snapshotter pull s3://...`, runs containers with
#    `ctr run --snapshotter flyio`, removes the images and everything it
#    started (integration/e2e/cmd/flyio-demo);
# 4. prints what the containers printed and where each log is
#    (.cache/e2e/demo-logs/<time>/).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$root"
t0=$(date +%s)
step() { printf '==> [%4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }

step "installing Debian packages (scripts/install-deps.sh)"
./scripts/install-deps.sh
step "building, installing versitygw and containerd, making the image (integration/e2e/prepare.sh)"
images=$(./integration/e2e/prepare.sh)
vgw=$(./scripts/install-versitygw.sh)
tools=$(./integration/tools/build.sh containerd)
(cd "$images" && find images -name '*.tar' | LC_ALL=C sort | while read -r f; do
   printf '      %-26s %6s KiB  sha256:%.12s\n' "$f" "$(( $(stat -c %s "$f") >> 10 ))" "$(sha256sum "$f")"; done)
logs=$root/.cache/e2e/demo-logs/$(date -u +%Y%m%dT%H%M%SZ)
if dmsetup version 2>/dev/null | grep -q '^Driver version'; then
  step "this host has device-mapper: running directly"
else
  step "no device-mapper on this host: running in the QEMU VM (integration/vm/run.sh)"
fi
rc=0
./integration/vm/run.sh --mem "${VM_MEM:-4096}" --timeout "${DEMO_TIMEOUT:-900}" -- \
  "$root/.cache/e2e/bin/flyio-demo" --images "$images" --versitygw "$vgw" --logs "$logs" || rc=$?
if [ $rc -eq 0 ]; then
  step "done (containerd $(basename "$tools"), logs in $logs)"
else
  step "FAILED (exit $rc); logs in $logs"
fi
exit $rc
