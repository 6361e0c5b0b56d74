#!/usr/bin/env bash
# Cuts the Debian root filesystem of debootstrap.sh into layer tarballs laid
# out like the public example bucket, and prints the folder holding them:
#
#   <out>/images/debian/1.tar          base system (no usr/share/{doc,man,info})
#   <out>/images/debian/2.tar          usr/share/{doc,man,info}
#   <out>/images/debian/3.tar          OCI whiteouts over 1 and 2, flyio files
#   <out>/images/debian-dev/1.tar      byte for byte debian/1.tar
#   <out>/images/debian-dev/2.tar      byte for byte debian/2.tar
#   <out>/images/debian-dev/3.tar      other whiteouts, other flyio files
#   <out>/images/debian-rootfs/1.tar   byte for byte debian/1.tar
#   <out>/images/debian-rootfs/2.tar   byte for byte debian/2.tar
#   <out>/images/debian-rootfs/3.tar   whiteouts + flyio files under a
#                                      top-level rootfs/ (docs/images.md)
#   <out>/SHA256SUMS                   sha256sum of every tarball
#
# <out> is <repo>/.cache/e2e/image-<hash>, <hash> covering this script and
# the root filesystem's folder (itself keyed by debootstrap.sh), so the
# layers are cut once per change. Every tarball is deterministic (sorted
# names, one fixed mtime, numeric owners, no atime/ctime/xattrs): the
# families' shared layers are built separately and compared with cmp.
# (The rootfs/ family shares the lower layers too, so that a run pulls the
# 100 MiB base once: under emulation every extra copy costs minutes.)
# setuid/setgid bits are dropped (the extraction policy refuses them) and
# /dev is empty (no device nodes), as in container images.
#
# What the top layers do (integration/e2e's dm test checks each of these in
# a running container):
#   debian/3.tar:        usr/share/.wh.man (a folder of 2.tar), etc/.wh.motd
#                        (a file of 1.tar), usr/share/doc/.wh.apt,
#                        usr/share/info/.wh..wh..opq (opaque: 2.tar's info
#                        files hidden, flyio.info kept)
#   debian-dev/3.tar:    etc/.wh.issue.net, usr/share/.wh.info
#   debian-rootfs/3.tar: rootfs/etc/.wh.motd, rootfs/usr/share/doc/.wh.bash
# and each adds /etc/flyio-release (FLYIO_FAMILY=<family>) and
# /usr/local/bin/flyio-hello (prints what a user would look at).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd "$here/../.." && pwd -P)
rootfs=$("$here/debootstrap.sh")
hash=$( { sha256sum "${BASH_SOURCE[0]}"; echo "$rootfs"; } | sha256sum | cut -c1-12)
cache=$repo/.cache/e2e
out=$cache/image-$hash
if [ -d "$out/images" ]; then echo "$out"; exit 0; fi
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.image.XXXXXX")
trap 'rm -rf --one-file-system "$tmp"' EXIT
start=$(date +%s)

# mktar OUT DIR: a deterministic tarball of DIR's contents (names without
# a leading ./, in byte order).
mktar() {
  local out=$1 dir=$2 names
  mapfile -t names < <(cd "$dir" && LC_ALL=C ls -A)
  LC_ALL=C tar --create --file="$out" --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --sort=name --mtime=@1700000000 --numeric-owner --mode=u-s,g-s \
    --no-acls --no-xattrs --no-selinux -C "$dir" -- "${names[@]}"
}

# stage DIR PATH...: DIR gets PATH (relative to the rootfs) with its parent
# folders, hard-linked (files) or copied (folders, with their modes).
stage() {
  local dir=$1 p; shift
  for p in "$@"; do
    mkdir -p "$dir/$(dirname "$p")"
    cp -al "$rootfs/$p" "$dir/$p"
  done
  copyparents "$dir"
}

# copyparents DIR: every folder of DIR takes the mode and owner of the
# rootfs's folder of the same name.
copyparents() {
  local dir=$1 d
  while IFS= read -r d; do
    [ -d "$rootfs/$d" ] && chmod --reference="$rootfs/$d" "$dir/$d" && chown --reference="$rootfs/$d" "$dir/$d"
  done < <(cd "$dir" && find . -type d)
}

# base DIR: the whole rootfs minus documentation and /dev's nodes.
base() {
  local dir=$1
  mkdir -p "$dir"
  cp -al "$rootfs/." "$dir/"
  rm -rf "$dir/usr/share/doc" "$dir/usr/share/man" "$dir/usr/share/info"
  find "$dir/dev" -mindepth 1 -delete
}

# docs DIR: documentation folders only.
docs() { stage "$1" usr/share/doc usr/share/man usr/share/info; }

