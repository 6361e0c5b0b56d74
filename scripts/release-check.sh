#!/usr/bin/env bash
# Checks the release binaries `make release` wrote, the way a user on each
# platform would find them: usage: release-check.sh DIST VERSION COMMIT ARCH...
#
# For each ARCH (Go's name: amd64, arm64), dist/containerd-flyio-snapshotter-linux-ARCH
# and dist/flyioctl-linux-ARCH must be statically linked (they run on any
# glibc, or none), match SHA256SUMS, carry no fault-injection hook, and run:
# natively when ARCH is the host's, otherwise under qemu-user (qemu-aarch64,
# qemu-x86_64). --version must name VERSION, COMMIT and linux/ARCH (and the
# SQLite compiled into the daemon's binary); the daemon's validate must
# accept a small gzip layer with the diff ID sha256sum computes, and reject
# a tar with an absolute name (exit 1); flyioctl must list its subcommands.
set -euo pipefail

usage() { echo "usage: $0 DIST VERSION COMMIT ARCH..." >&2; exit 2; }
[ $# -ge 4 ] || usage
dist=$1 version=$2 commit=$3
shift 3
bin=containerd-flyio-snapshotter

fail() { echo "release-check: $*" >&2; exit 1; }

(cd "$dist" && sha256sum --check --quiet SHA256SUMS) || fail "$dist/SHA256SUMS does not match the binaries"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/layer/rootfs/etc"
echo flyio >"$tmp/layer/rootfs/etc/hostname"
tar --create --format=posix --owner=0 --group=0 --file "$tmp/good.tar" -C "$tmp/layer" rootfs
gzip -n -k "$tmp/good.tar"
diff_id="sha256:$(sha256sum <"$tmp/good.tar" | cut -d' ' -f1)"
# --absolute-names keeps the leading '/', which the extraction policy refuses.
tar --create --format=posix --absolute-names --file "$tmp/bad.tar" "$tmp/layer/rootfs/etc/hostname" 2>/dev/null

host=$(uname -m)
for arch in "$@"; do
  case $arch in
    amd64) machine=x86_64 ;;
    arm64) machine=aarch64 ;;
    *) fail "unknown ARCH $arch (want amd64 or arm64)" ;;
  esac
  # runner EXE: the command line that runs EXE here, after checking what
  # every release binary must be.
  runner() {
    local exe=$1
    [ -x "$exe" ] || fail "$exe is missing (run make release)"
    local info
    info=$(file -L "$exe")
    case $info in
      *"statically linked"*) ;;
      *) fail "$exe is not statically linked: $info" ;;
    esac
    # Fault injection lives only in the dm test binaries (see make binary-check).
    if grep -aq FLYIO_FAULT "$exe"; then fail "$exe carries a fault-injection variable (FLYIO_FAULT_*)"; fi
    run=("$exe")
    if [ "$machine" != "$host" ]; then
      command -v "qemu-$machine" >/dev/null || fail "qemu-$machine not found: install qemu-user (scripts/install-deps.sh)"
      run=("qemu-$machine" "$exe")
    fi
  }

  ctl=$dist/flyioctl-linux-$arch
  runner "$ctl"
  got=$("${run[@]}" --version) || fail "$arch: flyioctl --version failed: $got"
  case $got in
    "flyioctl $version (commit $commit, go"*", linux/$arch)") ;;
    *) fail "$arch: flyioctl --version printed '$got'; want 'flyioctl $version (commit $commit, go..., linux/$arch)'" ;;
  esac
  got=$("${run[@]}" --help) || fail "$arch: flyioctl --help failed: $got"
  for sub in pull activate rm version; do
    grep -q "^  $sub " <<<"$got" || fail "$arch: flyioctl --help does not list $sub: $got"
  done
  echo "release-check: $ctl: static, --version and --help ok${run[1]:+ (under ${run[0]})}"

  exe=$dist/$bin-linux-$arch
  runner "$exe"

  got=$("${run[@]}" --version) || fail "$arch: --version failed: $got"
  case $got in
    "$bin $version (commit $commit, go"*", SQLite 3."*", linux/$arch)") ;;
    *) fail "$arch: --version printed '$got'; want '$bin $version (commit $commit, go..., SQLite 3..., linux/$arch)'" ;;
  esac

  got=$("${run[@]}" validate "$tmp/good.tar.gz" 2>&1) || fail "$arch: validate refused a good layer: $got"
  case $got in
    *": ok: "*"gzip, diff ID $diff_id") ;;
    *) fail "$arch: validate printed '$got'; want ok, gzip and diff ID $diff_id" ;;
  esac
  got=$("${run[@]}" validate "$tmp/bad.tar" 2>&1) && code=0 || code=$?
  if [ "$code" -ne 1 ] || [[ $got != *"absolute"* ]]; then
    fail "$arch: validate of a tar with an absolute name exited $code: $got; want 1 naming the rule"
  fi
  echo "release-check: $exe: static, --version and validate ok${run[1]:+ (under ${run[0]})}"
done
