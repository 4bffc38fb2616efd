#!/usr/bin/env python3
"""Benchmark trax_qkv's attention implementations against tl.AttentionQKV.

  python scripts/bench.py                 # full run, writes runs/bench/
  python scripts/bench.py --quick         # small shapes, a smoke test

Prints each contender's time and its speed-up over the built-in layer, all
measured in this one run; writes bench.json and bench.md to --output_dir.
"""

import argparse


def main(argv=None):
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument('--output_dir', default='runs/bench',
                      help='where bench.json and bench.md go')
  parser.add_argument('--rounds', type=int, default=15,
                      help='interleaved timing rounds per measurement')
  parser.add_argument('--quick', action='store_true',
                      help='small shapes only (a smoke test, not the table)')
  args = parser.parse_args(argv)
  if args.rounds < 1:
    parser.error(f'--rounds must be >= 1; got {args.rounds}')
  from trax_qkv import bench  # pylint: disable=g-import-not-at-top
  results = bench.run(rounds=args.rounds, quick=args.quick)
  bench.write(results, args.output_dir)
  print(bench.markdown(results))
  print(f'written to {args.output_dir}/bench.json and bench.md')


if __name__ == '__main__':
  main()
