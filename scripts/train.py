#!/usr/bin/env python3
"""Train a Trax model from gin configs (like `python -m trax.trainer`).

  python scripts/train.py --config_file configs/plugin.gin --output_dir runs/plugin
  python scripts/train.py --config_file configs/builtin.gin \
      --config 'train.steps = 200' --output_dir runs/builtin

Running the same command again resumes from the checkpoint in --output_dir.
"""

import argparse
import sys


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument('--config_file', action='append', default=[],
                      help='gin config file (repeatable, parsed in order)')
  parser.add_argument('--config', action='append', default=[],
                      help="gin binding, e.g. 'train.steps = 100' (repeatable)")
  parser.add_argument('--output_dir', required=True,
                      help='checkpoints and logs; an earlier run here resumes')
  args = parser.parse_args(argv)
  from trax_qkv import training  # slow import (TensorFlow): after --help
  try:
    training.train_from_configs(args.config_file, args.config, args.output_dir)
  except (training.ConfigError, ValueError, PermissionError) as e:
    parser.exit(2, f'error: {e}\n')


if __name__ == '__main__':
  sys.exit(main())
