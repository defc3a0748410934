# pillar-csi: the two commands that matter are `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: deps demo test unit lab bench lint fmt csi-conformance

## Install everything the build and the kernel lab need (idempotent).
deps:
	bash scripts/deps.sh

## The main job: the volume lifecycle in the kernel lab, step by step.
demo: deps
	tests/lab/run demo

## Unit tests on the host, then the lab tests against the real kernel.
test: deps unit lab

unit: lint csi-conformance
	cargo test --workspace

## proto/csi/v1/csi.proto against the official CSI Go bindings' descriptor.
csi-conformance:
	bash scripts/csi-conformance.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

lab:
	tests/lab/run tests $(if $(FILTER),-- $(FILTER))

## Benchmarks in the lab (ratios from one run); not part of `make test`.
bench: deps
	tests/lab/run bench $(if $(FILTER),-- $(FILTER))

fmt:
	cargo fmt --all
