# Before import-zvol.md's "The way back": the restore point of step 3, as
# an operator who has not yet cleaned up (step 6 destroyed it) still has it.
set -euo pipefail
zfs snapshot tank/k8s/pvc-0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10@pre-pillar
