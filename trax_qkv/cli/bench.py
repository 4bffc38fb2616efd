"""trax-qkv-bench: trax_qkv's layers and models against Trax's built-in.

  trax-qkv-bench                   # layers, then models, runs/bench/
  trax-qkv-bench --only models     # whole trax.models, trax_qkv in every site
  trax-qkv-bench --only checkpoints  # resuming: Trax's reader and ours
  trax-qkv-bench --only distributed  # 2 processes x 1 core vs 1 x 2 devices
  trax-qkv-bench --only decoding   # greedy and beam search: compiled vs loop
  trax-qkv-bench --only roof       # attention layers against the matmul rate
  trax-qkv-bench --only serve --model_dir DIR --sentences FILE
                                   # trax-qkv-serve under 8 clients
  trax-qkv-bench --quick           # toy sizes, a smoke test

Prints each contender's time and its speed-up over the built-in, all
measured interleaved in this one run, with the spread of the per-round
ratios; writes bench.json / bench.md (layers) and bench_models.json /
bench_models.md (models), bench_checkpoints.json / .md (checkpoints),
bench_distributed.json / .md (processes), bench_decoding.json / .md
(decoding), bench_roof.json / .md (roof), bench_serve.json / .md (serve)
to --output_dir.
"""

from trax_qkv import cli
from trax_qkv.benchmarks import checkpoints as checkpoint_bench
from trax_qkv.benchmarks import decoding as decoding_bench
from trax_qkv.benchmarks import distributed as distributed_bench
from trax_qkv.benchmarks import layers as bench
from trax_qkv.benchmarks import models as model_bench
from trax_qkv.benchmarks import roof as roof_bench


def build_parser():
  parser = cli.new_parser('trax-qkv-bench', __doc__)
  cli.add_timing_flags(
    parser, 'runs/bench', 'bench.json and bench.md', bench.DEFAULT_ROUNDS
  )
  parser.add_argument(
    '--quick',
    action='store_true',
    help='toy sizes only (a smoke test, not the tables)',
  )
  parser.add_argument(
    '--only',
    choices=(
      'layers',
      'models',
      'checkpoints',
      'distributed',
      'decoding',
      'roof',
      'serve',
    ),
    default=None,
    help='run one part: the attention layers (AttentionQKV alone, ~15 '
    'min on 2 cores), whole trax.models with trax_qkv in every site '
    '(TransformerLM, Transformer; ~15 min) or loading a checkpoint of '
    "the Multi30k-sized model with Trax's reader and trax_qkv's (~2 "
    'min), or training it as 2 processes of 1 core against 1 process of '
    "2 devices (~12 min), or decoding (Trax's sampler, the previous "
    'Python loop and the compiled search, greedy and beam 4; ~6 min), '
    'or one causal and one cross-attention layer as a fraction of the '
    'matmul rate, with the TransformerLM 2x2048 training step (~5 min), '
    'or trax-qkv-serve under concurrent clients (needs --model_dir and '
    '--sentences; .[serve]); default layers and models',
  )
  serve = parser.add_argument_group('--only serve')
  cli.add_model_dir_flag(serve, required=False)
  serve.add_argument(
    '--sentences', help='a file of source sentences, one per line'
  )
  cli.add_positive_int(serve, '--clients', 8, 'concurrent clients')
  cli.add_positive_int(
    serve, '--requests', 100, 'requests of one sentence per client and round'
  )
  serve.add_argument(
    '--max_length',
    type=cli.positive_int,
    default=None,
    help="the server's and the command's length limit (default: the "
    "model's longest output)",
  )
  return parser


def _report(module, results, output_dir, name):
  module.write(results, output_dir)
  print(module.markdown(results))
  print(f'written to {output_dir}/{name}.json and {name}.md')


def main(argv=None):
  args = build_parser().parse_args(argv)
  rounds, quick, out = args.rounds, args.quick, args.output_dir
  if args.only in (None, 'layers'):
    _report(bench, bench.run(rounds=rounds, quick=quick), out, 'bench')
  if args.only in (None, 'models'):
    results = model_bench.run(
      rounds=min(rounds, model_bench.DEFAULT_ROUNDS), quick=quick
    )
    _report(model_bench, results, out, 'bench_models')
  if args.only == 'checkpoints':
    results = checkpoint_bench.run(
      rounds=max(rounds, checkpoint_bench.DEFAULT_ROUNDS), quick=quick
    )
    _report(checkpoint_bench, results, out, 'bench_checkpoints')
  if args.only == 'distributed':
    results = distributed_bench.run(
      rounds=min(rounds, distributed_bench.DEFAULT_ROUNDS), scratch=out
    )
    _report(distributed_bench, results, out, 'bench_distributed')
  if args.only == 'decoding':
    results = decoding_bench.run(
      rounds=min(rounds, decoding_bench.DEFAULT_ROUNDS), quick=quick
    )
    _report(decoding_bench, results, out, 'bench_decoding')
  if args.only == 'serve':
    if not (args.model_dir and args.sentences):
      build_parser().error('--only serve needs --model_dir and --sentences')
    from trax_qkv.benchmarks import serving as serving_bench

    results = serving_bench.run(
      args.model_dir,
      args.sentences,
      clients=args.clients,
      requests=args.requests,
      rounds=min(rounds, serving_bench.ROUNDS),
      max_length=args.max_length,
    )
    _report(serving_bench, results, out, 'bench_serve')
  if args.only == 'roof':
    results = roof_bench.run(
      rounds=min(rounds, roof_bench.DEFAULT_ROUNDS), quick=quick
    )
    _report(roof_bench, results, out, 'bench_roof')
  return 0
