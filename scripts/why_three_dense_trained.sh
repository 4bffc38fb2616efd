#!/usr/bin/env bash
# Why three Dense layers? The trained-model measurement pre-registered in
# docs/why_three_dense.md ("The trained-model measurement"): Trax's layer
# ('reference'), no_projection, shared_query_key, raw_values and
# multi_query in the encoder's and decoder's self-attention, each from
# SEEDS (default 0 1 2), on the model and data of the seeded runs
# (Multi30k de -> en, 2+2 layers, d_model 128, 4 heads, batch 64) but
# trained STEPS steps (default 6000), evaluated on the whole validation
# split every 1,000. The primary measure is the eval loss at the last
# step; trax-qkv-compare --seeds gives the paired intervals and Holm's
# correction, and with --margin 0.05 each variant's decision
# (trax_qkv.research.statistics.decide) and whether the reference's eval
# loss had flattened.
#
#   scripts/why_three_dense_trained.sh [OUTPUT_DIR]   default runs/why_trained
#   STEPS=8000 scripts/why_three_dense_trained.sh      train on, exactly
#
# About 6-8 hours of both cores at 6,000 steps: resumable run by run, so
# it can run in sittings. If the reference's validation loss is still
# falling by 0.02 nats or more over its last 2,000 steps in any seed, run
# it again with more STEPS: each model resumes from its checkpoint (the
# learning-rate schedule depends on the step only). To fix the last step
# before the variants are trained to it, run the reference alone first
# (MODELS=reference) with growing STEPS until compare's last line says
# "flattened"; a run stopped by any signal keeps its last 1,000-step
# checkpoint, so a long STEPS may also be stopped once the eval loss in
# its log has flattened and rerun with STEPS at that checkpoint.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
out=${1:-runs/why_trained}
data=${MULTI30K:-../shared/data/multi30k}
steps=${STEPS:-6000}
read -r -a seeds <<<"${SEEDS:-0 1 2}"
# multi_query is the optional fifth model: MODELS="reference no_projection
# shared_query_key raw_values" runs the four first, and a later run with
# all five resumes them and adds it.
read -r -a models <<<"${MODELS:-reference no_projection shared_query_key raw_values multi_query}"
settings=(--source_dir "$data" --keys de en --vocab_size 8192 --d_model 128
          --d_ff 256 --n_layers 2 --n_heads 4 --dropout 0.1
          --label_smoothing 0.1 --max_length 64 --batch_size 64
          --steps "$steps" --learning_rate 0.002 --warmup_steps 400
          --lr_factors 'constant * linear_warmup * rsqrt_decay'
          --eval_every 1000 --eval_batches 0 --beam_sentences 200
          --heatmap_sentences 0 --score_sentences 50)

runs=()
for seed in "${seeds[@]}"; do
  runs+=("$out/seed$seed")
  run trax-qkv-validate "${settings[@]}" \
    --sites self_attention causal_attention --seed "$seed" \
    --implementations "${models[@]}" --output_dir "$out/seed$seed"
  run trax-qkv-circuits "$out/seed$seed"
  run trax-qkv-circuits --initial_scores --source_dir "$data" "$out/seed$seed"
done
run trax-qkv-compare --seeds "${runs[@]}" --source_dir "$data" --margin 0.05 \
  --output_dir "$out"
