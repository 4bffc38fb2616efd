"""Console commands: one module per command, each with `build_parser()` and
`main(argv)`. `trax_qkv_cli` (setup.cfg console_scripts) and scripts/ call
them; every flag's default and help is written once, here or in the config
it fills."""

import argparse


def new_parser(prog, doc):
  """A parser whose --help shows the command's module doc as written, and
  its --verbose flag (read by `trax_qkv_cli` before the command is
  imported)."""
  parser = argparse.ArgumentParser(
      prog=prog, description=doc,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument(
      '--verbose', action='store_true',
      help="show TensorFlow's, XLA's, Gym's and gin's start-up output")
  return parser


def positive_int(text):
  """argparse type: an int >= 1."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f'must be an int >= 1; got {text!r}')
  return value


def add_timing_flags(parser, output_dir, files, default_rounds):
  """--output_dir and --rounds of a benchmark command."""
  parser.add_argument('--output_dir', default=output_dir,
                      help=f'where {files} go (default: {output_dir})')
  parser.add_argument('--rounds', type=positive_int, default=default_rounds,
                      help='interleaved timing rounds per measurement '
                      f'(default: {default_rounds})')