# whiteout DIR PATH: an OCI whiteout hiding PATH of a lower layer.
whiteout() {
  local dir=$1 p=$2
  mkdir -p "$dir/$(dirname "$p")"
  : > "$dir/$(dirname "$p")/.wh.$(basename "$p")"
  chmod 0644 "$dir/$(dirname "$p")/.wh.$(basename "$p")"
}

# flyio DIR FAMILY: the files every family's top layer adds.
flyio() {
  local dir=$1 family=$2
  mkdir -p "$dir/etc" "$dir/usr/local/bin"
  printf 'FLYIO_FAMILY=%s\nFLYIO_SOURCE=s3\n' "$family" > "$dir/etc/flyio-release"
  cat > "$dir/usr/local/bin/flyio-hello" <<'SCRIPT'
#!/bin/sh
# Prints what shows that the image's layers and whiteouts took effect.
. /etc/os-release
. /etc/flyio-release
echo "hello from $PRETTY_NAME, family $FLYIO_FAMILY"
for p in /etc/motd /etc/issue.net /usr/share/man /usr/share/doc/apt /usr/share/info/sed.info.gz /usr/share/info/flyio.info /usr/share/doc/bash; do
  if [ -e "$p" ]; then echo "present: $p"; else echo "absent:  $p"; fi
done
echo "files in /usr: $(find /usr -xdev | wc -l)"
SCRIPT
  chmod 0755 "$dir/usr/local/bin/flyio-hello"
  copyparents "$dir"
}

# rootfsdir DIR: DIR's contents moved under DIR/rootfs (mode 0755, root).
rootfsdir() {
  local dir=$1
  mkdir "$dir.r" && mv "$dir" "$dir.r/rootfs" && mv "$dir.r" "$dir"
  chmod 0755 "$dir/rootfs"
}

img=$tmp/images
mkdir -p "$img/debian" "$img/debian-dev" "$img/debian-rootfs"
s=$tmp/stage

# debian: 1 base, 2 docs, 3 whiteouts.
base "$s/d1"; mktar "$img/debian/1.tar" "$s/d1"
docs "$s/d2"; mktar "$img/debian/2.tar" "$s/d2"
mkdir -p "$s/d3"
whiteout "$s/d3" usr/share/man
whiteout "$s/d3" etc/motd
whiteout "$s/d3" usr/share/doc/apt
mkdir -p "$s/d3/usr/share/info"
: > "$s/d3/usr/share/info/.wh..wh..opq"
echo "flyio e2e info page" > "$s/d3/usr/share/info/flyio.info"
flyio "$s/d3" debian
mktar "$img/debian/3.tar" "$s/d3"

# debian-dev and debian-rootfs: 1 and 2 cut again from fresh staging
# folders (so cmp checks determinism, not a copy), 3 their own.
for fam in debian-dev debian-rootfs; do
  rm -rf "$s/e1" "$s/e2"
  base "$s/e1"; mktar "$img/$fam/1.tar" "$s/e1"
  docs "$s/e2"; mktar "$img/$fam/2.tar" "$s/e2"
  for n in 1 2; do
    cmp "$img/debian/$n.tar" "$img/$fam/$n.tar" ||
      { echo "mkimage.sh: layer $n differs between debian and $fam: tar output is not deterministic" >&2; exit 1; }
  done
done
mkdir -p "$s/e3"
whiteout "$s/e3" etc/issue.net
whiteout "$s/e3" usr/share/info
flyio "$s/e3" debian-dev
mktar "$img/debian-dev/3.tar" "$s/e3"

# debian-rootfs/3.tar: the layer under a top-level rootfs/ folder, which
# extraction strips (docs/images.md).
mkdir -p "$s/r3"
whiteout "$s/r3" etc/motd
whiteout "$s/r3" usr/share/doc/bash
flyio "$s/r3" debian-rootfs
rootfsdir "$s/r3"; mktar "$img/debian-rootfs/3.tar" "$s/r3"

rm -rf --one-file-system "$s"
# The digests, for readers that should not hash 700 MiB again (the VM).
(cd "$tmp" && find images -name '*.tar' | LC_ALL=C sort | xargs sha256sum > SHA256SUMS)
mv "$tmp" "$out"
trap - EXIT
for old in "$cache"/image-*; do
  [ "$old" = "$out" ] || rm -rf --one-file-system "$old"
done
echo "mkimage: layers cut in $(( $(date +%s) - start ))s:" >&2
(cd "$out" && find images -name '*.tar' | LC_ALL=C sort | while read -r f; do
   printf '  %-26s %5s MiB  sha256 %.12s\n' "$f" "$(( $(stat -c %s "$f") >> 20 ))" "$(sha256sum "$f")"; done) >&2
echo "$out"
