#!/usr/bin/env bash
# trax-qkv-serve under load (docs/serving.md, docs/benchmarks.md "Serving"):
# 8 clients x 100 one-sentence requests of test2016, 3 rounds after a
# warm-up round, every answer checked against trax-qkv-translate's line,
# malformed requests sent throughout; then a second identical
# trax-qkv-translate command, timed against the first (a fresh
# compilation cache). Run it on an otherwise idle machine.
#
#   scripts/serve_bench.sh [OUTPUT_DIR]     default runs/serve
#   MODEL_DIR=DIR SENTENCES=FILE scripts/serve_bench.sh
#       default runs/multi30k/trax (scripts/multi30k.sh) and
#       ../shared/data/multi30k/test2016.de
set -euo pipefail
source "$(dirname "$0")/_common.sh"
out=${1:-runs/serve}
model=${MODEL_DIR:-runs/multi30k/trax}
sentences=${SENTENCES:-../shared/data/multi30k/test2016.de}

run trax-qkv-bench --only serve --model_dir "$model" --sentences "$sentences" \
  --output_dir "$out"
for attempt in first second; do
  start=$(date +%s.%N)
  run_io "$sentences" "$out/translate_$attempt.txt" \
    trax-qkv-translate --model_dir "$model" --compilation_cache "$out/xla"
  [[ -n "${TRAX_QKV_DRY_RUN:-}" ]] || awk -v a="$attempt" -v s="$start" \
    -v e="$(date +%s.%N)" 'BEGIN { printf "%s: %.1f s\n", a, e - s }' \
    >>"$out/translate_seconds.txt"
done
