#!/usr/bin/env bash
# Makes (once) the Debian bookworm minbase root filesystem the end-to-end
# image is cut from, with debootstrap from deb.debian.org, and prints its
# folder: <repo>/.cache/e2e/rootfs-<hash>, <hash> being this script's
# SHA-256 (change the script and a new tree is made; the newest is kept).
# Needs root and debootstrap (scripts/install-deps.sh). Takes a few minutes
# (6 min here, mostly downloads); later calls return at once.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd "$here/../.." && pwd -P)
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
hash=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)
cache=$repo/.cache/e2e
out=$cache/rootfs-$hash
if [ -d "$out" ]; then echo "$out"; exit 0; fi
[ "$(id -u)" -eq 0 ] || { echo "debootstrap.sh: needs root (debootstrap chroots and chowns)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "debootstrap.sh: debootstrap not installed: run scripts/install-deps.sh" >&2; exit 1; }
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.rootfs.XXXXXX")
trap 'rm -rf --one-file-system "$tmp"' EXIT
start=$(date +%s)
echo "debootstrap: --variant=minbase $suite from $mirror (log: $tmp.log)" >&2
if ! debootstrap --variant=minbase "$suite" "$tmp/rootfs" "$mirror" > "$tmp.log" 2>&1; then
  tail -20 "$tmp.log" >&2
  echo "debootstrap.sh: debootstrap failed (full log $tmp.log)" >&2
  exit 1
fi
# Leave only what an image needs: the apt caches and lists are what
# image builders delete; the host's resolver and hostname are not ours.
rm -rf "$tmp/rootfs"/var/cache/apt/*.bin "$tmp/rootfs"/var/cache/apt/archives/*.deb \
       "$tmp/rootfs"/var/lib/apt/lists/* "$tmp/rootfs"/var/log/*.log "$tmp/rootfs"/var/log/apt/*
: > "$tmp/rootfs/etc/resolv.conf"
echo flyio-e2e > "$tmp/rootfs/etc/hostname"
mv "$tmp/rootfs" "$out"
rm -f "$tmp.log"
# Keep only the newest tree.
for old in "$cache"/rootfs-*; do
  [ "$old" = "$out" ] || rm -rf --one-file-system "$old"
done
echo "debootstrap: done in $(( $(date +%s) - start ))s: $out ($(du -sh "$out" | cut -f1))" >&2
echo "$out"
