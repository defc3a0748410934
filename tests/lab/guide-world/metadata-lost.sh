# Before recovery.md's procedure: the claim, the PV, the PillarVolumeState
# and the PillarVolumeReservation of vg0/legacy are lost (the cluster's API
# data was, while no controller ran); the agent's fence mark and the LV
# survive.
set -euo pipefail
PV=$(kubectl get pillarvolumestate -o json \
  | jq -r '.items[] | select(.spec.agentVolumeID == "vg0/legacy") | .metadata.name')
[ -n "$PV" ] || { echo "no PillarVolumeState for vg0/legacy" >&2; exit 1; }
for claim in $(kubectl get pvc -o json | jq -r --arg pv "$PV" '.items[] | select(.spec.volumeName == $pv) | .metadata.name'); do
  kubectl patch pvc "$claim" --type=merge -p '{"metadata":{"finalizers":null}}'
  kubectl delete pvc "$claim" --wait=true
done
kubectl patch pv "$PV" --type=merge -p '{"metadata":{"finalizers":null}}'
kubectl delete pv "$PV" --wait=true
kubectl patch pillarvolumestate "$PV" --type=merge -p '{"metadata":{"finalizers":null}}'
kubectl delete pillarvolumestate "$PV" --wait=true
for r in $(kubectl get pillarvolumereservation -o json \
    | jq -r '.items[] | select(.spec.agentVolumeID == "vg0/legacy") | .metadata.name'); do
  kubectl patch pillarvolumereservation "$r" --type=merge -p '{"metadata":{"finalizers":null}}'
  kubectl delete pillarvolumereservation "$r" --wait=true
done
