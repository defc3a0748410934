#!/usr/bin/env bash
# Installs everything the build and the kernel lab need (see ../shared/lab.md).
# Idempotent: on a prepared machine it checks and returns within seconds.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

BACKPORTS_PKGS=(linux-image-amd64 linux-headers-amd64 zfs-dkms zfsutils-linux libzfslinux-dev qemu-system-x86)
MAIN_PKGS=(busybox-static lvm2 liblvm2-dev thin-provisioning-tools nvme-cli open-iscsi
  python3-rtslib-fb targetcli-fb xfsprogs e2fsprogs clang libclang-dev libudev-dev libblkid-dev
  pkg-config protobuf-compiler libprotobuf-dev openssl udev kmod iproute2 dmsetup
  containerd runc containernetworking-plugins iptables conntrack debootstrap nfs-kernel-server)

missing() {
  local p out=()
  for p in "$@"; do
    dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || out+=("$p")
  done
  echo "${out[@]:-}"
}

kernel_ready() {
  # A kernel image and the zfs module built for it.
  local v
  for v in $(ls /lib/modules 2>/dev/null); do
    [ -f "/boot/vmlinuz-$v" ] && find "/lib/modules/$v" -name 'zfs.ko*' 2>/dev/null | grep -q . && return 0
  done
  return 1
}

