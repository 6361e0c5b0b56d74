#!/usr/bin/env bash
# Runs every device-mapper test of the repository in VM boots running side by
# side, one per lane (what `make vmtest` runs; see integration/vm/README.md).
#
#   integration/vm/suite.sh [--lanes N] [--mem MiB] [--timeout SECONDS] [--cpus N] [--vm] [PKGDIR...]
#
# Finds every package with `//go:build dm` test files (or only the PKGDIRs
# given), builds each on the host (as many at a time as it has cores) with
#   go test -c -tags 'dm $BUILDTAGS' -o .cache/vmbin/<name>.test ./<pkg>
# then, through integration/vm/run.sh (one boot), runs each binary with cwd =
# its package folder and its own empty $VM_SCRATCH:
#   tests:      <bin> -test.v -test.timeout 20m -test.run '^(<dm tests>)$'
#                     [args of <pkg>/testdata/vm-test-args]
#   benchmarks: <bin> -test.run '^$' -test.bench . -test.benchtime 1x
#                     [args of <pkg>/testdata/vm-bench-args]
#   where <dm tests> are the Test funcs the package's `//go:build dm` files
#   declare: the others are host tests, which `make unit` runs, and would only
#   run again ten times slower under TCG. Every benchmark of the package runs
#   (`make unit` runs none), when it declares any; a vm-bench-args file
#   containing just "skip" turns them off.
# The packages run in --lanes boots (default 2, or $VM_SUITE_LANES), longest
# first by the seconds integration/vm/durations gives each package (a package
# it does not list counts as the longest one): every lane, whenever it is
# free, takes the longest package no lane has taken yet, so a package that
# runs longer or shorter than the file says holds back only its own lane.
# Under TCG one boot keeps about one and a half
# of the host's cores busy, since its tests wait on timers, containerd and the
# kernel: two boots side by side fill the gaps. Each run writes the measured
# seconds to .cache/vmbin/durations, in the format of integration/vm/durations.
# Prints a summary per binary (PASS/FAIL, wall time), then for each binary
# that failed its failing test's last log lines and its "--- FAIL" lines
# (each run's whole output is kept beside the results while the suite
# runs), ending with "N passed, N failed"; exits non-zero if any failed or
# none ran.
set -euo pipefail
{ # Parsed whole before it runs: editing this file cannot upset running copies.

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd "$here/../.." && pwd -P)
cd "$repo"
GO=${GO:-go}
BUILDTAGS=${BUILDTAGS:-sqlite_omit_load_extension osusergo netgo}
runargs=()
pkgs=()
lanes=${VM_SUITE_LANES:-2}
while [ $# -gt 0 ]; do
  case $1 in
    --lanes) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "suite: --lanes needs a count, got '${2:-}'" >&2; exit 2; }
      lanes=$2; shift 2 ;;
    --mem|--timeout|--cpus) runargs+=("$1" "${2:-}"); shift 2 ;;
    --vm|--console) runargs+=("$1"); shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$here/suite.sh" >&2; exit 2 ;;
    -*) echo "suite: unknown option '$1'" >&2; exit 2 ;;
    *) d=${1#./}; d=${d%/}; pkgs+=("$d"); shift ;;
  esac
done
# The whole suite gets a generous VM timeout unless the caller set one.
case " ${runargs[*]-} " in *" --timeout "*) ;; *) runargs+=(--timeout "${VM_SUITE_TIMEOUT:-3600}") ;; esac

