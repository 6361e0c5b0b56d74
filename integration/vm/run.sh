#!/usr/bin/env bash
# Runs a command against real device-mapper (see integration/vm/README.md).
#
#   integration/vm/run.sh [--mem MiB] [--timeout SECONDS] [--cpus N]
#                         [--env NAME[=VALUE]]... [--vm] [--console]
#                         [--disk FILE [--disk-size MiB]] -- CMD ARGS...
#
# On a host whose /dev/mapper/control works, CMD runs directly. Otherwise it
# runs as root in a QEMU (TCG) VM booting the host's Debian kernel: the host's
# root filesystem is the guest's root (9p, read-only, with a tmpfs overlay so
# writes succeed but stay in the guest), the repository is shared read-write
# at the same absolute path, cwd is the caller's cwd. CMD's stdout and stderr
# are streamed to ours; its exit status is ours. A timeout exits 124, a guest
# that never reports a status (panic, init failure) exits 125; both print the
# tail of the guest console.
#
# In CMD's environment: VM_SCRATCH (an empty tmpfs folder for loop files and
# mounts), VM_GUEST=1 inside the VM (0 when run directly), DM_DISABLE_UDEV=1
# inside the VM, plus PATH, HOME, USER, LANG, TERM, every GO* variable and
# every --env variable of the caller.
#
# --disk FILE attaches FILE (a raw image on the host, made sparse with
# --disk-size MiB, default 2048, when missing) to the VM as a virtio disk,
# formatted ext4 on first use and mounted at $VM_DISK: it outlives the VM, so
# a later run on the same FILE sees what the guest had written to it. A guest
# that crashes (echo b > /proc/sysrq-trigger) loses only what it had not yet
# written to the disk, as a machine loses its page cache. --disk implies --vm.
set -euo pipefail
{ # Parsed whole before it runs: editing this file cannot upset running copies.

tstart=$(date +%s.%N)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd "$here/../.." && pwd -P)

mem=${VM_MEM:-4096}
timeout=${VM_TIMEOUT:-900}
cpus=${VM_CPUS:-2}
force_vm=${VM_FORCE:-0}
show_console=0
envs=()
disk=
disk_mb=2048

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2
  exit 2
}
die() { echo "vm: $*" >&2; exit 2; }
isnum() { [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -gt 0 ]; }

while [ $# -gt 0 ]; do
  case $1 in
    --mem) isnum "${2:-}" || die "--mem needs MiB, got '${2:-}'"; mem=$2; shift 2 ;;
    --timeout) isnum "${2:-}" || die "--timeout needs seconds, got '${2:-}'"; timeout=$2; shift 2 ;;
    --cpus) isnum "${2:-}" || die "--cpus needs a count, got '${2:-}'"; cpus=$2; shift 2 ;;
    --env) [ -n "${2:-}" ] || die "--env needs NAME or NAME=VALUE"; envs+=("$2"); shift 2 ;;
    --vm) force_vm=1; shift ;;
    --console) show_console=1; shift ;;
    --disk) [ -n "${2:-}" ] || die "--disk needs a file"; disk=$2; force_vm=1; shift 2 ;;
    --disk-size) isnum "${2:-}" || die "--disk-size needs MiB, got '${2:-}'"; disk_mb=$2; shift 2 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) die "unknown option '$1' (the command goes after --)" ;;
  esac
done
[ $# -gt 0 ] || usage

# Environment passed to CMD (both modes): name=value lines.
pass_env() {
  local n
  for n in PATH HOME USER LANG TERM $(compgen -e | grep '^GO' || true); do
    [ -n "${!n+x}" ] && printf '%s=%s\0' "$n" "${!n}"
  done
  for n in "${envs[@]}"; do
    case $n in
      *=*) printf '%s\0' "$n" ;;
      *) [ -n "${!n+x}" ] && printf '%s=%s\0' "$n" "${!n}" ;;
    esac
  done
  return 0
}

host_has_dm() {
  [ -c /dev/mapper/control ] && command -v dmsetup >/dev/null &&
    dmsetup version 2>/dev/null | grep '^Driver version' >/dev/null
}

# ---------------------------------------------------------------- direct mode
if [ "$force_vm" != 1 ] && host_has_dm; then
  base=/dev/shm; [ -w "$base" ] || base=${TMPDIR:-/tmp}
  scratch=$(mktemp -d "$base/vm-scratch.XXXXXX")
  trap 'rm -rf --one-file-system "$scratch"' EXIT
  declare -a kv=()
  while IFS= read -r -d '' e; do kv+=("$e"); done < <(pass_env)
  set +e
  timeout -k 10 "$timeout" env "${kv[@]}" VM_SCRATCH="$scratch" VM_GUEST=0 "$@"
  rc=$?
  set -e
  [ $rc -eq 124 ] && echo "vm: timeout after ${timeout}s (direct mode): $*" >&2
  exit $rc
