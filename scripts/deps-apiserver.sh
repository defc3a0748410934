#!/usr/bin/env bash
# Installs the real Kubernetes control plane the controller's, the chart's
# and the claim lab's tests run against (see ../shared/lab.md, "A real
# Kubernetes API server"): etcd and kubectl from Debian, kube-apiserver,
# kube-controller-manager, kube-scheduler and kubelet 1.20 built offline from
# Debian's source package (which ships only kubectl as a binary). The build
# (~7 minutes on 2 cores for the API server, a few more for each other
# component) is cached under $CACHE; a second run only checks and returns.
# kubelet is built with cgo (1.20's hack/lib/golang.sh does not list it as
# static), linked to the host's glibc, which the lab guest shares.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

CACHE=${PILLAR_CACHE:-/var/cache/pillar-csi}
VERSION=1.20.2
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
PKGS=(etcd-server golang-1.19-go rsync golang-github-modern-go-reflect2-dev dpkg-dev)
# kubectl: Debian's (the server's release) unless the machine has one already
# (a newer kubectl from another package owns /usr/bin/kubectl on some images).
command -v kubectl >/dev/null || PKGS+=(kubernetes-client)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

need=()
for c in "${COMPONENTS[@]}"; do
  [ -x "$CACHE/$c-$VERSION" ] || need+=("$c")
done
if [ ${#need[@]} -gt 0 ]; then
  $SUDO mkdir -p "$CACHE"
  src=/etc/apt/sources.list.d/pillar-csi-src.sources
  if [ ! -f "$src" ]; then
    uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    keyring=$(awk '/^Signed-By:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    $SUDO tee "$src" >/dev/null <<SRC
Types: deb-src
URIs: ${uri:-http://deb.debian.org/debian}
Suites: bookworm
Components: main
Signed-By: ${keyring:-/usr/share/keyrings/debian-archive-keyring.gpg}
SRC
    $SUDO apt-get update -q
  fi
  work=$(mktemp -d "${TMPDIR:-/tmp}/kube-src.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && apt-get source --download-only -q kubernetes)
  orig=$(ls "$work"/kubernetes_*.orig.tar.gz | head -n1)
  mkdir "$work/src"
  tar -xzf "$orig" -C "$work/src" --strip-components=1
  cd "$work/src"
  # The vendored reflect2 v1.0.1 crashes under Go >= 1.18 on the first CRD
  # write; Debian's v1.0.2 replaces it.
  rm -rf vendor/github.com/modern-go/reflect2
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
  sed -i 's|github.com/modern-go/reflect2 v1.0.1|github.com/modern-go/reflect2 v1.0.2|' go.mod vendor/modules.txt
  grep -q 'modern-go/reflect2 v1.0.2' vendor/modules.txt || { echo "deps-apiserver: reflect2 not replaced in vendor/modules.txt" >&2; exit 1; }
  PATH=/usr/lib/go-1.19/bin:$PATH GOFLAGS=-mod=vendor make WHAT="${need[*]/#/cmd/}" >"$work/build.log" 2>&1 \
    || { tail -n 40 "$work/build.log" >&2; exit 1; }
  for c in "${need[@]}"; do
    $SUDO install -m 0755 "_output/bin/$c" "$CACHE/$c-$VERSION"
  done
fi
for c in "${COMPONENTS[@]}"; do
  [ -x "/usr/local/bin/$c" ] && cmp -s "$CACHE/$c-$VERSION" "/usr/local/bin/$c" \
    || $SUDO install -m 0755 "$CACHE/$c-$VERSION" "/usr/local/bin/$c"
done
for b in etcd kubectl "${COMPONENTS[@]}"; do
  command -v "$b" >/dev/null || { echo "deps-apiserver: $b missing after install" >&2; exit 1; }
done
echo "deps-apiserver: ready ($(for c in "${COMPONENTS[@]}"; do printf '%s %s ' "$c" "$("$c" --version | awk '{print $2}')"; done))"
