#!/usr/bin/env bash
# Runs every test of the repository that needs the VM harness (what `make
# test` and `make vmtest` run after the host's part): the device-mapper test
# packages (suite.sh, two VM lanes) and the power-loss rounds
# (integration/powerloss/run.sh, a third VM), side by side.
#
#   integration/vm/all.sh [--powerloss-rounds N]
#
# The power-loss run keeps about 1.2 of a 2-core host's cores busy (its
# guest boots again after each reset, and waits for the disk), the suite's
# two lanes about 1.8: run one after the other, the host sat partly idle
# for the power-loss run's minute and a half. Each line of the power-loss
# run carries "[powerloss] ", as the lanes' carry their lane. Ends with one
# line giving both exit codes, preceded, when the power-loss run failed, by
# its last lines; exits non-zero when either failed.
set -euo pipefail
{ # Parsed whole before it runs: editing this file cannot upset running copies.

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
rounds=3
while [ $# -gt 0 ]; do
  case $1 in
    --powerloss-rounds) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "all: --powerloss-rounds needs a count, got '${2:-}'" >&2; exit 2; }
      rounds=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
    *) echo "all: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

tmp=$(mktemp -d /tmp/flyio-vmtests.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
{ set +e; "$here/../powerloss/run.sh" --rounds "$rounds" 2>&1; echo $? > "$tmp/rc"; } |
  tee "$tmp/log" | sed -u 's/^/[powerloss] /' &
plpid=$! # the pipeline's last command: it ends after the run and its log
set +e
"$here/suite.sh"
src=$?
set -e
wait "$plpid" || true
prc=$(cat "$tmp/rc" 2>/dev/null || echo "none (it did not finish)")
log=$tmp/log
if [ "$prc" != 0 ]; then
  echo
  echo "power loss (exit $prc), its last lines:"
  tail -n 25 "$log" | sed 's/^/  /'
fi
echo "vm tests: suite exit $src, power loss ($rounds rounds) exit $prc"
[ "$src" -eq 0 ] && [ "$prc" = 0 ]
exit
}
