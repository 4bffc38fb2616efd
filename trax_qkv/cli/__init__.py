"""Console commands: one module per command, each with `build_parser()` and
`main(argv)`. `_trax_qkv_cli` (setup.cfg console_scripts) calls them; every
flag's default and help is written once, here or in the config it fills."""

import argparse
import sys


def new_parser(prog, doc):
  """A parser whose --help shows the command's module doc as written, and
  its --verbose flag (read by `_trax_qkv_cli` before the command is
  imported)."""
  parser = argparse.ArgumentParser(
    prog=prog,
    description=doc,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument(
    '--verbose',
    action='store_true',
    help="show TensorFlow's, XLA's, Gym's and gin's start-up output",
  )
  return parser


def site_implementation(text):
  """argparse type: 'SITE=NAME' -> (site, name); names are checked later,
  once the registry is imported."""
  site, equals, name = text.partition('=')
  if not equals or not site or not name:
    raise argparse.ArgumentTypeError(
      f'must be SITE=NAME, e.g. cross_attention=auto; got {text!r}'
    )
  return site, name


def add_attention_flag(parser):
  """--attention SITE=NAME, repeatable: the attention to run in a site
  instead of what the model was trained with."""
  from trax_qkv import kernels
  from trax_qkv.models import registry

  parser.add_argument(
    '--attention',
    type=site_implementation,
    action='append',
    default=[],
    metavar='SITE=NAME',
    help='run NAME in SITE instead of what the model was trained with; '
    f'repeat for several sites. Sites: {", ".join(registry.SITES)}; '
    f"names: 'trax' (Trax's layer), a kernel or 'auto' "
    f'({", ".join(kernels.names())}; default: as trained)',
  )


def attention_from_flags(args):
  """{site: name} of --attention flags, checked; None when there are none.

  0.2.0's `--implementation NAME` (translate) still means `--attention
  cross_attention=NAME`, with a notice on standard error.

  Raises:
    ValueError: a site or name that the registry does not know.
  """
  from trax_qkv.models import registry

  attention = dict(args.attention)
  old = getattr(args, 'implementation', None)
  if old is not None:
    print(
      'notice: --implementation is deprecated and will be removed in '
      f'trax_qkv 0.4.0; use --attention cross_attention={old}.',
      file=sys.stderr,
    )
    attention.setdefault('cross_attention', old)
  attention = attention or None
  registry.check_attention(attention)
  return attention


def positive_int(text):
  """argparse type: an int >= 1."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f'must be an int >= 1; got {text!r}')
  return value


def add_positive_int(parser, flag, default, help):
  """A flag taking an int >= 1; `help` says what it is, without the
  default, which is added."""
  parser.add_argument(
    flag,
    type=positive_int,
    default=default,
    help=f'{help} (default: {default})',
  )


def add_timing_flags(parser, output_dir, files, default_rounds):
  """--output_dir and --rounds of a benchmark command."""
  parser.add_argument(
    '--output_dir',
    default=output_dir,
    help=f'where {files} go (default: {output_dir})',
  )
  parser.add_argument(
    '--rounds',
    type=positive_int,
    default=default_rounds,
    help='interleaved timing rounds per measurement '
    f'(default: {default_rounds})',
  )
