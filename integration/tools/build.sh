#!/bin/sh
# Builds the real containerd, containerd-shim-runc-v2 and ctr that the
# integration tests run, at the versions pinned in integration/tools/go.mod
# (module proxy only, nothing added to the project's go.mod), into
# .cache/tools/containerd-<version>/ at the repository root. A binary that
# already exists for that version is not rebuilt.
# Prints the directory holding the binaries as its only line of stdout.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$here"
version=$(go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
out="$root/.cache/tools/containerd-$version"
mkdir -p "$out"
for cmd in containerd containerd-shim-runc-v2 ctr; do
	[ -x "$out/$cmd" ] && continue
	start=$(date +%s)
	# Static, no cgo: runs anywhere, including the VM harness.
	CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' \
		-o "$out/$cmd.tmp" "github.com/containerd/containerd/v2/cmd/$cmd"
	mv "$out/$cmd.tmp" "$out/$cmd"
	echo "built $cmd $version in $(( $(date +%s) - start ))s" >&2
done
echo "$out"
