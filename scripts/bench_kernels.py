#!/usr/bin/env python3
"""Benchmark the attention math alone: every implementation, bf16 and f32.

  python scripts/bench_kernels.py                  # writes runs/bench_kernels/

Q, K and V come already projected, so this needs JAX and trax_qkv's pure
attention functions only (no Trax layers): it runs on a GPU machine too,
where it adds the cuDNN kernel. Prints ms, speed-ups over 'reference',
TFLOP/s against the measured matmul rate, temporary memory and the f32
error of each implementation; writes kernel_bench.json and kernel_bench.md.
"""

import argparse


def main(argv=None):
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument('--output_dir', default='runs/bench_kernels',
                      help='where kernel_bench.json and kernel_bench.md go')
  parser.add_argument('--rounds', type=int, default=5,
                      help='interleaved timing rounds per measurement')
  parser.add_argument('--shape', type=int, nargs=5, action='append',
                      metavar=('BATCH', 'LQ', 'LK', 'D_MODEL', 'HEADS'),
                      help='a shape to measure (repeatable); default: '
                      'kernel_bench.GPU_SHAPES on a GPU, else CPU_SHAPES')
  args = parser.parse_args(argv)
  if args.rounds < 1:
    parser.error(f'--rounds must be >= 1; got {args.rounds}')
  for shape in args.shape or ():
    if min(shape) < 1 or shape[3] % shape[4]:
      parser.error(f'--shape {" ".join(map(str, shape))}: all must be >= 1 '
                   'and HEADS must divide D_MODEL')
  from trax_qkv import kernel_bench  # pylint: disable=g-import-not-at-top
  results = kernel_bench.run(rounds=args.rounds,
                             shapes=[tuple(s) for s in args.shape or ()])
  table = kernel_bench.markdown(results)
  kernel_bench.write_results(results, args.output_dir, 'kernel_bench', table)
  print(table)
  print(f'written to {args.output_dir}/kernel_bench.json and kernel_bench.md')


if __name__ == '__main__':
  main()
