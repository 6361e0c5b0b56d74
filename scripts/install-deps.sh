#!/usr/bin/env bash
# Installs the Debian packages the build and the VM test harness need.
# Idempotent: skips apt entirely when everything is already present.
set -euo pipefail
pkgs=(qemu-system-x86 linux-image-amd64 busybox-static e2fsprogs xfsprogs cpio kmod
      runc libseccomp2 thin-provisioning-tools dmsetup gcc libc6-dev make
      debootstrap
      isal       # igzip: the gzip inflater daemon.gzip_command = "auto" runs, and its tests
      xz-utils mount util-linux)  # VM harness: PVH kernel unpacking, losetup/blockdev/mountpoint
# make release / release-check: the arm64 cross gcc and libc for the static
# cgo build, qemu-user to run the arm64 binary, file to check it is static.
pkgs+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user file)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
