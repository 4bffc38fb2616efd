"""trax-qkv-train: train a Trax model from gin configs, resuming exactly.

  trax-qkv-train --config_file configs/reference.gin --output_dir runs/reference
  trax-qkv-train --config_file configs/trax.gin \\
      --config 'train.steps = 200' --output_dir runs/trax

`python -m trax.trainer` no longer imports on current JAX; this does its
job. Running the same command again resumes from the checkpoint in
--output_dir.

Several processes, on one machine or many, train as one (data parallel,
the numbers of one process holding all their devices):

  trax-qkv-train --local_processes 2 --config_file configs/trax.gin ...
  trax-qkv-train --coordinator_address HOST0:1234 --num_processes 2 \\
      --process_id I --config_file configs/trax.gin --output_dir /shared/run
"""

from trax_qkv import cli


def build_parser():
  parser = cli.new_parser('trax-qkv-train', __doc__)
  parser.add_argument(
    '--config_file',
    action='append',
    default=[],
    help='gin config file (repeatable, parsed in order)',
  )
  parser.add_argument(
    '--config',
    action='append',
    default=[],
    help="gin binding, e.g. 'train.steps = 100' (repeatable)",
  )
  parser.add_argument(
    '--output_dir',
    required=True,
    help='checkpoints and logs; an earlier run here resumes',
  )
  cli.add_process_flags(parser)
  return parser


def main(argv=None):
  args = build_parser().parse_args(argv)
  from trax_qkv.supervised import training

  return cli.run_job(
    'train',
    argv,
    args,
    cli.fingerprint(args, files=args.config_file),
    lambda: training.train_from_configs(
      args.config_file, args.config, args.output_dir
    ),
  )
