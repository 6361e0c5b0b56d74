# containerd-flyio-snapshotter build and test entry points.
# `make test` is the whole suite: unit tests on the host, then every test that
# needs real device-mapper inside the VM harness (integration/vm).

GO        ?= go
BINDIR    ?= bin
BIN       := $(BINDIR)/containerd-flyio-snapshotter
PREFIX    ?= /usr/local
SYSCONFDIR ?= /etc
# go-sqlite3 is cgo; a fully static binary runs in the busybox VM and on any host.
BUILDTAGS := sqlite_omit_load_extension osusergo netgo
LDFLAGS   := -s -w -linkmode external -extldflags "-static" \
  -X main.version=$(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: all build test unit vmtest e2e demo lint install clean

all: build

build:
	CGO_ENABLED=1 $(GO) build -tags '$(BUILDTAGS)' -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/containerd-flyio-snapshotter

test: lint unit vmtest

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet -tags '$(BUILDTAGS)' ./...
	$(GO) vet -tags 'dm $(BUILDTAGS)' ./...

unit:
	$(GO) test -tags '$(BUILDTAGS)' -count=1 ./...

# The dm tests run our static binary and a real containerd inside the VM:
# build both on the host first (containerd only when missing). The VM has
# no network: integration/e2e/prepare.sh makes the end-to-end test's inputs
# on the host first (versitygw, the Debian image and its S3 store; cached
# under .cache/).
vmtest: build
	./integration/tools/build.sh >/dev/null
	./integration/e2e/prepare.sh >/dev/null
	./integration/vm/suite.sh

# Only the end-to-end test (integration/e2e's TestEndToEnd, also part of
# vmtest).
e2e: build
	./integration/tools/build.sh >/dev/null
	./integration/e2e/prepare.sh >/dev/null
	./integration/vm/suite.sh integration/e2e

# The README's main command: the whole system end to end (scripts/demo.sh).
demo:
	./scripts/demo.sh

install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/containerd-flyio-snapshotter
	install -D -m 0644 contrib/systemd/containerd-flyio-snapshotter.service \
	  $(DESTDIR)/etc/systemd/system/containerd-flyio-snapshotter.service
	@if [ ! -e $(DESTDIR)$(SYSCONFDIR)/containerd-flyio-snapshotter/config.toml ]; then \
	  install -D -m 0644 config.toml.example $(DESTDIR)$(SYSCONFDIR)/containerd-flyio-snapshotter/config.toml; \
	else echo "keeping existing $(DESTDIR)$(SYSCONFDIR)/containerd-flyio-snapshotter/config.toml"; fi

clean:
	rm -rf $(BINDIR) .cache/vmbin
