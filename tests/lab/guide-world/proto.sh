# adopt-lv.md, "The .proto file": the agent's .proto of this commit, which
# the guide downloads from GitHub (no network in the lab): $1, the checkout's.
set -euo pipefail
mkdir -p proto/pillar_csi/agent/v1
cp "$1" proto/pillar_csi/agent/v1/agent.proto
