# The CSINode of `worker-1` as node-driver-registrar registers the node
# plugin with kubelet: the driver and its node ID ($1, from NodeGetInfo).
set -euo pipefail
kubectl apply -f - <<YAML
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata:
  name: worker-1
spec:
  drivers:
    - name: pillar-csi.bhyoo.com
      nodeID: "$1"
      topologyKeys: []
YAML
