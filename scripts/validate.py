#!/usr/bin/env python3
"""Train Trax's built-in and trax_qkv's cross-attention side by side.

With no arguments: the embedded English -> German numbers corpus, both
implementations from the same seed; writes report.md, summary.json,
loss_curves.png and cross-attention heatmaps to --output_dir.

  python scripts/validate.py
  python scripts/validate.py --source_dir ../shared/data/multi30k --keys de en \\
      --vocab_size 8192 --d_model 256 --d_ff 1024 --n_layers 3 --steps 9000
  python scripts/validate.py --dataset ted_hrlr_translate/pt_to_en --keys pt en
"""

import argparse
import dataclasses
import sys

DEFAULT_OUTPUT_DIR = 'runs/validate'


def build_parser():
  # Imported lazily in main(): trax_qkv.validation pulls in TensorFlow.
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  add = parser.add_argument
  add('--output_dir', default=DEFAULT_OUTPUT_DIR,
      help=f'where the report and checkpoints go (default {DEFAULT_OUTPUT_DIR})')
  add('--dataset', default='trax_qkv_numbers',
      help="TFDS data set name (default: the embedded 'trax_qkv_numbers'; "
           "'trax_qkv_numbers/tiny' is a 200-number version)")
  add('--source_dir', default=None,
      help='directory of {split}.{lang} parallel text; overrides --dataset')
  add('--keys', nargs=2, default=['en', 'de'], metavar=('SRC', 'TGT'),
      help='source and target language / feature names (default en de)')
  add('--data_dir', default=None,
      help='TFDS data and vocabulary cache (default ~/tensorflow_datasets)')
  add('--vocab_size', type=int, default=512, help='subword vocabulary size')
  add('--d_model', type=int, default=128, help='model width')
  add('--d_ff', type=int, default=256, help='feed-forward width')
  add('--n_layers', type=int, default=2,
      help='encoder layers and decoder layers (each)')
  add('--n_heads', type=int, default=4, help='attention heads')
  add('--dropout', type=float, default=0.1, help='dropout rate')
  add('--max_length', type=int, default=32,
      help='longest source/target kept for training, in subwords')
  add('--batch_size', type=int, default=64, help='training batch size')
  add('--steps', type=int, default=1500, help='training steps')
  add('--learning_rate', type=float, default=0.002, help='Adam learning rate')
  add('--warmup_steps', type=int, default=100, help='linear warm-up steps')
  add('--lr_factors', default='constant * linear_warmup',
      help="trax multifactor schedule, e.g. 'constant * linear_warmup * "
           "rsqrt_decay'; --learning_rate is its peak")
  add('--label_smoothing', type=float, default=0.0,
      help='label smoothing of the training loss')
  add('--eval_every', type=int, default=250, help='eval every N steps')
  add('--seed', type=int, default=0, help='random seed (weights, dropout)')
  add('--implementations', nargs='+', default=['trax', 'trax_qkv'],
      help="cross-attention implementations to train (default: trax "
           "trax_qkv, i.e. built-in and plugin)")
  add('--max_test_sentences', type=int, default=None,
      help='decode only the first N test sentences')
  add('--beam_sentences', type=int, default=None,
      help='decode only the first N test sentences with beam search too '
           '(default: all of them; 0: none)')
  add('--n_beams', type=int, default=4, help='beam size')
  return parser


def main(argv=None):
  args = build_parser().parse_args(argv)
  from trax_qkv import validation  # pylint: disable=g-import-not-at-top
  fields = {f.name for f in dataclasses.fields(validation.ValidationConfig)}
  config = validation.ValidationConfig(**{
      k: tuple(v) if isinstance(v, list) else v
      for k, v in vars(args).items() if k in fields})
  try:
    validation.run_validation(config, args.output_dir)
  except ValueError as e:
    sys.exit(f'error: {e}')
  print(f'report written to {args.output_dir}/report.md')


if __name__ == '__main__':
  main()
