# modelfleet — the two commands a newcomer needs:
#   make up     bring up the local Kubernetes cluster (etcd, kube-apiserver, kube-controller-manager,
#               kube-scheduler, one real node: kubelet, kube-proxy, containerd; Prometheus) built from
#               the official Go modules, with the CRDs, the operator and the gateway installed by the
#               Helm chart from our images, and a sample model served through the gateway
#   make test   every test: fmt, clippy, unit + integration tests, and the end-to-end suite
# `make setup` installs what both need on a fresh Debian machine (called by both).

SHELL := /bin/bash
CARGO ?= cargo
# Seconds the structured-output fuzzer runs in `make test` (runtime/server/tests/constraint_fuzz.rs);
# `make fuzz FUZZ_SECONDS=1800` is the long run.
FUZZ_SECONDS ?= 60
# Seconds the soak runs in `make test` (runtime/server/tests/soak.rs; its own default, 180, is the
# longer run: `MODELFLEET_SOAK_SECONDS=1800 cargo test -p modelfleet-runtime --test soak`). 90 s is
# still 30 rewrites of the tenants file and several hundred requests; it keeps CI under an hour.
SOAK_SECONDS ?= 90

.PHONY: setup build up down test lint unit e2e crds clean-cluster fuzz dist images push images-check

setup:
	@echo "[make] $$(date -u +%FT%TZ) setup"
	bash e2e/scripts/setup.sh

build:
	$(CARGO) build --workspace --bins

up: setup build
	bash e2e/scripts/up.sh

down:
	e2e/cluster down

crds:
	$(CARGO) run -q -p modelfleet-operator -- crds --out-dir crds
	$(CARGO) run -q -p modelfleet-operator -- crds --out-dir charts/modelfleet/crds

lint:
	@echo "[make] $$(date -u +%FT%TZ) lint"
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	@echo "[make] $$(date -u +%FT%TZ) unit"
	MODELFLEET_FUZZ_SECONDS=$(FUZZ_SECONDS) MODELFLEET_SOAK_SECONDS=$(SOAK_SECONDS) $(CARGO) test --workspace

# Release artifacts (docs/install.md): the release binaries, the three images (buildah, no daemon), and
# `make images push REGISTRY=…` to push them by digest and print the chart values that pin them.
dist:
	bash images/build.sh dist

images:
	@echo "[make] $$(date -u +%FT%TZ) images"
	bash images/build.sh images

push:
	bash images/build.sh push

images-check: images
	@echo "[make] $$(date -u +%FT%TZ) images-check"
	bash images/check.sh

fuzz:
	MODELFLEET_FUZZ_SECONDS=$(FUZZ_SECONDS) $(CARGO) test --release -p modelfleet-runtime \
		--test constraint_fuzz -- --nocapture

e2e: build
	@echo "[make] $$(date -u +%FT%TZ) e2e"
	bash e2e/scripts/run-e2e.sh

test: setup lint unit images-check e2e
	@echo "[make] $$(date -u +%FT%TZ) done"
