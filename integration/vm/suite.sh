#!/usr/bin/env bash
# Runs every device-mapper test of the repository in one VM boot (what
# `make vmtest` runs; see integration/vm/README.md).
#
#   integration/vm/suite.sh [--mem MiB] [--timeout SECONDS] [--cpus N] [--vm] [PKGDIR...]
#
# Finds every package with `//go:build dm` test files (or only the PKGDIRs
# given), builds each on the host with
#   go test -c -tags 'dm $BUILDTAGS' -o .cache/vmbin/<name>.test ./<pkg>
# then, through integration/vm/run.sh (one boot), runs each binary with cwd =
# its package folder and its own empty $VM_SCRATCH:
#   tests:      <bin> -test.v -test.timeout 20m [args of <pkg>/testdata/vm-test-args]
#   benchmarks: <bin> -test.run '^$' -test.bench . -test.benchtime 1x
#                     [args of <pkg>/testdata/vm-bench-args]
#   (benchmarks only when the package's test files declare a Benchmark func;
#   a vm-bench-args file containing just "skip" turns them off).
# Prints a summary per binary (PASS/FAIL, wall time) ending with
# "N passed, N failed"; exits non-zero if any failed or none ran.
set -euo pipefail
{ # Parsed whole before it runs: editing this file cannot upset running copies.

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd "$here/../.." && pwd -P)
cd "$repo"
GO=${GO:-go}
BUILDTAGS=${BUILDTAGS:-sqlite_omit_load_extension osusergo netgo}
runargs=()
pkgs=()
while [ $# -gt 0 ]; do
  case $1 in
    --mem|--timeout|--cpus) runargs+=("$1" "${2:-}"); shift 2 ;;
    --vm|--console) runargs+=("$1"); shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$here/suite.sh" >&2; exit 2 ;;
    -*) echo "suite: unknown option '$1'" >&2; exit 2 ;;
    *) d=${1#./}; d=${d%/}; pkgs+=("$d"); shift ;;
  esac
done
# The whole suite gets a generous VM timeout unless the caller set one.
case " ${runargs[*]-} " in *" --timeout "*) ;; *) runargs+=(--timeout "${VM_SUITE_TIMEOUT:-3600}") ;; esac

if [ ${#pkgs[@]} -eq 0 ]; then
  mapfile -t pkgs < <(
    grep -rlE --include='*_test.go' --exclude-dir=.git --exclude-dir=.cache --exclude-dir=vendor \
      '^//go:build.*[^!A-Za-z0-9_]dm([^A-Za-z0-9_]|$)' . |
      xargs -r -n1 dirname | sed 's|^\./||' | LC_ALL=C sort -u)
fi
if [ ${#pkgs[@]} -eq 0 ]; then
  echo "suite: no package has //go:build dm test files: nothing ran" >&2
  exit 1
fi

bindir=.cache/vmbin
mkdir -p "$bindir"
work=$(mktemp -d "$bindir/.suite.XXXXXX")
trap 'rm -rf "$work"' EXIT

# argsfile FILE: the whitespace-separated words of FILE, shell-quoted, with
# #-comments dropped (so a package can document its choice in the file).
argsfile() {
  [ -f "$1" ] || return 0
  local w
  for w in $(sed 's/#.*//' "$1"); do printf ' %q' "$w"; done
}

declare -a names=() buildfail=()
guest=$work/guest.sh
{
  echo 'set -u'
  echo 'results=$1; shift'
  echo 'base=$VM_SCRATCH'
  echo 'now() { date +%s.%N; }'
  echo 'leftovers() { local d l; d=$(dmsetup ls 2>/dev/null | grep -v "^No devices found" || true); l=$(losetup -a 2>/dev/null || true);'
  echo '  [ -z "$d$l" ] || printf "vm-suite: WARNING %s left behind:\n%s\n%s\n" "$1" "$d" "$l"; }'
  echo 'run() { # name pkgdir phase cmd...'
  echo '  local name=$1 dir=$2 phase=$3 t0 t1 rc; shift 3'
  echo '  echo "=== vm-suite: $name $phase ($dir) ==="'
  echo '  export VM_SCRATCH=$base/$name.$phase; mkdir -p "$VM_SCRATCH"'
  echo '  t0=$(now); (cd "$dir" && "$@"); rc=$?; t1=$(now)'
  echo '  printf "%s %s %s %s\n" "$name" "$phase" "$rc" "$(awk -v a=$t0 -v b=$t1 "BEGIN{printf \"%.1f\", b-a}")" >> "$results"'
  echo '  echo "=== vm-suite: $name $phase exit $rc ==="'
  echo '  leftovers "$name $phase"'
  echo '  rm -rf --one-file-system "$VM_SCRATCH"'
  echo '}'
} > "$guest"

for p in "${pkgs[@]}"; do
  [ -d "$p" ] || { echo "suite: $p is not a folder" >&2; exit 2; }
  name=$(tr '/' '_' <<<"$p")
  [ "$p" = . ] && name=root
  bin=$bindir/$name.test
  echo "suite: building ./$p -> $bin" >&2
  if ! CGO_ENABLED=1 $GO test -c -tags "dm $BUILDTAGS" -o "$bin" "./$p"; then
    buildfail+=("$name")
    continue
  fi
  if [ ! -x "$bin" ]; then
    echo "suite: ./$p has no tests for the dm build" >&2
    buildfail+=("$name")
    continue
  fi
  names+=("$name")
  printf 'run %q %q tests %q -test.v -test.timeout 20m%s\n' \
    "$name" "$repo/$p" "$repo/$bin" "$(argsfile "$p/testdata/vm-test-args")" >> "$guest"
  bench_extra=$(argsfile "$p/testdata/vm-bench-args")
  if [ "$(sed 's/#.*//' "$p/testdata/vm-bench-args" 2>/dev/null | tr -d ' \t\n')" != skip ] &&
     grep -qE '^func Benchmark' "$p"/*_test.go 2>/dev/null; then
    printf 'run %q %q bench %q -test.v -test.run %q -test.bench . -test.benchtime 1x%s\n' \
      "$name" "$repo/$p" "$repo/$bin" '^$' "$bench_extra" >> "$guest"
  fi
done

results=$work/results
: > "$results"
rc=0
if [ ${#names[@]} -gt 0 ]; then
  t0=$(date +%s)
  set +e
  "$here/run.sh" "${runargs[@]}" -- bash "$guest" "$repo/$results"
  rc=$?
  set -e
  t1=$(date +%s)
  echo "suite: VM run took $((t1 - t0))s (exit $rc)" >&2
fi

echo
echo "vm-suite summary:"
pass=0 fail=0
for n in "${buildfail[@]}"; do
  printf '  FAIL  %-28s build failed\n' "$n"
  fail=$((fail + 1))
done
for n in "${names[@]}"; do
  line=$(awk -v n="$n" '$1 == n { printf "%s%s exit %s, %ss", sep, $2, $3, $4; sep = "; " }' "$results")
  ok=1
  if ! grep -q "^$n tests " "$results"; then ok=0; line="did not run (VM ended early: exit $rc)"; fi
  awk -v n="$n" '$1 == n && $3 != 0 { bad = 1 } END { exit bad }' "$results" || ok=0
  if [ $ok = 1 ]; then
    printf '  PASS  %-28s %s\n' "$n" "$line"; pass=$((pass + 1))
  else
    printf '  FAIL  %-28s %s\n' "$n" "$line"; fail=$((fail + 1))
  fi
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ] && [ $pass -gt 0 ] && [ $rc -eq 0 ]
exit
}
