#!/usr/bin/env bash
# The chart tests' Python tools (tests/chart/), in a venv of their own, with
# pinned versions. Idempotent: when the venv already has exactly these
# versions it returns at once. scripts/deps.sh calls it; `make chart` runs
# the tests with this venv's python (`scripts/chart-deps.sh --python` prints its path).
set -euo pipefail

VENV="${PILLAR_CHART_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/pillar-csi/chart-venv}"
PINS=(
  helm-python-sdk==0.2.2      # Helm 4's SDK as a library: render and lint, no helm binary
  kubernetes-validate==1.37.0 # the Kubernetes schemas, 1.25-1.37
  jsonschema==4.26.0          # examples/ against the CRDs' openAPIV3Schema
  PyYAML==6.0.3
  pytest==9.2.0
)
STAMP="$VENV/.pins"
if [ "${1:-}" = --python ]; then
  echo "$VENV/bin/python"
  exit 0
fi

if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "${PINS[*]}" ]; then
  exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}"
"$VENV/bin/python" -c 'import helm_python, kubernetes_validate, jsonschema, yaml, pytest' \
  || { echo "chart-deps: the venv at $VENV cannot import its tools" >&2; exit 1; }
printf '%s' "${PINS[*]}" >"$STAMP"
echo "chart-deps: venv ready at $VENV"
