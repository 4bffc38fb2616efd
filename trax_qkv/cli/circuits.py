"""trax-qkv-circuits: what the trained weights of completed
trax-qkv-validate runs of Transformers say, head by head.

  trax-qkv-circuits runs/why_seeds/self/seed0 runs/why_seeds/self/seed1

For each model of each run, in the sites the run varied: per layer, the
mean over its heads of the QK circuit W_Q W_K^T and the OV circuit
W_V W_O (asymmetry, trace ratio, effective rank), and Michel et al.'s head
importance, the rise in the validation loss when one head is masked.
Writes circuits.json into each run directory; trax-qkv-compare --seeds
shows them (docs/why_three_dense.md).
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
  return parser


def main(argv=None):
  args = build_parser().parse_args(argv)
  from trax_qkv.validation import trained_circuits

  for run_dir in args.runs:
    try:
      trained_circuits.measure(run_dir)
    except ValueError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
    print(f'{run_dir}/{trained_circuits.CIRCUITS_FILE}')
  return 0
