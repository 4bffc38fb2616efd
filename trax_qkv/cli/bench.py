"""trax-qkv-bench: trax_qkv's layers and models against Trax's built-in.

  trax-qkv-bench                 # full run (~15 min on 2 cores), runs/bench/
  trax-qkv-bench --quick         # small shapes, a smoke test

Prints each contender's time and its speed-up over the built-in layer, all
measured interleaved in this one run, with the spread of the per-round
ratios; writes bench.json and bench.md to --output_dir.
"""

import argparse

from trax_qkv.benchmarks import layers as bench
from trax_qkv.cli import add_verbose_flag


def build_parser():
  parser = argparse.ArgumentParser(
      prog='trax-qkv-bench', description=__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--output_dir', default='runs/bench',
                      help='where bench.json and bench.md go (default: '
                      'runs/bench)')
  parser.add_argument('--rounds', type=int, default=bench.DEFAULT_ROUNDS,
                      help='interleaved timing rounds per measurement '
                      f'(default: {bench.DEFAULT_ROUNDS})')
  parser.add_argument('--quick', action='store_true',
                      help='small shapes only (a smoke test, not the table)')
  add_verbose_flag(parser)
  return parser


def main(argv=None):
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.rounds < 1:
    parser.error(f'--rounds must be >= 1; got {args.rounds}')
  results = bench.run(rounds=args.rounds, quick=args.quick)
  bench.write(results, args.output_dir)
  print(bench.markdown(results))
  print(f'written to {args.output_dir}/bench.json and bench.md')
  return 0
