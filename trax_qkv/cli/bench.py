"""trax-qkv-bench: trax_qkv's layers and models against Trax's built-in.

  trax-qkv-bench                 # full run (~15 min on 2 cores), runs/bench/
  trax-qkv-bench --quick         # small shapes, a smoke test

Prints each contender's time and its speed-up over the built-in layer, all
measured interleaved in this one run, with the spread of the per-round
ratios; writes bench.json and bench.md to --output_dir.
"""

from trax_qkv import cli
from trax_qkv.benchmarks import layers as bench


def build_parser():
  parser = cli.new_parser('trax-qkv-bench', __doc__)
  cli.add_timing_flags(parser, 'runs/bench', 'bench.json and bench.md',
                       bench.DEFAULT_ROUNDS)
  parser.add_argument('--quick', action='store_true',
                      help='small shapes only (a smoke test, not the table)')
  return parser


def main(argv=None):
  args = build_parser().parse_args(argv)
  results = bench.run(rounds=args.rounds, quick=args.quick)
  bench.write(results, args.output_dir)
  print(bench.markdown(results))
  print(f'written to {args.output_dir}/bench.json and bench.md')
  return 0
