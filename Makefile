# containerd-flyio-snapshotter build and test entry points.
# `make test` is the whole suite: unit tests on the host, then every test that
# needs real device-mapper inside the VM harness (integration/vm).

GO        ?= go
BINDIR    ?= bin
BIN       := $(BINDIR)/containerd-flyio-snapshotter
# flyioctl: the light client (pull, activate, rm through the daemon), pure Go.
CTL       := $(BINDIR)/flyioctl
PREFIX    ?= /usr/local
SYSCONFDIR ?= /etc
UNITDIR   ?= /etc/systemd/system
# go-sqlite3 is cgo; a fully static binary runs in the busybox VM and on any host.
# grpcnotrace leaves out gRPC's request tracing (golang.org/x/net/trace,
# which the daemon never turns on: grpc.EnableTracing stays false) and with
# it html/template, whose reflection keeps every exported method of every
# linked type: the binary is 30% smaller, and each CLI call runs fewer
# package initialisers before it does anything.
BUILDTAGS := sqlite_omit_load_extension osusergo netgo grpcnotrace
VERSION   := $(shell git describe --always --dirty 2>/dev/null || echo dev)
COMMIT    := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
CLIPKG    := $(shell $(GO) list -m)/cmd/internal/cli
STAMP     := -X $(CLIPKG).Version=$(VERSION) -X $(CLIPKG).Commit=$(COMMIT)
LDFLAGS   := -s -w -linkmode external -extldflags "-static" $(STAMP)
# flyioctl needs no cgo: a static pure-Go binary.
CTLTAGS   := osusergo netgo
CTLFLAGS  := -s -w $(STAMP)

.PHONY: all build test binary-check unit vmtest vm-inputs e2e powerloss soak bench-pull demo lint tidy-check install install-unit clean
.PHONY: release release-check

all: build

# The binary is built exactly as the release binary of the host's
# architecture is (same compiler name, -trimpath), so that `make release`
# after `make build` reuses every compiled package, go-sqlite3's C included.
HOSTARCH := $(shell $(GO) env GOARCH)

build:
	CGO_ENABLED=1 CC=$(CC_$(HOSTARCH)) $(GO) build -trimpath -tags '$(BUILDTAGS)' -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/containerd-flyio-snapshotter
	CGO_ENABLED=0 $(GO) build -trimpath -tags '$(CTLTAGS)' -ldflags '$(CTLFLAGS)' -o $(CTL) ./cmd/flyioctl

# The VM tests' inputs and the host's checks run two at a time (the inputs,
# first since they take longest, wait mostly on the network and the disk;
# each target's output is printed whole when it ends), then the VM tests.
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target vm-inputs lint unit binary-check release-check
	$(VMTESTS)

# Fault injection lives only in the device-mapper test binaries (build tag
# dm): the shipped binary must not carry its environment variable.
binary-check: build
	@for b in $(BIN) $(CTL); do if grep -aq FLYIO_FAULT $$b; then echo "$$b carries a fault-injection variable (FLYIO_FAULT_*)"; exit 1; fi; done

lint: tidy-check
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet -tags '$(BUILDTAGS)' ./...
	$(GO) vet -tags 'dm $(BUILDTAGS)' ./...

# The alert rules (contrib/prometheus): promtool, from Debian's prometheus
# package (unpacked into .cache/tools, not installed), checks them and runs
# their unit tests, in which every rule fires.
.PHONY: prometheus-rules
lint: prometheus-rules
prometheus-rules:
	@dir=$$(./integration/tools/build.sh promtool) && \
	  $$dir/promtool check rules contrib/prometheus/alerts.yml && \
	  cd contrib/prometheus && $$dir/promtool test rules alerts_test.yml

# go.mod and go.sum must be what `go mod tidy` makes of the imports: no
# unused requirement, none mislabelled "// indirect".
tidy-check:
	@$(GO) mod tidy -diff >/dev/null 2>&1 || { echo "go.mod/go.sum are not tidy; run 'go mod tidy'. The difference:"; $(GO) mod tidy -diff; exit 1; }

# BenchmarkScale fails when a snapshotter call's cost grows with the
# records: its fake pool needs no device-mapper, so it runs here, at 100
# and 1,000 snapshots (BenchmarkScaleDM, the same on real devices, runs in
# the VM).
unit:
	$(GO) test -tags '$(BUILDTAGS)' -count=1 ./...
	$(GO) test -tags '$(BUILDTAGS)' -count=1 -run '^$$' -bench '^BenchmarkScale$$' -benchtime 1x ./snapshotter -flyio.scale-sizes 100,1000

# The dm tests run our static binary and a real containerd inside the VM:
# build both on the host first (containerd only when missing). The VM has
# no network: integration/e2e/prepare.sh makes the end-to-end test's inputs
# on the host first (versitygw, the Debian image and its S3 store; cached
# under .cache/).
vmtest: vm-inputs
	$(VMTESTS)

vm-inputs: build
	./integration/tools/build.sh >/dev/null
	./integration/e2e/prepare.sh >/dev/null
	./integration/upgrade/prepare.sh >/dev/null

define VMTESTS
./integration/vm/all.sh --powerloss-rounds 3
endef

# The whole power-loss test (integration/powerloss/README.md): 10 guest
# resets with each [metadata] synchronous setting; with "normal" it reports
# what was lost instead of failing on it.
powerloss:
	./integration/powerloss/run.sh --rounds 10 --sync full
	./integration/powerloss/run.sh --rounds 10 --sync normal

