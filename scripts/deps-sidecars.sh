#!/usr/bin/env bash
# The CSI sidecars the chart deploys beside `pillar-csi controller`, built
# from the Go module proxy at the chart's versions (charts/pillar-csi/
# values.yaml), for the lab's claim tests that run the real ones. `go
# install` refuses these modules (their go.mod files carry replace
# directives), so each is built as the main module from a writable copy of
# its download, its version stamped in as the sidecars' release builds do
# (`-X main.version`). Cached in the same folder as csi-sanity; `--version`
# tells which release a binary is, so a second run only checks.
#
# node-driver-registrar and livenessprobe (the node DaemonSet's sidecars)
# are not built: the module proxy refuses every version of them here.
set -euo pipefail

gobin="${XDG_CACHE_HOME:-$HOME/.cache}/pillar-csi/go-bin"
mkdir -p "$gobin"
export PATH="$PATH:/usr/local/go/bin"

# binary  module  version  package in the module
SIDECARS=(
  "csi-provisioner github.com/kubernetes-csi/external-provisioner/v6 v6.4.0 ./cmd/csi-provisioner"
  "csi-attacher github.com/kubernetes-csi/external-attacher/v4 v4.13.0 ./cmd/csi-attacher"
  "csi-resizer github.com/kubernetes-csi/external-resizer v1.14.0 ./cmd/csi-resizer"
)

for row in "${SIDECARS[@]}"; do
  read -r bin module version pkg <<<"$row"
  if "$gobin/$bin" --version 2>/dev/null | grep -qw "$version"; then
    continue
  fi
  dir=$(GOTOOLCHAIN=auto GOFLAGS=-mod=mod go mod download -json "$module@$version" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  work=$(mktemp -d "${TMPDIR:-/tmp}/sidecar.XXXXXX")
  cp -r "$dir/." "$work/"
  chmod -R u+w "$work"
  (cd "$work" && GOTOOLCHAIN=auto GOFLAGS=-mod=mod go build -trimpath \
    -ldflags "-X main.version=$version" -o "$gobin/$bin" "$pkg") \
    || { rm -rf "$work"; echo "deps-sidecars: building $bin from $module@$version failed" >&2; exit 1; }
  rm -rf "$work"
  "$gobin/$bin" --version 2>/dev/null | grep -qw "$version" \
    || { echo "deps-sidecars: $gobin/$bin --version does not say $version" >&2; exit 1; }
done
echo "deps-sidecars: ready ($(for row in "${SIDECARS[@]}"; do read -r b _ v _ <<<"$row"; printf "%s %s " "$b" "$v"; done))"
