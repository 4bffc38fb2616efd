"""trax-qkv-circuits: what the trained weights of completed
trax-qkv-validate runs of Transformers say, head by head.

  trax-qkv-circuits runs/why_seeds/self/seed0 runs/why_seeds/self/seed1

For each model of each run, in the sites the run varied: per layer, the
mean over its heads of the QK circuit W_Q W_K^T and the OV circuit
W_V W_O (asymmetry, trace ratio, effective rank), and Michel et al.'s head
importance, the rise in the validation loss when one head is masked.
Writes circuits.json into each run directory; trax-qkv-compare --seeds
shows them (docs/why_three_dense.md).

  trax-qkv-circuits --initial_scores --source_dir ../shared/data/multi30k \
      docs/runs/why_three_dense/self/seed*

instead measures the self-attention scores of each model as initialized
from the run's seed, on the sentences the trained models were measured
on, and writes initial_scores.json; it needs the run's data, not its
checkpoints.
"""

import sys

from trax_qkv import cli


def build_parser():
  parser = cli.new_parser('trax-qkv-circuits', __doc__)
  parser.add_argument(
    'runs',
    nargs='+',
    metavar='DIR',
    help='output directories of completed trax-qkv-validate runs',
  )
  parser.add_argument(
    '--initial_scores',
    action='store_true',
    help='measure the self-attention scores of the models as initialized '
    '(initial_scores.json) instead of the trained circuits',
  )
  parser.add_argument(
    '--source_dir',
    default=None,
    help="with --initial_scores: the runs' parallel text on this machine, "
    'where it is not where the runs read it',
  )
  parser.add_argument(
    '--data_dir',
    default=None,
    help='with --initial_scores: where to prepare the data',
  )
  return parser


def main(argv=None):
  args = build_parser().parse_args(argv)
  from trax_qkv.validation import trained_circuits

  if (args.source_dir or args.data_dir) and not args.initial_scores:
    print(
      'error: --source_dir and --data_dir go with --initial_scores',
      file=sys.stderr,
    )
    return 2
  for run_dir in args.runs:
    try:
      if args.initial_scores:
        trained_circuits.initial_scores(run_dir, args.source_dir, args.data_dir)
        written = trained_circuits.INITIAL_SCORES_FILE
      else:
        trained_circuits.measure(run_dir)
        written = trained_circuits.CIRCUITS_FILE
    except ValueError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
    print(f'{run_dir}/{written}')
  return 0
