#!/bin/sh
# Builds the real programs the integration tests run, each at the version
# pinned by a Go module under integration/tools (module proxy only, nothing
# added to the project's go.mod), into .cache/tools/<name>-<version>/ at the
# repository root:
#   integration/tools           containerd, containerd-shim-runc-v2, ctr
#   integration/tools/nerdctl   nerdctl
#   integration/tools/registry  registry (distribution's OCI registry)
# nerdctl and the registry are modules of their own so that their
# dependencies never move the containerd the daemon is tested against.
# A binary that already exists for its version is not rebuilt.
# Usage: build.sh [containerd|nerdctl|registry]... (default: all three; the
# demo needs only containerd, `make vmtest` all).
# Prints the directory holding containerd's binaries as its only line of
# stdout.
# Usage: build.sh promtool (`make lint`): prints the directory of promtool,
# which checks and unit-tests contrib/prometheus's alert rules. It is not
# built: it is taken from the distribution's `prometheus` package (apt-get
# download, no install, so no Prometheus server is set up or started), which
# costs seconds where building the Prometheus module cost minutes.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

# build MODULE_DIR MODULE_PATH DIR_NAME PACKAGE_DIR BINARY...: builds each
# BINARY from MODULE_PATH/PACKAGE_DIR/BINARY at the version MODULE_DIR pins,
# into .cache/tools/DIR_NAME-<version>, and sets $out to that folder.
build() {
	moddir=$1 mod=$2 name=$3 pkgdir=$4
	shift 4
	version=$(cd "$moddir" && go list -m -f '{{.Version}}' "$mod")
	out="$root/.cache/tools/$name-$version"
	mkdir -p "$out"
	for cmd in "$@"; do
		[ -x "$out/$cmd" ] && continue
		start=$(date +%s)
		# Static, no cgo: runs anywhere, including the VM harness.
		(cd "$moddir" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' \
			-o "$out/$cmd.tmp" "$mod/$pkgdir/$cmd")
		mv "$out/$cmd.tmp" "$out/$cmd"
		echo "built $cmd $version in $(( $(date +%s) - start ))s" >&2
	done
}

[ $# -gt 0 ] || set -- containerd nerdctl registry
if [ "$*" = promtool ]; then
	version=$(apt-cache policy prometheus | awk '$1 == "Candidate:" { print $2 }')
	case $version in
	'' | '(none)')
		echo "build.sh: no 'prometheus' package in apt's lists (run scripts/install-deps.sh, which runs apt-get update)" >&2
		exit 1
		;;
	esac
	out="$root/.cache/tools/promtool-$(echo "$version" | tr '/:' '__')"
	if [ ! -x "$out/promtool" ]; then
		tmp=$(mktemp -d)
		trap 'rm -rf "$tmp"' EXIT
		# apt warns that it fetches as root into a folder its own user
		# cannot write: shown only when the download fails.
		(cd "$tmp" && apt-get download "prometheus=$version" >"$tmp/log" 2>&1) || {
			cat "$tmp/log" >&2
			exit 1
		}
		dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -C "$tmp" ./usr/bin/promtool
		mkdir -p "$out"
		mv "$tmp/usr/bin/promtool" "$out/promtool"
		echo "took promtool from Debian's prometheus $version" >&2
	fi
	echo "$out"
	exit 0
fi
for tool in "$@"; do
	case $tool in
	containerd | nerdctl | registry) ;;
	*)
		echo "build.sh: unknown tool \"$tool\" (want containerd, nerdctl or registry; or promtool alone)" >&2
		exit 2
		;;
	esac
done
for tool in "$@"; do
	case $tool in
	nerdctl) build "$here/nerdctl" github.com/containerd/nerdctl/v2 nerdctl cmd nerdctl ;;
	registry) build "$here/registry" github.com/distribution/distribution/v3 registry cmd registry ;;
	esac
done
# containerd last: its folder is what this script prints.
build "$here" github.com/containerd/containerd/v2 containerd cmd containerd containerd-shim-runc-v2 ctr
echo "$out"
