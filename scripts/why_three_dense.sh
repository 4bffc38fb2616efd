#!/usr/bin/env bash
# Why three Dense layers? (docs/why_three_dense.md) Trax's cross-attention
# layer ('reference', bit-identical to tl.AttentionQKV) and three variants
# of it (trax_qkv.layers.variants: no input projections, one shared
# projection, one head) trained from one seed on the same batches: first
# the main job's numbers corpus with its settings, then Multi30k de -> en
# with a smaller budget than the README's run (a 2+2-layer Transformer,
# d_model 256, 8 heads, 1,000 steps of batch 64: about 2 epochs; beam
# search on the first 200 test sentences). Then one table of both, and
# the cross-attention maps of each model for one sentence, side by side.
# About two hours on 2 CPU cores.
#
#   scripts/why_three_dense.sh [OUTPUT_DIR]     default runs/why_three_dense
#   MULTI30K=DIR scripts/why_three_dense.sh     the data (default
#                                               ../shared/data/multi30k)
#
# Resumable: run it again after a stop and training continues from the last
# checkpoint, exactly.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
out=${1:-runs/why_three_dense}
data=${MULTI30K:-../shared/data/multi30k}
models=(reference no_projection shared_projection one_head)

run trax-qkv-validate --implementations "${models[@]}" \
  --output_dir "$out/numbers"
run trax-qkv-validate --source_dir "$data" --keys de en \
  --vocab_size 8192 --d_model 256 --d_ff 512 --n_layers 2 --n_heads 8 \
  --dropout 0.1 --label_smoothing 0.1 --max_length 64 --batch_size 64 \
  --steps 1000 --learning_rate 0.002 --warmup_steps 400 \
  --lr_factors 'constant * linear_warmup * rsqrt_decay' --eval_every 500 \
  --beam_sentences 200 --implementations "${models[@]}" \
  --output_dir "$out/multi30k"
run trax-qkv-compare --runs "$out/numbers" "$out/multi30k" \
  --sources 'nine hundred and eighty-seven' \
  'Ein kleines Mädchen spielt mit einem roten Ball im Garten.' \
  --output_dir "$out"
