#!/usr/bin/env bash
# The speed tables (README "Speed", docs/benchmarks.md, docs/decoding.md):
# each part of trax-qkv-bench in turn, every contender interleaved with the
# built-in in one run, the spread of the per-round ratios printed. About
# an hour on 2 CPU cores; run it on an otherwise idle machine.
#
#   scripts/speed_tables.sh [OUTPUT_DIR]     default runs/bench
#
# Writes OUTPUT_DIR/<part>/bench_<part>.json and .md per part (the runs
# the docs cite are in docs/runs/bench_*).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
out=${1:-runs/bench}

for part in models roof decoding checkpoints distributed layers; do
  run trax-qkv-bench --only "$part" --output_dir "$out/$part"
done
run trax-qkv-bench-kernels --output_dir "$out/kernels"
