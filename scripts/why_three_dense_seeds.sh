#!/usr/bin/env bash
# Why three Dense layers? The seeded measurement (docs/why_three_dense.md,
# "How it was measured"): Trax's layer ('reference') and every projection
# variant of trax_qkv.layers.variants in the encoder's and decoder's
# self-attention (the question's case), then the four models of the
# one-seed page in the cross-attention, each from SEEDS (default 0 1 2)
# on Multi30k de -> en: a 2+2-layer Transformer, d_model 128, 4 heads,
# 1,000 steps of batch 64, every eval over the whole validation split,
# greedy decoding of the whole test set and beam search on its first 200
# sentences. trax-qkv-circuits then reads each model's QK and OV circuits
# and masks each head (circuits.json), and, per experiment,
# trax-qkv-compare --seeds gives means, sds and paired intervals against
# 'reference' (seeds.md).
#
#   scripts/why_three_dense_seeds.sh [OUTPUT_DIR]   default runs/why_seeds
#   SEEDS="0 1 2 3 4" MULTI30K=DIR scripts/why_three_dense_seeds.sh
#   EXPERIMENTS=cross scripts/why_three_dense_seeds.sh   one part only
#
# Resumable run by run: run it again after a stop and each model continues
# from its last checkpoint, exactly; finished ones are decoded again.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
out=${1:-runs/why_seeds}
data=${MULTI30K:-../shared/data/multi30k}
read -r -a seeds <<<"${SEEDS:-0 1 2}"
read -r -a experiments <<<"${EXPERIMENTS:-self cross}"
self_models=(reference no_projection no_projection_temperature
             shared_projection raw_values raw_queries_keys shared_query_key
             multi_query one_head)
cross_models=(reference no_projection shared_projection one_head)
settings=(--source_dir "$data" --keys de en --vocab_size 8192 --d_model 128
          --d_ff 256 --n_layers 2 --n_heads 4 --dropout 0.1
          --label_smoothing 0.1 --max_length 64 --batch_size 64 --steps 1000
          --learning_rate 0.002 --warmup_steps 400
          --lr_factors 'constant * linear_warmup * rsqrt_decay'
          --eval_every 500 --eval_batches 0 --beam_sentences 200
          --heatmap_sentences 0 --score_sentences 50)

for experiment in "${experiments[@]}"; do
  if [[ $experiment == self ]]; then
    sites=(self_attention causal_attention)
    models=("${self_models[@]}")
  elif [[ $experiment == cross ]]; then
    sites=(cross_attention)
    models=("${cross_models[@]}")
  else
    echo "EXPERIMENTS: self and/or cross; got $experiment" >&2
    exit 2
  fi
  runs=()
  for seed in "${seeds[@]}"; do
    runs+=("$out/$experiment/seed$seed")
    run trax-qkv-validate "${settings[@]}" --sites "${sites[@]}" \
      --seed "$seed" --implementations "${models[@]}" \
      --output_dir "$out/$experiment/seed$seed"
    run trax-qkv-circuits "$out/$experiment/seed$seed"
  done
  run trax-qkv-compare --seeds "${runs[@]}" --output_dir "$out/$experiment"
done