add_sources() {
  local f=/etc/apt/sources.list.d/pillar-csi-lab.sources
  [ -f "$f" ] && return 0
  # Same mirror and keyring as the machine's own debian.sources.
  local uri keyring
  uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  keyring=$(awk '/^Signed-By:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  : "${uri:=http://deb.debian.org/debian}"
  : "${keyring:=/usr/share/keyrings/debian-archive-keyring.gpg}"
  $SUDO tee "$f" >/dev/null <<SRC
Types: deb
URIs: $uri
Suites: bookworm
Components: contrib
Signed-By: $keyring

Types: deb
URIs: $uri
Suites: bookworm-backports
Components: main contrib
Signed-By: $keyring
SRC
  UPDATED=0
}

UPDATED=1
add_sources
need_bp=$(missing "${BACKPORTS_PKGS[@]}")
need_main=$(missing "${MAIN_PKGS[@]}")
if [ -n "$need_bp$need_main" ] || [ "$UPDATED" = 0 ]; then
  $SUDO apt-get update -q
fi
if [ -n "$need_main" ]; then
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -q --no-install-recommends $need_main
fi
if [ -n "$need_bp" ]; then
  # Headers first (one kernel only), so DKMS builds ZFS once, for that kernel.
  # INITRD=No: the lab boots the kernel without an initramfs (virtme-ng
  # loads the modules from the host's root), so the kernel's hook builds none.
  # shellcheck disable=SC2086
  $SUDO env INITRD=No apt-get install -y -q -t bookworm-backports $need_bp
fi
if ! kernel_ready; then
  v=$(ls /lib/modules | sort -V | tail -n1)
  $SUDO dkms autoinstall -k "$v"
fi
kernel_ready || { echo "deps: no kernel with a zfs module under /lib/modules" >&2; exit 1; }

if ! command -v vng >/dev/null 2>&1; then
  pip install -q virtme-ng
fi
command -v vng >/dev/null || { echo "deps: vng not on PATH after pip install" >&2; exit 1; }
# The independent gRPC JSON client of the InspectVolume lab test
# (tests/lab/agent_json.py): grpcurl is not packaged, so Python grpcio and
# grpc_tools.protoc stand in for it. The guest uses this same interpreter.
if ! python3 -c 'import grpc, grpc_tools.protoc, google.protobuf.json_format' >/dev/null 2>&1; then
  pip install -q grpcio grpcio-tools
fi
python3 -c 'import grpc, grpc_tools.protoc' || { echo "deps: python3 cannot import grpc and grpc_tools after pip install" >&2; exit 1; }
# The chart tests' Python tools, in a pinned venv of their own.
bash "$(dirname "$0")/chart-deps.sh"
# Go, for the csi.v1 conformance check (proto/csi/conformance, whose go.mod
# asks for go 1.23): a Go already on the machine if new enough, else Debian's
# from bookworm-backports. Then the check's modules (pinned by go.sum) into the
# module cache, so later runs need no network.
export PATH="$PATH:/usr/local/go/bin"
go_ok() {
  local v
  v=$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null) || return 1
  v=${v#go}
  [ "$(printf '%s\n' 1.23 "$v" | sort -V | head -n1)" = 1.23 ]
}
if ! go_ok; then
  $SUDO apt-get install -y -q --no-install-recommends -t bookworm-backports golang-go
fi
go_ok || { echo "deps: no go >= 1.23 on PATH after installing golang-go" >&2; exit 1; }
(cd "$(dirname "$0")/../proto/csi/conformance" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go mod download)
# protoc-gen-go for the recovery cross-language check
# (proto/recovery-sign/crosslang.rs): the version of the protobuf module the
# spec's Go program builds against, into a cache folder of its own; then
# that program's modules (pinned by its go.sum).
gobin="${XDG_CACHE_HOME:-$HOME/.cache}/pillar-csi/go-bin"
if [ "$("$gobin/protoc-gen-go" --version 2>/dev/null)" != "protoc-gen-go v1.33.0" ]; then
  mkdir -p "$gobin"
  GOTOOLCHAIN=local GOBIN="$gobin" go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.33.0
fi
(cd "$(dirname "$0")/../proto/recovery-sign" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go mod download)
# csi-sanity (kubernetes-csi/csi-test), the CSI conformance suite the lab
# runs against the controller and node services (tests/tests/claim_sanity_lab.rs),
# into the same cache folder; `go version -m` tells which release a binary is.
if ! go version -m "$gobin/csi-sanity" 2>/dev/null | grep -q 'csi-test/v5[[:space:]]*v5.4.0'; then
  mkdir -p "$gobin"
  GOTOOLCHAIN=local GOBIN="$gobin" go install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@v5.4.0
fi
# grpcurl and csc, the independent gRPC clients of the CSI endpoints' test
# (src/tests/unix_authority.rs), into the same cache folder. grpcurl v1.8.9:
# the last release whose -unix dials the socket (1.9's dialer ignores it) and
# that sends the socket's path, percent-encoded, as :authority. csc from gocsi
# v1.2.2, built in scripts/csc/, whose go.sum pins its modules.
if ! go version -m "$gobin/grpcurl" 2>/dev/null | grep -q 'fullstorydev/grpcurl[[:space:]]*v1.8.9'; then
  mkdir -p "$gobin"
  GOTOOLCHAIN=local GOBIN="$gobin" go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.8.9
fi
if ! go version -m "$gobin/csc" 2>/dev/null | grep -q 'rexray/gocsi[[:space:]]*v1.2.2'; then
  mkdir -p "$gobin"
  (cd "$(dirname "$0")/csc" && GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
    go build -o "$gobin/csc" github.com/rexray/gocsi/csc)
fi
# Helm v4.3.2, the CLI an operator installs the chart with: the lab installs
# the chart with it on the cluster whose kubelet runs the driver's images
# (tests/tests/claim_chart_lab.rs). Same cache folder.
if ! go version -m "$gobin/helm" 2>/dev/null | grep -q 'helm.sh/helm/v4[[:space:]]*v4.3.2'; then
  mkdir -p "$gobin"
  GOTOOLCHAIN=local GOBIN="$gobin" go install helm.sh/helm/v4/cmd/helm@v4.3.2
fi
# `make fuzz`: cargo-fuzz, with the nightly toolchain the machine's rustup
# carries (installed through rustup when it is missing).
export PATH="$HOME/.cargo/bin:$PATH"
if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
# The real Kubernetes API server and kube-controller-manager of the
# controller's, the chart's and the claim lab's tests, and the CSI sidecars
# the chart deploys (tests/tests/claim_k8s_lab.rs).
bash "$(dirname "$0")/deps-apiserver.sh"
bash "$(dirname "$0")/deps-sidecars.sh"
# The Debian base of the lab's container images (the chart's install).
python3 "$(dirname "$0")/deps-image-base.py"
echo "deps: ready (kernel $(ls /lib/modules | sort -V | tail -n1))"