fi

# -------------------------------------------------------------------- VM mode
for t in qemu-system-x86_64 timeout; do
  command -v $t >/dev/null || die "$t missing: run scripts/install-deps.sh"
done
kver=$(cd /boot && ls -1 vmlinuz-* 2>/dev/null | sed 's/^vmlinuz-//' | sort -V |
       while read -r v; do [ -d "/lib/modules/$v" ] && echo "$v"; done | tail -n1 || true)
[ -n "$kver" ] || die "no /boot/vmlinuz-* with matching /lib/modules: run scripts/install-deps.sh"
kernel=/boot/vmlinuz-$kver
[ -r "$kernel" ] || die "$kernel not readable"

cache=$repo/.cache/vm
initrd=$("$here/mkinitramfs.sh" "$kver" "$cache") || die "initramfs build failed"

# The bzImage decompresses itself in the guest, which under TCG costs several
# seconds per boot. When the kernel supports PVH entry, hand QEMU the
# uncompressed ELF instead, extracted once and cached (keyed by version, size
# and mtime of the bzImage).
pvh_kernel() {
  local out tmp magic tool off
  grep -q '^CONFIG_PVH=y' "/boot/config-$kver" 2>/dev/null || return 1
  out=$cache/vmlinux-$kver-$(stat -c %s-%Y "$kernel")
  if [ ! -s "$out" ]; then
    mkdir -p "$cache"
    tmp=$(mktemp "$out.XXXXXX")
    for magic in 'fd377a585a00:xz' '1f8b08:gzip' '28b52ffd:zstd'; do
      tool=${magic#*:}; magic=${magic%%:*}
      command -v "$tool" >/dev/null || continue
      off=$(LC_ALL=C grep -obUaP "$(sed 's/../\\x&/g' <<<"$magic")" "$kernel" | head -n1 | cut -d: -f1)
      [ -n "$off" ] || continue
      tail -c +$((off + 1)) "$kernel" | "$tool" -dc > "$tmp" 2>/dev/null || true
      if [ "$(head -c 4 "$tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
        mv -f "$tmp" "$out"
        break
      fi
    done
    rm -f "$tmp"
    ls -1t "$cache"/vmlinux-* 2>/dev/null | tail -n +3 | xargs -r rm -f
  fi
  [ -s "$out" ] && echo "$out"
}
kernel=$(pvh_kernel) || kernel=/boot/vmlinuz-$kver

drive=()
if [ -n "$disk" ]; then
  if [ ! -e "$disk" ]; then
    mkdir -p "$(dirname "$disk")"
    truncate -s "${disk_mb}M" "$disk" || die "cannot create disk image $disk"
  fi
  [ -f "$disk" ] && [ -w "$disk" ] || die "disk image $disk is not a writable regular file"
  # cache=writeback: what the guest wrote reaches the host's page cache at
  # once and survives the guest, whose own page cache is what a crash loses.
  # No other QEMU may use the file at the same time (QEMU's image lock).
  drive=(-drive "file=$disk,if=none,id=vmdisk,format=raw,cache=writeback,discard=unmap"
         -device "virtio-blk-pci,drive=vmdisk,serial=vmdisk")
fi

run=$(mktemp -d "${TMPDIR:-/tmp}/vmrun.XXXXXX")
qpid=
cleanup() {
  [ -n "$qpid" ] && kill "$qpid" 2>/dev/null || true
  rm -rf "$run"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir "$run/io"
tmp_mb=$(( mem * 3 / 4 )); [ $tmp_mb -ge 2048 ] || tmp_mb=2048

{
  printf 'VM_REPO=%q\nVM_TMP_MB=%q\n' "$repo" "$tmp_mb"
  [ -z "${VM_PRELOAD+x}" ] || printf 'VM_PRELOAD=%q\n' "$VM_PRELOAD"
  [ -z "$disk" ] || printf 'VM_HAS_DISK=1\n'
} > "$run/io/config"
{
  echo '# generated by integration/vm/run.sh'
  while IFS= read -r -d '' e; do printf 'export %q\n' "$e"; done < <(pass_env)
  echo 'export VM_SCRATCH=/tmp/vm-scratch VM_GUEST=1 DM_DISABLE_UDEV=1'
  [ -z "$disk" ] || echo 'export VM_DISK=/mnt/vm-disk'
  printf 'cd %q || exit 126\n' "$PWD"
  printf 'exec'; printf ' %q' "$@"; printf '\n'
} > "$run/io/job"

# CMD's output reaches us through FIFOs (works whatever our stdout is).
mkfifo "$run/stdout" "$run/stderr"
cat "$run/stdout" &
cat_out=$!
cat "$run/stderr" >&2 &
cat_err=$!
console=$run/console.log
serial=$console
tee_pid=
if [ $show_console = 1 ]; then
  serial=$run/console.fifo
  mkfifo "$serial"
  tee "$console" < "$serial" >&2 &
  tee_pid=$!
fi

# The guest's CPU model: x86-64 with SSE4.2 and POPCNT but no AVX, AVX2 or
# SHA extensions. Under TCG those are emulated one helper call per
# instruction, and Go picks them for hashing and copying whenever the CPU
# offers them: with -cpu max, the end-to-end test took about 1.6 times as
# long (integration/vm/README.md). The kernel's and tools' own work
# (thinpool's tests) takes the same time with either model.
qemu_cpu=${VM_QEMU_CPU:-qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt}

# Each of these saves boot time under TCG: pci=noacpi (ACPI PCI interrupt
# links cost ~0.5 s each), cryptomgr.notests (crypto self-tests, ~2 s),
# zswap.enabled=0, audit=0, apparmor=0 (nothing in the guest uses them),
# mitigations=off (a throwaway test guest). init_on_alloc=0 leaves the
# kernel's own allocations unzeroed (Debian's kernel zeroes them all, a
# hardening a throwaway guest does without; pages a process maps are
# zeroed either way): the end-to-end test took 96 s and 97 s with it
# against 103 s and 100 s without, taking turns (suite.sh integration/e2e).
append="console=ttyS0 quiet panic=-1 oops=panic pci=noacpi cryptomgr.notests zswap.enabled=0 audit=0 apparmor=0 mitigations=off init_on_alloc=0 rdinit=/init ${VM_KERNEL_ARGS:-}"
tr=pci   # virtio transport of the pc machine
t0=$(date +%s.%N)
set +e
timeout -k 5 "$timeout" qemu-system-x86_64 -M pc \
  -accel tcg,thread=multi -cpu "$qemu_cpu" -smp "$cpus" -m "$mem" \
  -nodefaults -no-user-config -display none -vga none -net none -no-reboot \
  -serial "file:$serial" \
  -kernel "$kernel" -initrd "$initrd" -append "$append" \
  -device virtio-rng-$tr \
  -fsdev "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap" \
  -device "virtio-9p-$tr,fsdev=hostroot,mount_tag=hostroot" \
  -fsdev "local,id=repo,path=$repo,security_model=none,multidevs=remap" \
  -device "virtio-9p-$tr,fsdev=repo,mount_tag=repo" \
  -fsdev "local,id=vmio,path=$run/io,security_model=none" \
  -device "virtio-9p-$tr,fsdev=vmio,mount_tag=vmio" \
  -device virtio-serial-$tr,id=vser \
  -chardev "file,id=cout,path=$run/stdout" -device virtserialport,bus=vser.0,chardev=cout,name=stdout \
  -chardev "file,id=cerr,path=$run/stderr" -device virtserialport,bus=vser.0,chardev=cerr,name=stderr \
  "${drive[@]}" </dev/null &
qpid=$!
wait $qpid
qrc=$?
qpid=
set -e
t1=$(date +%s.%N)
# Unblock the readers if QEMU never opened the FIFOs, then let them drain.
exec 3<>"$run/stdout" 4<>"$run/stderr"
exec 3>&- 4>&-
if [ -n "$tee_pid" ]; then exec 3<>"$serial"; exec 3>&-; fi
wait $cat_out $cat_err $tee_pid 2>/dev/null || true

if [ -n "${VM_TIMING:-}" ] && [ -s "$run/io/t_start" ]; then
  awk -v a="$(cat "$run/io/t_start")" -v b="$(cat "$run/io/t_end" 2>/dev/null || echo 0)" \
      -v ts="$tstart" -v t0="$t0" -v t1="$t1" -v t2="$(date +%s.%N)" 'BEGIN {
        printf "vm: timing: setup %.2fs, qemu %.2fs (guest uptime at command start %.2fs, command %.2fs, outside guest uptime %.2fs), total %.2fs\n",
          t0 - ts, t1 - t0, a, b - a, (t1 - t0) - b, t2 - ts }' >&2
fi

if [ -s "$run/io/status" ]; then
  exit "$(cat "$run/io/status")"
fi
if [ $qrc -eq 124 ] || [ $qrc -eq 137 ]; then
  echo "vm: timeout after ${timeout}s running: $*" >&2
  code=124
else
  echo "vm: guest ended without an exit status (qemu exit $qrc; kernel panic or init failure?) running: $*" >&2
  code=125
fi
echo "vm: ---- guest console (last 60 lines) ----" >&2
tail -n 60 "$console" >&2
echo "vm: ---- end of guest console ----" >&2
exit $code
exit
}
