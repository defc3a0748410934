#!/usr/bin/env bash
# Checks that proto/csi/v1/csi.proto is the CSI wire contract: protoc writes
# its descriptor set, and the Go program in proto/csi/conformance compares it,
# line by line (field numbers, types, labels, oneofs, maps, options, RPCs and
# streaming), with the descriptor of the official Go bindings
# (github.com/container-storage-interface/spec/lib/go/csi, the version its
# go.mod pins). Exits non-zero and lists the differences when they differ.
# Modules come from the Go module cache once `scripts/deps.sh` has fetched
# them; go.sum pins their hashes.
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$PATH:/usr/local/go/bin"
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
command -v go >/dev/null || { echo "csi-conformance: no go on PATH (make deps installs one)" >&2; exit 1; }
command -v protoc >/dev/null || { echo "csi-conformance: no protoc on PATH (make deps installs protobuf-compiler)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
protoc -I proto --include_imports --descriptor_set_out="$tmp/csi.pb" csi/v1/csi.proto
(cd proto/csi/conformance && go build -o "$tmp/conformance" .)
"$tmp/conformance" -ours "$tmp/csi.pb"
