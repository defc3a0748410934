# Before import-zvol.md: what democratic-csi (zfs-generic-nvmeof) left. The
# zvol tank/k8s/pvc-0d52... with an ext4 filesystem holding data, its PV
# (driver org.democratic-csi.nvmeof, reclaim Delete) bound to the claim
# default/data-postgres-0 of the StatefulSet postgres.
set -euo pipefail
zvol=tank/k8s/pvc-0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10
zfs create -V 1G -o democratic-csi:csi_volume_name=pvc-0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10 "$zvol"
for _ in $(seq 60); do [ -e "/dev/zvol/$zvol" ] && break; sleep 1; done
mkfs.ext4 -q -F "/dev/zvol/$zvol"
mkdir -p old-driver-mnt
mount "/dev/zvol/$zvol" old-driver-mnt
echo 15 > old-driver-mnt/PG_VERSION
umount old-driver-mnt
rmdir old-driver-mnt
kubectl apply -f - <<'YAML'
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pvc-0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Delete
  storageClassName: zfs-nvmeof
  volumeMode: Filesystem
  claimRef: {namespace: default, name: data-postgres-0}
  csi:
    driver: org.democratic-csi.nvmeof
    volumeHandle: pvc-0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10
    fsType: ext4
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data-postgres-0
  namespace: default
  labels: {app: postgres}
spec:
  storageClassName: zfs-nvmeof
  accessModes: [ReadWriteOnce]
  volumeName: pvc-0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10
  resources: {requests: {storage: 1Gi}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: postgres
  namespace: default
spec:
  replicas: 1
  serviceName: postgres
  selector: {matchLabels: {app: postgres}}
  template:
    metadata: {labels: {app: postgres}}
    spec:
      containers:
        - name: postgres
          image: postgres:15
          volumeMounts: [{name: data, mountPath: /var/lib/postgresql/data}]
  volumeClaimTemplates:
    - metadata: {name: data, labels: {app: postgres}}
      spec:
        storageClassName: zfs-nvmeof
        accessModes: [ReadWriteOnce]
        resources: {requests: {storage: 1Gi}}
YAML
for _ in $(seq 120); do
  [ "$(kubectl get pvc data-postgres-0 -o jsonpath='{.status.phase}')" = Bound ] && exit 0
  sleep 1
done
echo "the old driver's claim data-postgres-0 did not bind" >&2
exit 1
