#!/usr/bin/env bash
# The main job (README "The main job", docs/results.md): two small
# Transformers trained from one seed on the same batches of the numbers
# corpus, one with Trax's tl.AttentionQKV in cross-attention, one with
# trax_qkv's 'reference'; each decodes the 500 test numbers greedily and by
# beam search, scored with sacreBLEU. About 6 minutes on 2 CPU cores.
#
#   scripts/main_job.sh [OUTPUT_DIR]     default runs/validate
#
# Writes OUTPUT_DIR/summary.json, report.md, the decodes, loss curves and
# both model directories (docs/runs/validate_py313 holds one run's small
# files); a rerun after a stop resumes exactly. Then each site in turn:
# OUTPUT_DIR/every_site, with trax_qkv in all three attention sites.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
out=${1:-runs/validate}

run trax-qkv-validate --output_dir "$out"
run trax-qkv-validate --implementations trax reference auto \
  --sites self_attention causal_attention cross_attention \
  --output_dir "$out/every_site"
