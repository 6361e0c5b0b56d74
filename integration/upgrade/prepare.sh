#!/usr/bin/env bash
# Host-side input of the upgrade test (integration/upgrade, a dm test: the
# VM has no network and no Go build of another tree): builds the previous
# release named in integration/upgrade/testdata/previous-release from this
# repository's own history, with the build tags and static link flags of
# the Makefile's build target, into
#   .cache/upgrade/<tag>-<commit>/containerd-flyio-snapshotter
# A binary already built for that commit is kept (a second call takes
# milliseconds). Works from a clean clone (it needs the commit, not a
# checkout of it). Records what the test reads inside the VM (the binary,
# its tag and commit, and the schema version it migrates to: the number of
# migrations at that commit) in .cache/upgrade/inputs, and prints the
# binary's path as its only line of stdout.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd "$here/../.." && pwd -P)
cd "$repo"
GO=${GO:-go}
pin=$here/testdata/previous-release
tag=$(sed -n 's/^tag=//p' "$pin")
commit=$(sed -n 's/^commit=//p' "$pin")
[ -n "$tag" ] && [ -n "$commit" ] || { echo "upgrade prepare: $pin must set tag= and commit=" >&2; exit 2; }
git cat-file -e "$commit^{commit}" 2>/dev/null ||
  { echo "upgrade prepare: commit $commit of $pin is not in this repository's history (a shallow clone?)" >&2; exit 2; }

out=$repo/.cache/upgrade/$tag-$commit
bin=$out/containerd-flyio-snapshotter
if [ ! -x "$bin" ]; then
  start=$(date +%s)
  mkdir -p "$repo/.cache/upgrade"
  src=$(mktemp -d "$repo/.cache/upgrade/.src.XXXXXX")
  trap 'rm -rf "$src"' EXIT
  git archive --format=tar "$commit" | tar -x -C "$src"
  # The release's own build tags, from its Makefile; the link flags of the
  # build target (a static cgo binary), with the tag as its version: the
  # archive has no .git for `git describe`.
  tags=$(sed -n 's/^BUILDTAGS *:= *//p' "$src/Makefile")
  [ -n "$tags" ] || { echo "upgrade prepare: no BUILDTAGS in the Makefile of $commit" >&2; exit 2; }
  mkdir -p "$out"
  (cd "$src" && CGO_ENABLED=1 $GO build -tags "$tags" \
    -ldflags "-s -w -linkmode external -extldflags -static -X main.version=$tag" \
    -o "$bin.tmp" ./cmd/containerd-flyio-snapshotter)
  mv "$bin.tmp" "$bin"
  echo "upgrade prepare: built $tag ($commit) in $(( $(date +%s) - start ))s: $bin" >&2
fi
schema=$(git ls-tree --name-only "$commit" metadata/migrations/ | grep -c '\.sql$')
printf 'bin=%s\ntag=%s\ncommit=%s\nschema=%s\n' "$bin" "$tag" "$commit" "$schema" > "$repo/.cache/upgrade/inputs.tmp"
mv "$repo/.cache/upgrade/inputs.tmp" "$repo/.cache/upgrade/inputs"
echo "$bin"
