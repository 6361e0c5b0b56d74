#!/usr/bin/env bash
# Smoke check of the VM harness, run inside it:
#   integration/vm/run.sh -- integration/vm/smoke.sh
# Builds a thin pool on two sparse loop-backed files in $VM_SCRATCH with
# dmsetup, creates a thin device, makes ext4 on it, mounts it, writes a file,
# remounts and reads it back byte for byte, checks the pool's status line, and
# tears everything down. Exits non-zero at the first step that fails.
set -euo pipefail
: "${VM_SCRATCH:?VM_SCRATCH unset: run me through integration/vm/run.sh}"

step() { echo "smoke: $*"; }
dir=$(mktemp -d "$VM_SCRATCH/smoke.XXXXXX")
pool=vmsmoke-$$-pool
thin=vmsmoke-$$-thin1
meta_loop= data_loop=
cleanup() {
  set +e
  mountpoint -q "$dir/mnt" && umount "$dir/mnt"
  dmsetup info "$thin" >/dev/null 2>&1 && dmsetup remove "$thin"
  dmsetup info "$pool" >/dev/null 2>&1 && dmsetup remove "$pool"
  [ -n "$data_loop" ] && losetup -d "$data_loop"
  [ -n "$meta_loop" ] && losetup -d "$meta_loop"
  rm -rf "$dir"
}
trap cleanup EXIT

step "kernel $(uname -r), $(dmsetup version | tr '\n' ' ')"
truncate -s 64M "$dir/meta"
truncate -s 512M "$dir/data"
meta_loop=$(losetup -f --show "$dir/meta")
data_loop=$(losetup -f --show "$dir/data")
step "loops: metadata $meta_loop data $data_loop"

sectors=$(blockdev --getsz "$data_loop")
# 128 sectors = 64 KiB blocks, low-water mark 1024 blocks, zeroing skipped.
dmsetup create "$pool" --table "0 $sectors thin-pool $meta_loop $data_loop 128 1024 1 skip_block_zeroing"
dmsetup message "$pool" 0 "create_thin 1"
dmsetup create "$thin" --table "0 524288 thin /dev/mapper/$pool 1"
[ -b "/dev/mapper/$thin" ] || { echo "smoke: /dev/mapper/$thin missing" >&2; exit 1; }
step "pool $pool and thin device $thin (256 MiB) active"

mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "/dev/mapper/$thin"
mkdir "$dir/mnt"
mount -t ext4 "/dev/mapper/$thin" "$dir/mnt"
head -c 4M /dev/urandom > "$dir/payload"
cp "$dir/payload" "$dir/mnt/payload"
umount "$dir/mnt"
mount -t ext4 -o ro "/dev/mapper/$thin" "$dir/mnt"
cmp "$dir/payload" "$dir/mnt/payload"
step "ext4 on the thin device: 4 MiB written, remounted, read back identical"
umount "$dir/mnt"

# thin-pool status: <transaction id> <used meta>/<total meta> <used data>/<total data> ...
status=$(dmsetup status "$pool")
step "pool status: $status"
read -r _ _ target _ _ data_used_total _ <<<"$status"
[ "$target" = thin-pool ] || { echo "smoke: unexpected target '$target'" >&2; exit 1; }
used=${data_used_total%/*}
[ "$used" -gt 0 ] || { echo "smoke: pool reports no data blocks used" >&2; exit 1; }
thin_status=$(dmsetup status "$thin")
step "thin status: $thin_status"

dmsetup remove "$thin"
dmsetup message "$pool" 0 "delete 1"
dmsetup remove "$pool"
step "OK"
