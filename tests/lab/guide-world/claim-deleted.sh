# Before adopt-lv.md's "Rebind a retained volume": the workload's claim
# default/data-legacy was deleted; its PV (Retain) is Released.
set -euo pipefail
PV=$(kubectl get pvc data-legacy -o jsonpath='{.spec.volumeName}')
kubectl delete pvc data-legacy --wait=true
for _ in $(seq 120); do
  [ "$(kubectl get pv "$PV" -o jsonpath='{.status.phase}')" = Released ] && exit 0
  sleep 1
done
echo "PV $PV did not become Released" >&2
exit 1
