"""trax-qkv-bench-kernels: the attention math alone, every implementation,
bfloat16 and float32.

  trax-qkv-bench-kernels                        # writes runs/bench_kernels/
  trax-qkv-bench-kernels --shape 1 4096 4096 256 8

Q, K and V come already projected, so this needs JAX only (no Trax, no
TensorFlow: `python3 -m _trax_qkv_cli bench_kernels` runs from a plain
checkout on a machine that has only JAX); on a GPU it adds the cuDNN
kernel. Prints ms,
speed-ups over 'reference', TFLOP/s against the measured matmul rate,
temporary memory and the float32 error of each implementation; writes
kernel_bench.json and kernel_bench.md.
"""

from trax_qkv import cli
from trax_qkv.benchmarks import kernels as kernel_bench
from trax_qkv.benchmarks import timing


def build_parser():
  parser = cli.new_parser('trax-qkv-bench-kernels', __doc__)
  cli.add_timing_flags(
    parser,
    'runs/bench_kernels',
    'kernel_bench.json and kernel_bench.md',
    kernel_bench.DEFAULT_ROUNDS,
  )
  parser.add_argument(
    '--shape',
    type=int,
    nargs=5,
    action='append',
    metavar=('BATCH', 'LQ', 'LK', 'D_MODEL', 'HEADS'),
    help='a shape to measure (repeatable); default: '
    f'{kernel_bench.GPU_SHAPES} on a GPU, else '
    f'{kernel_bench.CPU_SHAPES}',
  )
  return parser


def main(argv=None):
  parser = build_parser()
  args = parser.parse_args(argv)
  for shape in args.shape or ():
    if min(shape) < 1 or shape[3] % shape[4]:
      parser.error(
        f'--shape {" ".join(map(str, shape))}: all must be >= 1 '
        'and HEADS must divide D_MODEL'
      )
  results = kernel_bench.run(
    rounds=args.rounds, shapes=[tuple(s) for s in args.shape or ()]
  )
  table = kernel_bench.markdown(results)
  timing.write_results(results, args.output_dir, 'kernel_bench', table)
  print(table)
  print(f'written to {args.output_dir}/kernel_bench.json and kernel_bench.md')
  return 0
