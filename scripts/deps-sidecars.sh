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
# external-snapshotter gives two: csi-snapshotter (the chart's sidecar) and
# snapshot-controller (a cluster component the lab runs beside the API
# server). Its go.mod replaces its client module with `./client`, a folder
# its module download leaves out (a folder with its own go.mod is a module
# of its own), so the client module is fetched at the version go.mod
# requires and put there. The client carries the VolumeSnapshot CRDs,
# copied to `snapshot-crds/` beside the binaries (v1 only, without CEL
# rules, which the lab's 1.20 API server would refuse).
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
  "csi-snapshotter github.com/kubernetes-csi/external-snapshotter/v7 v7.0.2 ./cmd/csi-snapshotter"
  "snapshot-controller github.com/kubernetes-csi/external-snapshotter/v7 v7.0.2 ./cmd/snapshot-controller"
)
crds="$gobin/snapshot-crds"

download() { # module@version -> its folder in the module cache
  GOTOOLCHAIN=auto GOFLAGS=-mod=mod go mod download -json "$1" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])'
}

for row in "${SIDECARS[@]}"; do
  read -r bin module version pkg <<<"$row"
  if "$gobin/$bin" --version 2>/dev/null | grep -qw "$version" \
    && { [ "$bin" != snapshot-controller ] || [ -f "$crds/$version" ]; }; then
    continue
  fi
  dir=$(download "$module@$version")
  work=$(mktemp -d "${TMPDIR:-/tmp}/sidecar.XXXXXX")
  cp -r "$dir/." "$work/"
  chmod -R u+w "$work"
  client=$(awk '$1 == "replace" && $3 == "=>" && $4 == "./client" {print $2}' "$work/go.mod")
  if [ -n "$client" ]; then
    client_version=$(awk -v m="$client" '$1 == m {print $2; exit}' "$work/go.mod")
    cp -r "$(download "$client@$client_version")/." "$work/client/"
    chmod -R u+w "$work/client"
    if [ "$bin" = snapshot-controller ]; then
      rm -rf "$crds" && mkdir -p "$crds"
      cp "$work"/client/config/crd/snapshot.storage.k8s.io_*.yaml "$crds/"
      if grep -l x-kubernetes-validations "$crds"/*.yaml; then
        echo "deps-sidecars: these CRDs carry CEL rules the lab's API server refuses" >&2
        exit 1
      fi
      echo "$client@$client_version" >"$crds/$version"
    fi
  fi
  (cd "$work" && GOTOOLCHAIN=auto GOFLAGS=-mod=mod go build -trimpath \
    -ldflags "-X main.version=$version" -o "$gobin/$bin" "$pkg") \
    || { rm -rf "$work"; echo "deps-sidecars: building $bin from $module@$version failed" >&2; exit 1; }
  rm -rf "$work"
  "$gobin/$bin" --version 2>/dev/null | grep -qw "$version" \
    || { echo "deps-sidecars: $gobin/$bin --version does not say $version" >&2; exit 1; }
done
echo "deps-sidecars: ready ($(for row in "${SIDECARS[@]}"; do read -r b _ v _ <<<"$row"; printf "%s %s " "$b" "$v"; done))"
