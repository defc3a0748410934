# The guide world's storage node and nodes, before the first guide: the
# storage node's address on the loopback, the pool `tank` and the volume
# group `vg0` (file-backed in the lab's work folder; the install guide makes
# `tank/k8s` and the thin pool `thin0`), and the Nodes `storage-1` and
# `worker-1` as their kubelets would register them.
set -euo pipefail
images=$(dirname "$PWD")
ip link set lo up
ip addr add 192.0.2.10/32 dev lo
truncate -s 4G "$images/guides-tank.img"
zpool create -f -o cachefile=none -m none tank "$images/guides-tank.img"
truncate -s 2G "$images/guides-vg0.img"
loop=$(losetup -f --show "$images/guides-vg0.img")
pvcreate -q "$loop"
vgcreate -q vg0 "$loop"
kubectl apply -f - <<'YAML'
apiVersion: v1
kind: Node
metadata:
  name: storage-1
  labels: {kubernetes.io/hostname: storage-1}
---
apiVersion: v1
kind: Node
metadata:
  name: worker-1
  labels: {kubernetes.io/hostname: worker-1}
  annotations: {volumes.kubernetes.io/controller-managed-attach-detach: "true"}
YAML
