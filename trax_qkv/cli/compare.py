"""trax-qkv-compare: completed trax-qkv-validate runs in one table, and
their models' cross-attention for one sentence per run, side by side.

  trax-qkv-compare --runs runs/why/numbers runs/why/multi30k \\
      --sources "nine hundred and eighty-seven" "Ein Hund rennt." \\
      --output_dir runs/why

Writes comparison.md (a table per run: parameters, losses, exact match,
BLEU and chrF, the cross-attention head measures) and maps_<i>.png (run
i's models, a row per model and layer, a column per head, each model
teacher-forced with its own greedy translation of the i-th source).
"""

import sys

from trax_qkv import cli


def build_parser():
  parser = cli.new_parser('trax-qkv-compare', __doc__)
  parser.add_argument(
    '--runs',
    nargs='+',
    required=True,
    metavar='DIR',
    help='output directories of completed trax-qkv-validate runs',
  )
  parser.add_argument(
    '--sources',
    nargs='+',
    required=True,
    metavar='SENTENCE',
    help='one source sentence per run, for its attention maps',
  )
  parser.add_argument(
    '--output_dir',
    required=True,
    help='where comparison.md and the maps go',
  )
  return parser


def main(argv=None):
  args = build_parser().parse_args(argv)
  from trax_qkv.validation import compare

  try:
    compare.compare(args.runs, args.sources, args.output_dir)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(f'{args.output_dir}/{compare.TABLE}')
  return 0
