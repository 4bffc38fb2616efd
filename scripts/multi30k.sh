#!/usr/bin/env bash
# Multi30k de -> en, the built-in and trax_qkv from one seed (README,
# docs/results.md; the translation times in docs/benchmarks.md): prepare
# the data and vocabulary, train both sides (about 2 h 20 min each on 2
# CPU cores), decode and score test2016, translate it with each side,
# greedily and with 4 beams, and draw the attention map of one sentence.
#
#   scripts/multi30k.sh [OUTPUT_DIR]     default runs/multi30k
#   MULTI30K=DIR scripts/multi30k.sh     the data (default ../shared/data/multi30k:
#                                        {train,val,test2016}.{de,en})
#
# Resumable: run it again after a stop (Ctrl-C, a killed process, a lost
# session) and training continues from the last checkpoint, exactly.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
out=${1:-runs/multi30k}
data=${MULTI30K:-../shared/data/multi30k}

run trax-qkv-validate --source_dir "$data" --keys de en \
  --vocab_size 8192 --d_model 256 --d_ff 1024 --n_layers 3 --n_heads 8 \
  --dropout 0.1 --label_smoothing 0.1 --max_length 64 --batch_size 128 \
  --steps 4600 --learning_rate 0.002 --warmup_steps 400 \
  --lr_factors 'constant * linear_warmup * rsqrt_decay' --eval_every 250 \
  --implementations trax reference --output_dir "$out"

for side in trax reference; do
  for beam in 1 4; do
    run_io "$data/test2016.de" "$out/test2016.$side.beam$beam.en" \
      trax-qkv-translate --model_dir "$out/$side" --beam "$beam"
  done
done
run trax-qkv-attention-map --model_dir "$out/trax" \
  --source 'Ein kleines Mädchen spielt mit einem roten Ball im Garten.' \
  --output "$out/attention_map.png"
