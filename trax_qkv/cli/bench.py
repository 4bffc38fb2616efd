"""trax-qkv-bench: trax_qkv's layers and models against Trax's built-in.

  trax-qkv-bench                   # layers, then models, runs/bench/
  trax-qkv-bench --only models     # whole trax.models, plugin in every site
  trax-qkv-bench --quick           # small shapes, a smoke test

Prints each contender's time and its speed-up over the built-in, all
measured interleaved in this one run, with the spread of the per-round
ratios; writes bench.json / bench.md (layers) and bench_models.json /
bench_models.md (models) to --output_dir.
"""

from trax_qkv import cli
from trax_qkv.benchmarks import layers as bench
from trax_qkv.benchmarks import models as model_bench


def build_parser():
  parser = cli.new_parser('trax-qkv-bench', __doc__)
  cli.add_timing_flags(parser, 'runs/bench', 'bench.json and bench.md',
                       bench.DEFAULT_ROUNDS)
  parser.add_argument('--quick', action='store_true',
                      help='small shapes only (a smoke test, not the table)')
  parser.add_argument(
      '--only', choices=('layers', 'models'), default=None,
      help='run one part: the attention layers (AttentionQKV alone, ~15 '
      'min on 2 cores) or whole trax.models with the plugin in every site '
      '(TransformerLM, Transformer; ~15 min); default both')
  return parser


def main(argv=None):
  args = build_parser().parse_args(argv)
  if args.only in (None, 'layers'):
    results = bench.run(rounds=args.rounds, quick=args.quick)
    bench.write(results, args.output_dir)
    print(bench.markdown(results))
    print(f'written to {args.output_dir}/bench.json and bench.md')
  if args.only in (None, 'models'):
    results = model_bench.run(
        rounds=min(args.rounds, model_bench.DEFAULT_ROUNDS), quick=args.quick)
    model_bench.write(results, args.output_dir)
    print(model_bench.markdown(results))
    print(f'written to {args.output_dir}/bench_models.json and '
          'bench_models.md')
  return 0
