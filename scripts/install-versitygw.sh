#!/usr/bin/env bash
# Installs versitygw (an S3-compatible server with real SigV4 checks and
# bucket policies) into <repo>/.cache/tools/versitygw-<version>/, outside the
# project's go.mod, from the Go module proxy. Idempotent: an installed binary
# is kept. Prints the binary's path as its only line of stdout.
#
#   scripts/install-versitygw.sh            # the pinned version
#   VERSITYGW_VERSION=v1.8.0 scripts/install-versitygw.sh
set -euo pipefail
version=${VERSITYGW_VERSION:-v1.8.0}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
dir=$root/.cache/tools/versitygw-$version
bin=$dir/versitygw
if [ ! -x "$bin" ]; then
  mkdir -p "$dir"
  start=$(date +%s)
  # go install pkg@version builds in module-aware mode from the proxy and
  # never reads or changes the project's go.mod.
  (cd "$dir" && GOBIN="$dir/.tmp" CGO_ENABLED=0 GOFLAGS=-trimpath \
     go install "github.com/versity/versitygw/cmd/versitygw@$version") >&2
  mv "$dir/.tmp/versitygw" "$bin"
  rmdir "$dir/.tmp"
  echo "built versitygw $version in $(( $(date +%s) - start ))s" >&2
fi
echo "$bin"
