"""Console commands: one module per command, each with `build_parser()` and
`main(argv)`. `trax_qkv_cli` (setup.cfg console_scripts) and scripts/ call
them; every flag's default and help is written once, here or in the config
it fills."""


def add_verbose_flag(parser):
  """--verbose: read by `trax_qkv_cli` before the command is imported."""
  parser.add_argument(
      '--verbose', action='store_true',
      help="show TensorFlow's, XLA's, Gym's and gin's start-up output")