# The full soak (integration/soak/README.md): 10,000 Prepare/Commit/Remove
# cycles through containerd and 200 S3 pull and remove cycles; make vmtest
# runs 150 + 500 and 10.
soak: build
	./integration/tools/build.sh >/dev/null
	CGO_ENABLED=1 $(GO) test -c -tags 'dm $(BUILDTAGS)' -o .cache/vmbin/integration_soak_full.test ./integration/soak
	cd integration/soak && ../vm/run.sh --mem 3072 --timeout 21600 -- ../../.cache/vmbin/integration_soak_full.test \
	  -test.v -test.timeout 6h -flyio.soak-cycles 10000 -flyio.soak-pulls 200

# The pull benchmark at full size (docs/benchmarks.md): image A of four
# layers, about 115 MB unpacked, and image B of one 100 MB layer, pulled
# four ways in 3 alternating rounds against the floor; make vmtest runs it
# scaled down (integration/pullbench/testdata/vm-bench-args). 8 GiB: the
# pools' loop files sit on the guest's tmpfs and grow with every device
# written (the thin pool moves on through free blocks before it reuses
# freed ones), to about 3.5 GiB in the three rounds.
bench-pull: build
	./integration/tools/build.sh >/dev/null
	./scripts/install-versitygw.sh >/dev/null
	CGO_ENABLED=1 $(GO) test -c -tags 'dm $(BUILDTAGS)' -o .cache/vmbin/integration_pullbench_full.test ./integration/pullbench
	cd integration/pullbench && ../vm/run.sh --mem 8192 --timeout 7200 -- ../../.cache/vmbin/integration_pullbench_full.test \
	  -test.v -test.run '^$$' -test.bench BenchmarkPull -test.benchtime 1x -test.timeout 2h

# Only the end-to-end test (integration/e2e's TestEndToEnd, also part of
# vmtest).
e2e: build
	./integration/tools/build.sh >/dev/null
	./integration/e2e/prepare.sh >/dev/null
	./integration/vm/suite.sh integration/e2e

# The README's main command: the whole system end to end (scripts/demo.sh).
demo:
	./scripts/demo.sh

# Release binaries: static linux/amd64 and linux/arm64 builds (cgo, for
# go-sqlite3) with Debian's gcc for each (the arm64 one is the cross gcc
# scripts/install-deps.sh installs), stamped with VERSION and COMMIT, into
# dist/ beside their SHA256SUMS. -trimpath keeps the build machine's paths
# out of them.
DISTDIR        ?= dist
RELEASE_ARCHES := amd64 arm64
RELEASE_BINS   := $(foreach a,$(RELEASE_ARCHES),containerd-flyio-snapshotter-linux-$(a) flyioctl-linux-$(a))
CC_amd64       ?= x86_64-linux-gnu-gcc
CC_arm64       ?= aarch64-linux-gnu-gcc

release: $(addprefix $(DISTDIR)/,$(RELEASE_BINS))
	cd $(DISTDIR) && sha256sum $(RELEASE_BINS) > SHA256SUMS

# go build decides what is stale: always ask it.
$(DISTDIR)/containerd-flyio-snapshotter-linux-%: FORCE
	CGO_ENABLED=1 GOOS=linux GOARCH=$* CC=$(CC_$*) $(GO) build -trimpath -tags '$(BUILDTAGS)' -ldflags '$(LDFLAGS)' \
	  -o $@ ./cmd/containerd-flyio-snapshotter

$(DISTDIR)/flyioctl-linux-%: FORCE
	CGO_ENABLED=0 GOOS=linux GOARCH=$* $(GO) build -trimpath -tags '$(CTLTAGS)' -ldflags '$(CTLFLAGS)' -o $@ ./cmd/flyioctl

# Both release binaries run (the foreign one under qemu-user): static,
# matching SHA256SUMS, --version naming VERSION, COMMIT and the platform,
# validate accepting and rejecting a tarball (scripts/release-check.sh).
release-check: release
	./scripts/release-check.sh $(DISTDIR) '$(VERSION)' '$(COMMIT)' $(RELEASE_ARCHES)

FORCE:

install: build install-unit
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/containerd-flyio-snapshotter
	install -D -m 0755 $(CTL) $(DESTDIR)$(PREFIX)/bin/flyioctl
	@if [ ! -e $(DESTDIR)$(SYSCONFDIR)/containerd-flyio-snapshotter/config.toml ]; then \
	  install -D -m 0644 config.toml.example $(DESTDIR)$(SYSCONFDIR)/containerd-flyio-snapshotter/config.toml; \
	else echo "keeping existing $(DESTDIR)$(SYSCONFDIR)/containerd-flyio-snapshotter/config.toml"; fi

# The systemd unit alone (also a check of the installed unit without
# building the binary): contrib/systemd's template names the default PREFIX
# and SYSCONFDIR; the installed copy names the ones given.
install-unit:
	install -d $(DESTDIR)$(UNITDIR)
	sed -e 's|/usr/local/bin/containerd-flyio-snapshotter|$(PREFIX)/bin/containerd-flyio-snapshotter|g' \
	  -e 's|/etc/containerd-flyio-snapshotter/|$(SYSCONFDIR)/containerd-flyio-snapshotter/|g' \
	  contrib/systemd/containerd-flyio-snapshotter.service > $(DESTDIR)$(UNITDIR)/containerd-flyio-snapshotter.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/containerd-flyio-snapshotter.service

clean:
	rm -rf $(BINDIR) .cache/vmbin $(DISTDIR)
