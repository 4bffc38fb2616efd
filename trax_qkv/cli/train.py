"""trax-qkv-train: train a Trax model from gin configs, resuming exactly.

  trax-qkv-train --config_file configs/reference.gin --output_dir runs/reference
  trax-qkv-train --config_file configs/trax.gin \\
      --config 'train.steps = 200' --output_dir runs/trax

`python -m trax.trainer` no longer imports on current JAX; this does its
job. Running the same command again resumes from the checkpoint in
--output_dir.
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
  return parser


def main(argv=None):
  parser = build_parser()
  args = parser.parse_args(argv)
  from trax_qkv.supervised import checkpointing
  from trax_qkv.supervised import training

  try:
    training.train_from_configs(args.config_file, args.config, args.output_dir)
  except (ValueError, PermissionError) as e:  # the command line
    parser.exit(2, f'error: {e}\n')
  except checkpointing.RunError as e:  # the run, stopped intact
    parser.exit(1, f'error: {e}\n')
  return 0