# A test file of the dm build: its constraint names dm, not negated.
dmtag='^//go:build.*[^!A-Za-z0-9_]dm([^A-Za-z0-9_]|$)'
if [ ${#pkgs[@]} -eq 0 ]; then
  mapfile -t pkgs < <(
    grep -rlE --include='*_test.go' --exclude-dir=.git --exclude-dir=.cache --exclude-dir=vendor \
      "$dmtag" . |
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

# dmtests PKGDIR: a -test.run pattern matching exactly the Test funcs
# (TestMain aside) the package's dm-tagged test files declare, or nothing
# when there are none.
dmtests() {
  cat $(grep -lE "$dmtag" "$1"/*_test.go) | grep -oE '^func Test[A-Za-z0-9_]*\(' |
    sed -E 's/^func //; s/\($//' | grep -vx TestMain | LC_ALL=C sort -u | paste -sd'|' | sed -E 's/.+/^(&)$/'
  return 0
}

declare -a names=() buildfail=()
prelude=$work/prelude.sh
{
  echo 'set -u'
  echo 'results=$1; shift'
  echo 'claims=${results%/*}/claims'
  echo '# claim NAME: true for the one lane that takes NAME first (mkdir is atomic'
  echo '# on the host, through the shared folder).'
  echo 'claim() { mkdir "$claims/$1" 2>/dev/null; }'
  echo 'base=$VM_SCRATCH'
  echo 'now() { date +%s.%N; }'
  echo 'leftovers() { local d l; d=$(dmsetup ls 2>/dev/null | grep -v "^No devices found" || true); l=$(losetup -a 2>/dev/null || true);'
  echo '  [ -z "$d$l" ] || printf "vm-suite: WARNING %s left behind:\n%s\n%s\n" "$1" "$d" "$l"; }'
  echo 'run() { # name pkgdir phase cmd...'
  echo '  local name=$1 dir=$2 phase=$3 t0 t1 rc; shift 3'
  echo '  echo "=== vm-suite: $name $phase ($dir) ==="'
  echo '  export VM_SCRATCH=$base/$name.$phase; mkdir -p "$VM_SCRATCH"'
  echo '  t0=$(now); (cd "$dir" && "$@") 2>&1 | tee "$results.$name.$phase.log"; rc=${PIPESTATUS[0]}; t1=$(now)'
  echo '  printf "%s %s %s %s\n" "$name" "$phase" "$rc" "$(awk -v a=$t0 -v b=$t1 "BEGIN{printf \"%.1f\", b-a}")" >> "$results"'
  echo '  echo "=== vm-suite: $name $phase exit $rc ==="'
  echo '  leftovers "$name $phase"'
  echo '  rm -rf --one-file-system "$VM_SCRATCH"'
  echo '}'
} > "$prelude"

# pkgname PKGDIR: the package's name in the suite (its binary, its results).
pkgname() { if [ "$1" = . ]; then echo root; else tr '/' '_' <<<"$1"; fi; }

# The test binaries build as many at a time as the host has cores: with
# the compiled packages cached, a build is mostly its link, one core's work.
for p in "${pkgs[@]}"; do
  [ -d "$p" ] || { echo "suite: $p is not a folder" >&2; exit 2; }
done
for p in "${pkgs[@]}"; do
  name=$(pkgname "$p")
  echo "suite: building ./$p -> $bindir/$name.test" >&2
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
  ( set +e; CGO_ENABLED=1 $GO test -c -tags "dm $BUILDTAGS" -o "$bindir/$name.test" "./$p" > "$work/$name.build" 2>&1
    echo $? > "$work/$name.built" ) &
done
wait
for p in "${pkgs[@]}"; do
  name=$(pkgname "$p")
  bin=$bindir/$name.test
  cat "$work/$name.build" >&2
  if [ "$(cat "$work/$name.built")" != 0 ]; then
    echo "suite: building ./$p failed" >&2
    buildfail+=("$name")
    continue
  fi
  if [ ! -x "$bin" ]; then
    echo "suite: ./$p has no tests for the dm build" >&2
    buildfail+=("$name")
    continue
  fi
  names+=("$name")
  tests=$(dmtests "$p")
  [ -n "$tests" ] || tests='^$' # a package of dm benchmarks only
  printf 'run %q %q tests %q -test.v -test.timeout 20m -test.run %q%s\n' \
    "$name" "$repo/$p" "$repo/$bin" "$tests" "$(argsfile "$p/testdata/vm-test-args")" > "$work/$name.run"
  if [ "$(sed 's/#.*//' "$p/testdata/vm-bench-args" 2>/dev/null | tr -d ' \t\n')" != skip ] &&
     grep -qE '^func Benchmark' "$p"/*_test.go 2>/dev/null; then
    printf 'run %q %q bench %q -test.v -test.run %q -test.bench . -test.benchtime 1x%s\n' \
      "$name" "$repo/$p" "$repo/$bin" '^$' "$(argsfile "$p/testdata/vm-bench-args")" >> "$work/$name.run"
  fi
done

# Every lane gets every package, longest first, each behind a claim.
[ ${#names[@]} -ge "$lanes" ] || lanes=${#names[@]}
# Each lane's VM gets the host's cores shared out (at least one) unless the
# caller chose: under TCG a guest with one vCPU does the same work in less
# host time than one with two, whose vCPUs wait on each other (TLB
# shootdowns, locks), so two one-vCPU guests keep a 2-core host busier with
# useful work than two two-vCPU guests.
case " ${runargs[*]-} " in
  *" --cpus "*) ;;
  *) [ -n "${VM_CPUS:-}" ] || [ "$lanes" -eq 0 ] || runargs+=(--cpus "$(( $(nproc) / lanes > 1 ? $(nproc) / lanes : 1 ))") ;;
esac
mkdir "$work/claims"
for ((l = 0; l < lanes; l++)); do
  cat "$prelude" > "$work/lane$l.sh"
done
order=()
# The packages as "SECONDS NAME" lines, longest first (the loop's input).
while read -r _ n; do
  order+=("$n")
  for ((l = 0; l < lanes; l++)); do
    { printf 'if claim %q; then\n' "$n"; cat "$work/$n.run"; echo fi; } >> "$work/lane$l.sh"
  done
done < <(for n in "${names[@]}"; do
           awk -v n="$n" '$1 == n { s = $2 } END { printf "%d %s\n", (s == "" ? 1e6 : s), n }' "$here/durations" 2>/dev/null ||
             echo "1000000 $n"
         done | sort -k1,1nr -k2,2)
echo "suite: ${#names[@]} package(s) in $lanes lane(s), each lane taking the next when free: ${order[*]}" >&2

results=$work/results
: > "$results"
rc=0
if [ ${#names[@]} -gt 0 ]; then
  t0=$(date +%s)
  declare -a lanepid=()
  for ((l = 0; l < lanes; l++)); do
    : > "$work/results$l"
    if [ "$lanes" -gt 1 ]; then
      # Each line of a lane's output carries its lane, so that the two logs
      # interleaved on one terminal can be told apart.
      "$here/run.sh" "${runargs[@]}" -- bash "$work/lane$l.sh" "$repo/$work/results$l" \
        > >(sed -u "s/^/[lane $l] /") 2> >(sed -u "s/^/[lane $l] /" >&2) &
    else
      "$here/run.sh" "${runargs[@]}" -- bash "$work/lane$l.sh" "$repo/$work/results$l" &
    fi
    lanepid[l]=$!
  done
  for ((l = 0; l < lanes; l++)); do
    set +e
    wait "${lanepid[l]}"
    lrc=$?
    set -e
    [ $lrc -eq 0 ] || { rc=$lrc; echo "suite: lane $l's VM exited $lrc" >&2; }
    cat "$work/results$l" >> "$results"
  done
  t1=$(date +%s)
  echo "suite: VM run took $((t1 - t0))s in $lanes lane(s) (exit $rc)" >&2
  awk '{ s[$1] += $4 } END { for (n in s) printf "%s %d\n", n, s[n] + 0.5 }' "$results" | LC_ALL=C sort > "$bindir/durations"
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
# What failed, where a log shows only its end (CI keeps the last lines):
# for each binary that exited non-zero, the last 15 log lines (file:line,
# tables left out) of the top-level test its first "--- FAIL" or panic
# ends, which hold the failing test's error lines, and its "--- FAIL" lines.
while read -r n phase prc _; do
  [ "$prc" != 0 ] || continue
  l=$(ls "$work"/results*."$n.$phase.log" 2>/dev/null | head -1)
  [ -n "$l" ] || continue
  echo
  echo "$n $phase (exit $prc), its last test log lines before the first failure:"
  awk '/^=== RUN +[^\/]+$/ { k = 0 }
       /^ *--- FAIL|^panic:/ { if (/^panic:/) buf[k++ % 15] = $0; exit }
       /^ +[A-Za-z0-9_]+\.go:[0-9]+: / && !/\.go:[0-9]+: +\|/ { buf[k++ % 15] = $0 }
       END { for (i = (k > 15 ? k - 15 : 0); i < k; i++) print "  " substr(buf[i % 15], 1, 300) }' "$l"
  grep -E -- '^ *--- FAIL' "$l" | sed 's/^/  /' | head -8
done < "$results"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ] && [ $pass -gt 0 ] && [ $rc -eq 0 ]
exit
}
