#!/usr/bin/env bash
# A real Kubernetes API server (etcd + kube-apiserver 1.20, installed by
# `make deps`) on loopback, for the controller's and the chart's tests.
#
#   scripts/apiserver.sh start DIR   start it; DIR holds its data and logs
#   scripts/apiserver.sh stop DIR    stop what `start DIR` started
#
# `start` returns once /readyz answers and leaves in DIR:
#   kubeconfig               the admin (group system:masters)
#   kubeconfig-<name>        one per ServiceAccount of namespace pillar-csi:
#                            pillar-csi-controller, pillar-csi-node,
#                            pillar-csi-agent (token users named
#                            system:serviceaccount:pillar-csi:<name>, so RBAC
#                            bindings to those ServiceAccounts apply to them)
#   kubeconfig-kubelet       a node's kubelet: user system:node:lab in group
#                            system:nodes (the lab's kubelet test binds the
#                            system:node ClusterRole to that group)
#   env                      APISERVER=<url> and KUBECONFIG=<admin kubeconfig>
#   ca.crt                   the CA that signed the server's certificate
# The namespace pillar-csi exists. Authorization is RBAC. Privileged pods are
# allowed, as in kubeadm and kind clusters (the CSI node plugin and the agent are).
#
# PILLAR_APISERVER_ADVERTISE=IP: the address Pods reach the server at (the
# `kubernetes` Service's endpoint; the lab's guest reaches the host at
# 10.0.2.2). The serving certificate (signed by DIR/ca.crt) then names it and the Service's
# cluster IP 10.96.0.1, which in-cluster clients dial through kube-proxy.
# The server still listens on 127.0.0.1 only.
set -euo pipefail

ACCOUNTS=(pillar-csi-controller pillar-csi-node pillar-csi-agent)
NAMESPACE=pillar-csi

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1 dir=$2

free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

kubeconfig() { # FILE USER TOKEN URL
  cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {server: "$4", insecure-skip-tls-verify: true}
users:
- name: $2
  user: {token: "$3"}
contexts:
- name: $2@lab
  context: {cluster: lab, user: $2, namespace: $NAMESPACE}
current-context: $2@lab
KC
}

stop() {
  local f pid
  for f in apiserver etcd; do
    [ -f "$dir/$f.pid" ] || continue
    pid=$(cat "$dir/$f.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/$f.pid"
  done
  if [ -f "$dir/etcd.data" ]; then
    local data
    data=$(cat "$dir/etcd.data")
    case $data in /dev/shm/pillar-etcd.*) rm -rf "$data" ;; esac
    rm -f "$dir/etcd.data"
  fi
}

start() {
  for b in etcd kube-apiserver kubectl openssl; do
    command -v "$b" >/dev/null || { echo "apiserver: $b not found; run 'make deps'" >&2; exit 2; }
  done
  [ ! -f "$dir/apiserver.pid" ] || { echo "apiserver: $dir already has a running server; stop it first" >&2; exit 2; }
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  read -r etcd_client etcd_peer secure < <(free_ports 3)
  local url="https://127.0.0.1:$secure"

  local advertise=${PILLAR_APISERVER_ADVERTISE:-127.0.0.1} sans=IP:127.0.0.1,DNS:localhost
  [ "$advertise" = 127.0.0.1 ] || sans+=",IP:$advertise,IP:10.96.0.1,DNS:kubernetes.default.svc"
  # A cluster CA (ca.crt, what Pods get as their ServiceAccount's ca.crt)
  # and the server's certificate signed by it, as kubeadm makes them: TLS
  # stacks such as rustls refuse a CA certificate as a server's own.
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=lab-kubernetes-ca \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver \
    -keyout "$dir/serving.key" -out "$dir/serving.csr" 2>/dev/null
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=%s\n' "$sans" >"$dir/serving.ext"
  openssl x509 -req -in "$dir/serving.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days 2 -extfile "$dir/serving.ext" -out "$dir/serving.crt" 2>/dev/null
  openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null

  local admin_token name token
  admin_token=$(openssl rand -hex 16)
  echo "$admin_token,admin,admin,system:masters" >"$dir/tokens.csv"
  kubeconfig "$dir/kubeconfig" admin "$admin_token" "$url"
  for name in "${ACCOUNTS[@]}"; do
    token=$(openssl rand -hex 16)
    echo "$token,system:serviceaccount:$NAMESPACE:$name,$name,\"system:serviceaccounts,system:serviceaccounts:$NAMESPACE,system:authenticated\"" >>"$dir/tokens.csv"
    kubeconfig "$dir/kubeconfig-$name" "$name" "$token" "$url"
  done
  token=$(openssl rand -hex 16)
  echo "$token,system:node:lab,kubelet,system:nodes" >>"$dir/tokens.csv"
  kubeconfig "$dir/kubeconfig-kubelet" kubelet "$token" "$url"
  chmod 600 "$dir"/tokens.csv "$dir"/kubeconfig* "$dir"/*.key

  # etcd's data in memory when /dev/shm takes it: on the disk, its fsyncs
  # wait behind the lab guests' pool images being flushed (ext4 commits
  # other files' dirty data first), and a request that waits tens of
  # seconds outlasts the sidecars' leader leases. The data lives as long
  # as the server; `stop` removes it.
  local data
  data=$(mktemp -d /dev/shm/pillar-etcd.XXXXXX 2>/dev/null) || data="$dir/etcd"
  echo "$data" >"$dir/etcd.data"
  etcd --name lab --data-dir "$data" \
    --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "lab=http://127.0.0.1:$etcd_peer" >"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
  kube-apiserver --etcd-servers "http://127.0.0.1:$etcd_client" \
    --bind-address 127.0.0.1 --advertise-address "$advertise" --secure-port "$secure" \
    --tls-cert-file "$dir/serving.crt" --tls-private-key-file "$dir/serving.key" \
    --service-account-key-file "$dir/sa.pub" --service-account-signing-key-file "$dir/sa.key" \
    --service-account-issuer https://kubernetes.default.svc --token-auth-file "$dir/tokens.csv" \
    --authorization-mode RBAC --service-cluster-ip-range 10.96.0.0/24 \
    --allow-privileged=true >"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"

  local i ok=""
  for i in $(seq 600); do
    if curl -skf -H "Authorization: Bearer $admin_token" "$url/readyz" >/dev/null 2>&1; then ok=1; break; fi
    kill -0 "$(cat "$dir/apiserver.pid")" 2>/dev/null && kill -0 "$(cat "$dir/etcd.pid")" 2>/dev/null || break
    sleep 0.2
  done
  if [ -z "$ok" ]; then
    echo "apiserver: not ready after 120 s; the last lines of its log ($dir/apiserver.log):" >&2
    tail -n 20 "$dir/apiserver.log" >&2
    stop
    exit 1
  fi
  printf 'APISERVER=%s\nKUBECONFIG=%s\n' "$url" "$dir/kubeconfig" >"$dir/env"
  KUBECONFIG="$dir/kubeconfig" kubectl create namespace "$NAMESPACE" >/dev/null
  echo "apiserver: ready at $url (admin kubeconfig $dir/kubeconfig)"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
