# pillar-csi: the two commands that matter are `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
# Cargo's target folder outside the clone: a fresh clone (CI's) reuses the
# dependencies compiled by the last build on this machine.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/pillar-csi/target

.PHONY: deps demo test unit chart fuzz fuzz-long lab bench lint doc fmt csi-conformance

## Install everything the build and the kernel lab need (idempotent).
deps:
	bash scripts/deps.sh

## The main job: a claim's life through controller, agent and node in the
## kernel lab (the API server on the host), step by step.
demo: deps
	tests/lab/run demo

## Unit tests on the host, then the lab tests against the real kernel.
test: deps unit chart fuzz lab

unit: lint doc csi-conformance
	cargo test --workspace

## The Helm chart and the Containerfile (tests/chart/, pytest in the venv of
## scripts/chart-deps.sh): render matrix, lint, schemas, RBAC, ldd of the binary.
chart:
	bash scripts/chart-deps.sh
	cargo build --workspace --bins
	"$$(bash scripts/chart-deps.sh --python)" -m pytest tests/chart -q -rs

## Every fuzz target (fuzz/, cargo-fuzz on nightly) for 30 s with the
## committed corpus; fuzz-long runs 10 min each and merges new inputs into it.
fuzz:
	bash scripts/fuzz.sh 30

fuzz-long:
	bash scripts/fuzz.sh 600 --merge

## proto/csi/v1/csi.proto against the official CSI Go bindings' descriptor.
csi-conformance:
	bash scripts/csi-conformance.sh

lint:
	cargo fmt --all -- --check
	cargo fmt --manifest-path tests/consumer/Cargo.toml -- --check
	cargo clippy --workspace --all-targets -- -D warnings

## The libraries other Rust tools link (see the README's "Libraries").
LIBS := pillar-csi-api pillar-csi-configfs pillar-csi-nvmet pillar-csi-lio pillar-csi-host pillar-csi-zfs-sys pillar-csi-lvm-sys

## Their API docs, and the binary's own crates' (agent, driver), with
## warnings (broken links, missing docs) as errors.
doc:
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps $(addprefix -p ,$(LIBS)) -p pillar-csi-agent -p pillar-csi-driver

lab:
	tests/lab/run tests $(if $(FILTER),-- $(FILTER))

## Benchmarks in the lab (ratios from one run); not part of `make test`.
## Refused while another lab guest runs (BENCH_SHARED=1 measures anyway);
## LOAD=n runs n busy loops on the host beside the guest.
bench: deps
	tests/lab/run bench $(if $(FILTER),-- $(FILTER))

fmt:
	cargo fmt --all
	cargo fmt --manifest-path tests/consumer/Cargo.toml
