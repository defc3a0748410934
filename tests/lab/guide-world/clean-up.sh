# After the guides: the world's claims, volumes, records and custom
# resources go (finalizers dropped: no controller runs any more), then its
# pool, volume group and address. The API server is shared with the other
# claim tests of the lab run. Best effort for what may be gone already; the
# listing of the world's objects must work.
set -uo pipefail
images=$(dirname "$PWD")
for c in data-postgres-0 data-legacy data-legacy-2 data-test; do
  kubectl patch pvc "$c" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1
  kubectl delete pvc "$c" --wait=false --ignore-not-found >/dev/null
done
kubectl delete statefulset postgres --ignore-not-found >/dev/null
for kind in pv pillarvolumestate pillarvolumereservation; do
  objects=$(kubectl get "$kind" -o json | jq -r '.items[]
      | select(((.spec.csi.volumeHandle // .spec.agentRef // "") | startswith("storage-1"))
        or .metadata.name == "pvc-0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10")
      | .metadata.name') || { echo "clean-up: cannot list the world's $kind objects" >&2; exit 1; }
  for o in $objects; do
    kubectl patch "$kind" "$o" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1
    kubectl delete "$kind" "$o" --wait=false --ignore-not-found >/dev/null
  done
done
kubectl delete pillarstorageclass hot hot-retain lvm-retain --ignore-not-found >/dev/null
kubectl delete storageclass pillar-hot pillar-hot-retain pillar-lvm-retain --ignore-not-found >/dev/null
kubectl delete pillarstore storage-1-hot storage-1-lvm --ignore-not-found >/dev/null
kubectl delete pillarprotocol nvmeof-default iscsi-default --ignore-not-found >/dev/null
kubectl delete pillaragent storage-1 --ignore-not-found >/dev/null
kubectl delete node storage-1 worker-1 --ignore-not-found >/dev/null
kubectl delete csinode worker-1 --ignore-not-found >/dev/null
zpool destroy -f tank
vgremove -q -f vg0
for loop in $(losetup -j "$images/guides-vg0.img" -O NAME --noheadings); do
  pvremove -q -f "$loop"; losetup -d "$loop"
done
rm -f "$images/guides-tank.img" "$images/guides-vg0.img"
ip addr del 192.0.2.10/32 dev lo
