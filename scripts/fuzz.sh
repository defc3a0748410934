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
cargo +nightly fuzz build -O 2>"$scratch/build.log" || { cat "$scratch/build.log" >&2; exit 1; }
for target in $(cargo +nightly fuzz list); do
  mkdir -p "corpus/$target" "$scratch/$target"
  log="$scratch/$target.log"
  if ! cargo +nightly fuzz run -O "$target" "$scratch/$target" "corpus/$target" -- \
      -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fuzz: $target FAILED (input kept under fuzz/artifacts/$target/)" >&2
    exit 1
  fi
  runs=$(awk '/stat::number_of_executed_units/{print $2}' "$log" | tail -n1)
  echo "fuzz: $target: ${runs:-?} executions in ${seconds} s, no crash"
  if [ "$merge" = "--merge" ]; then
    cargo +nightly fuzz run -O "$target" "corpus/$target" "$scratch/$target" -- -merge=1 >/dev/null 2>&1
  fi
done
