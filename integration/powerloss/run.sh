#!/usr/bin/env bash
# Power-loss test of the snapshotter (see integration/powerloss/README.md).
#
#   integration/powerloss/run.sh [--rounds N] [--sync full|normal] [--seed N]
#                                [--crash-min SECONDS] [--crash-max SECONDS]
#                                [--mem MiB]
#
# Boots the VM harness N times on one persistent disk (run.sh --disk). Each
# boot runs powerloss-guest: the daemon starts on the disk's database and
# pool, checks what the earlier boots' acknowledged operations left, then
# runs a workload (Prepare + write, Commit, Remove, S3 pulls) until it resets
# the guest (sysrq b) at a random point, CRASH-MIN to CRASH-MAX seconds into
# the workload. A last boot only checks. The operations announced and
# acknowledged come to the host on the guest's stdout (a virtio serial port)
# and are kept in the run folder, so the crash cannot take them back.
#
# Prints each boot's check and a summary line
#   powerloss: sync=S rounds=N acked=A lost=L quarantined=Q quarantined_acked=QA violations=V
# and exits non-zero when a boot did not check (the daemon did not start, the
# guest failed) or did not end in the reset, and, with --sync full, when an
# acknowledged operation was lost or an invariant broke (pool devices !=
# database devices + quarantine, intent rows left). With --sync normal,
# losses and broken invariants are what the run measures: reported, not
# failed on.
set -euo pipefail
{ # Parsed whole before it runs: editing this file cannot upset running copies.

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd "$here/../.." && pwd -P)
rounds=10
syncmode=full
seed=${POWERLOSS_SEED:-$(date +%s)}
crash_min=2
crash_max=40
mem=2048
die() { echo "powerloss: $*" >&2; exit 2; }
isnum() { [[ $1 =~ ^[0-9]+$ ]]; }
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) isnum "${2:-}" && [ "$2" -ge 1 ] || die "--rounds needs a count >= 1, got '${2:-}'"; rounds=$2; shift 2 ;;
    --sync) case ${2:-} in full|normal) syncmode=$2 ;; *) die "--sync must be full or normal, got '${2:-}'" ;; esac; shift 2 ;;
    --seed) isnum "${2:-}" || die "--seed needs a number, got '${2:-}'"; seed=$2; shift 2 ;;
    --crash-min) isnum "${2:-}" || die "--crash-min needs seconds, got '${2:-}'"; crash_min=$2; shift 2 ;;
    --crash-max) isnum "${2:-}" || die "--crash-max needs seconds, got '${2:-}'"; crash_max=$2; shift 2 ;;
    --mem) isnum "${2:-}" || die "--mem needs MiB, got '${2:-}'"; mem=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
    *) die "unknown option '$1'" ;;
  esac
done
[ "$crash_max" -gt "$crash_min" ] || die "--crash-max ($crash_max) must be above --crash-min ($crash_min)"

cd "$repo"
# The run folder is in the repository: the guest reads the event log there.
work=$repo/.cache/powerloss/$syncmode-$$
rm -rf "$work"
mkdir -p "$work"
trap 'rm -f "$work/disk.img"' EXIT
guest=$work/powerloss-guest
CGO_ENABLED=1 ${GO:-go} build -tags "${BUILDTAGS:-sqlite_omit_load_extension osusergo netgo}" -o "$guest" ./integration/powerloss/cmd/powerloss-guest
events=$work/events.log
: > "$events"
RANDOM=$seed
echo "powerloss: sync=$syncmode rounds=$rounds seed=$seed crash point ${crash_min}-${crash_max}s into the workload; run folder $work" >&2

fail=0
for r in $(seq 1 $((rounds + 1))); do
  crash=0
  if [ "$r" -le "$rounds" ]; then
    crash=$(( crash_min * 1000 + (RANDOM * 32768 + RANDOM) % ((crash_max - crash_min) * 1000) ))
  fi
  out=$work/boot-$r.out
  set +e
  "$repo/integration/vm/run.sh" --mem "$mem" --timeout 900 --disk "$work/disk.img" -- \
    "$guest" -round "$r" -log "$events" -sync "$syncmode" -crash-after "${crash}ms" \
    > "$out" 2> "$work/boot-$r.err"
  rc=$?
  set -e
  grep '^PL ' "$out" >> "$events" || true
  acks=$(grep -c '^PL {"t":"ack"' "$out" || true)
  check=$(grep '^PL-CHECK ' "$out" || true)
  if [ -z "$check" ]; then
    echo "powerloss: boot $r produced no check (exit $rc); its stderr:" >&2
    tail -n 40 "$work/boot-$r.err" >&2
    fail=1
    break
  fi
  echo "${check#PL-CHECK } crash_after_ms=$crash acks_this_boot=$acks exit=$rc"
  grep -E '^PL-(LOST|VIOLATION) ' "$out" || true
  if [ "$crash" -gt 0 ] && [ $rc -ne 125 ]; then
    echo "powerloss: boot $r should have ended in the reset (exit 125), exit $rc; its stderr:" >&2
    tail -n 40 "$work/boot-$r.err" >&2
    fail=1
    break
  fi
  if [ "$crash" -eq 0 ] && [ $rc -ne 0 ] && [ "$syncmode" = full ]; then
    echo "powerloss: the last boot's checks failed (exit $rc)" >&2
    fail=1
  fi
done

# A loss stays lost: later boots report it again, so the totals count
# distinct PL-LOST and PL-VIOLATION lines.
cat "$work"/boot-*.out | sed -n 's/^\(PL-[A-Z]*\) round=[0-9]* /\1 /p' | sort -u > "$work/findings"
awk -v s="$syncmode" -v n="$rounds" -v findings="$work/findings" '
  /^PL-CHECK / { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    if (v["quarantined"] > q) q = v["quarantined"]; if (v["acked"] > acked) acked = v["acked"] }
  END { while ((getline line < findings) > 0) {
          if (line ~ /^PL-LOST /) { lost++; if (line ~ / of acknowledged .* quarantined/) qa++ }
          if (line ~ /^PL-VIOLATION /) viol++ }
        printf "powerloss: sync=%s rounds=%d acked=%d lost=%d quarantined=%d quarantined_acked=%d violations=%d\n", s, n, acked, lost, q, qa, viol
        if (s == "full" && (viol > 0 || lost > 0)) exit 1 }' "$work"/boot-*.out || fail=1
exit $fail
}
