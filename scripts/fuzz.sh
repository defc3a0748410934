#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a bounded time (seconds, default
# 30) with its committed corpus (fuzz/corpus/<target>, read only: new inputs
# go to a scratch folder), and prints one line per target with the number of
# executions. A crash fails the run and leaves its input under
# fuzz/artifacts/<target>/. `--merge` (make fuzz-long) folds the new inputs
# into the committed corpus, minimized.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-30}
merge=${2:-}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export PATH="$HOME/.cargo/bin:$PATH"
# The nightly, sanitized builds in a folder of their own beside the stable
# ones when the Makefile moved Cargo's target folder out of the clone.
if [ -n "${CARGO_TARGET_DIR:-}" ]; then export CARGO_TARGET_DIR=$CARGO_TARGET_DIR/fuzz; fi
cargo +nightly fuzz build -O 2>"$scratch/build.log" || { cat "$scratch/build.log" >&2; exit 1; }
# One target per core at a time (each fuzzer is one process on one core);
# the lines are printed in the targets' order once all have run.
run_one() {
  local target=$1 log="$scratch/$1.log" rc
  mkdir -p "corpus/$target" "$scratch/$target"
  cargo +nightly fuzz run -O "$target" "$scratch/$target" "corpus/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1 && rc=0 || rc=$?
  echo "$rc" >"$scratch/$target.rc"
}
targets=$(cargo +nightly fuzz list)
jobs=$(nproc)
for target in $targets; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run_one "$target" &
done
wait
failed=0
for target in $targets; do
  log="$scratch/$target.log"
  if [ "$(cat "$scratch/$target.rc")" != 0 ]; then
    tail -n 40 "$log" >&2
    echo "fuzz: $target FAILED (input kept under fuzz/artifacts/$target/)" >&2
    failed=1
    continue
  fi
  runs=$(awk '/stat::number_of_executed_units/{print $2}' "$log" | tail -n1)
  echo "fuzz: $target: ${runs:-?} executions in ${seconds} s, no crash"
  if [ "$merge" = "--merge" ]; then
    cargo +nightly fuzz run -O "$target" "corpus/$target" "$scratch/$target" -- -merge=1 >/dev/null 2>&1
  fi
done
exit "$failed"
