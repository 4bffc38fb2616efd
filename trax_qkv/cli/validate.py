"""trax-qkv-validate: translation models with different attention trained
side by side from the same seed, decoded and scored.

With no flags: the embedded English -> German numbers corpus, the built-in
('trax') and trax_qkv's bit-identical layer ('reference') in
cross-attention (--sites chooses others); writes report.md,
summary.json, loss_curves.png and cross-attention maps to --output_dir.

  trax-qkv-validate
  trax-qkv-validate --source_dir ../shared/data/multi30k --keys de en \\
      --vocab_size 8192 --d_model 256 --d_ff 1024 --n_layers 3 --steps 4600
  trax-qkv-validate --implementations trax auto
  trax-qkv-validate --model lstm_seq2seq_attn --output_dir runs/lstm

Running the same command again resumes an interrupted run exactly.
With --local_processes N, or one command per process with
--coordinator_address, --num_processes and --process_id, each model
trains data parallel across the processes.
"""

from trax_qkv import cli
from trax_qkv.validation import config as config_lib

DEFAULT_OUTPUT_DIR = 'runs/validate'


def build_parser():
  parser = cli.new_parser('trax-qkv-validate', __doc__)
  parser.add_argument(
    '--output_dir',
    default=DEFAULT_OUTPUT_DIR,
    help=f'where the report and checkpoints go (default: {DEFAULT_OUTPUT_DIR})',
  )
  config_lib.add_flags(parser)
  cli.add_process_flags(parser)
  return parser


def main(argv=None):
  args = build_parser().parse_args(argv)
  from trax_qkv.validation import run

  def job():
    run.run_validation(config_lib.from_flags(args), args.output_dir)
    print(f'report written to {args.output_dir}/report.md')

  return cli.run_job('validate', argv, args, cli.fingerprint(args), job)
