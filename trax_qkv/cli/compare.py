"""trax-qkv-compare: completed trax-qkv-validate runs in one table, and
their models' cross-attention for one sentence per run, side by side; or
the seeds of one experiment in one table, with intervals (its test
references from the data set the runs prepared, or with --source_dir from
their parallel text wherever it is here).

  trax-qkv-compare --runs runs/why/numbers runs/why/multi30k \\
      --sources "nine hundred and eighty-seven" "Ein Hund rennt." \\
      --output_dir runs/why
  trax-qkv-compare --seeds runs/why/seed0 runs/why/seed1 runs/why/seed2 \\
      --output_dir runs/why
  trax-qkv-compare --seeds docs/runs/why_three_dense/self/seed* \\
      --source_dir ../shared/data/multi30k --output_dir /tmp/self

`--runs` writes comparison.md (a table per run: parameters, losses, exact
match, BLEU and chrF, the head measures and self-attention scores) and
maps_<i>.png (run i's models, a row per model and layer, a column per
head, each model teacher-forced with its own greedy translation of the
i-th source). `--seeds` writes seeds.md: each score's mean ± sd over the
seeds, its paired difference from 'reference' with a 95 % interval across
seeds (* where it excludes 0, each on its own), BLEU and chrF also by
paired bootstrap of the test sentences, and under the table Holm's
correction over all its paired t tests. With --margin it ends with the
pre-registered decisions of docs/why_three_dense.md: each variant worse,
equivalent within the margin, better or undecided on the eval loss at
the last step, and whether 'reference''s eval loss had flattened.
"""

import sys

from trax_qkv import cli


def build_parser():
  parser = cli.new_parser('trax-qkv-compare', __doc__)
  parser.add_argument(
    '--runs',
    nargs='+',
    metavar='DIR',
    help='output directories of completed trax-qkv-validate runs',
  )
  parser.add_argument(
    '--sources',
    nargs='+',
    metavar='SENTENCE',
    help='with --runs: one source sentence per run, for its attention maps',
  )
  parser.add_argument(
    '--seeds',
    nargs='+',
    metavar='DIR',
    help='output directories of runs that differ in their seed alone',
  )
  parser.add_argument(
    '--source_dir',
    metavar='DIR',
    help='with --seeds: read the test references from this directory of '
    "parallel text (the runs' --source_dir, wherever it is here) instead "
    'of the data set the runs prepared',
  )
  parser.add_argument(
    '--data_dir',
    metavar='DIR',
    help='with --source_dir: where to prepare it (default: '
    '~/tensorflow_datasets)',
  )
  parser.add_argument(
    '--margin',
    type=float,
    metavar='NATS',
    help="with --seeds: the eval loss's equivalence margin, for each "
    "variant's pre-registered decision (docs/why_three_dense.md: 0.05)",
  )
  parser.add_argument(
    '--output_dir',
    required=True,
    help='where comparison.md and the maps go',
  )
  return parser


def main(argv=None):
  parser = build_parser()
  args = parser.parse_args(argv)
  if bool(args.runs) == bool(args.seeds) or bool(args.runs) != bool(
    args.sources
  ):
    parser.error('give --runs with --sources, or --seeds')
  if (args.source_dir and not args.seeds) or (
    args.data_dir and not args.source_dir
  ):
    parser.error(
      '--source_dir goes with --seeds, and --data_dir with --source_dir'
    )
  if args.margin is not None and not (args.seeds and args.margin > 0):
    parser.error('--margin goes with --seeds, and is a positive number of nats')
  from trax_qkv.validation import compare

  try:
    if args.seeds:
      compare.compare_seeds(
        args.seeds, args.output_dir, args.source_dir, args.data_dir,
        args.margin,
      )  # fmt: skip
    else:
      compare.compare(args.runs, args.sources, args.output_dir)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  table = compare.SEEDS_TABLE if args.seeds else compare.TABLE
  print(f'{args.output_dir}/{table}')
  return 0
