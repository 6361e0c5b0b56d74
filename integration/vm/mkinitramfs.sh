#!/usr/bin/env bash
# Builds (or reuses) the VM harness initramfs and prints its path.
#
# Usage: mkinitramfs.sh KERNEL_VERSION CACHE_DIR
#
# The initramfs holds only a static busybox, the guest init scripts (init,
# stage2) and the kernel modules the harness needs (device-mapper thin pool,
# loop, ext4, xfs, overlay, 9p over virtio, virtio console and rng), resolved
# with that kernel's modules.dep/softdep through `modprobe --show-depends`.
# Everything else comes from the host's root filesystem over 9p at run time.
#
# The result is cached as CACHE_DIR/initramfs-<sha256>.cpio, keyed by the
# kernel version, this script, init, stage2, busybox and every module file,
# so it is rebuilt only when one of them changes. Writes are atomic (temp file
# + rename), so concurrent runs never see a half-written archive.
set -euo pipefail

kver=${1:?usage: mkinitramfs.sh KERNEL_VERSION CACHE_DIR}
cache=${2:?usage: mkinitramfs.sh KERNEL_VERSION CACHE_DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
busybox=/bin/busybox

# Modules loaded before the guest command starts; their dependencies are
# added by modprobe. Filesystems (ext4, xfs) are not here: the guest's
# stage2 preloads ext4 in the background and the kernel loads any other
# module on demand with the host's /sbin/modprobe over the 9p root (each
# large module costs seconds under TCG).
wanted=(virtio_pci 9pnet_virtio 9p overlay virtio_console
        dm-mod dm-thin-pool loop)

[ -d "/lib/modules/$kver" ] || { echo "mkinitramfs: /lib/modules/$kver missing (install linux-image-amd64)" >&2; exit 1; }
[ -x "$busybox" ] && "$busybox" --list | grep -x switch_root >/dev/null || {
  echo "mkinitramfs: $busybox is not a usable busybox (install busybox-static)" >&2; exit 1; }
command -v modprobe >/dev/null || { echo "mkinitramfs: modprobe missing (install kmod)" >&2; exit 1; }
command -v cpio >/dev/null || { echo "mkinitramfs: cpio missing (install cpio)" >&2; exit 1; }

# Ordered, de-duplicated list of module files (dependencies first).
mapfile -t mods < <(
  for m in "${wanted[@]}"; do
    modprobe -S "$kver" --show-depends "$m" || { echo "mkinitramfs: cannot resolve module $m for $kver" >&2; exit 1; }
  done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }')
[ ${#mods[@]} -gt 0 ] || { echo "mkinitramfs: no modules resolved for $kver" >&2; exit 1; }
for f in "${mods[@]}"; do
  case $f in *.ko) ;; *) echo "mkinitramfs: compressed module $f not supported" >&2; exit 1 ;; esac
done

key=$( { echo "kernel $kver"; sha256sum "$here/mkinitramfs.sh" "$here/init" "$here/stage2" "$busybox" "${mods[@]}"; } \
       | sha256sum | cut -c1-16)
out="$cache/initramfs-$key.cpio"
if [ -s "$out" ]; then echo "$out"; exit 0; fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
mkdir -p "$root"/{bin,dev,proc,sys,lib/modules,lower,upper,newroot,io}
cp "$busybox" "$root/bin/busybox"
install -m 0755 "$here/init" "$root/init"
install -m 0755 "$here/stage2" "$root/stage2"
: > "$root/modules.list"
# Module signatures are dropped: checking them (RSA + SHA over each module)
# costs tens of milliseconds per module under TCG, and the kernel loads
# unsigned modules when signatures are not enforced (it only taints itself).
# Layout of a signed module: <module> <signature sig_len bytes>
# <12-byte struct module_signature, sig_len big-endian in its last 4 bytes>
# "~Module signature appended~\n" (28 bytes).
strip_sig() {
  local f=$1 out=$2 size siglen
  size=$(stat -c %s "$f")
  if [ "$size" -gt 40 ] && [ "$(tail -c 28 "$f")" = "~Module signature appended~" ]; then
    siglen=$(tail -c 32 "$f" | head -c 4 | od -An -tu1 | awk '{ print (($1 * 256 + $2) * 256 + $3) * 256 + $4 }')
    if [ "$siglen" -gt 0 ] && [ "$siglen" -lt "$size" ]; then
      head -c $((size - 28 - 12 - siglen)) "$f" > "$out"
      return
    fi
  fi
  cp "$f" "$out"
}
for f in "${mods[@]}"; do
  b=$(basename "$f")
  strip_sig "$f" "$root/lib/modules/$b"
  echo "$b" >> "$root/modules.list"
done
# Uncompressed: under TCG, gunzip in the guest costs more than copying.
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet --owner 0:0) > "$tmp/out.cpio"
mv -f "$tmp/out.cpio" "$out"
# Keep only the newest few archives.
ls -1t "$cache"/initramfs-*.cpio 2>/dev/null | tail -n +4 | xargs -r rm -f
echo "$out"
