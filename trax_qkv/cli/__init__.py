"""Console commands: one module per command, each with `build_parser()` and
`main(argv)`. `_trax_qkv_cli` (setup.cfg console_scripts) calls them; every
flag's default and help is written once, here or in the config it fills."""

import argparse
import hashlib
import sys

import _trax_qkv_launcher as launcher


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
  parser.add_argument(  # read by _trax_qkv_cli.run, before Trax is imported
    '--compilation_cache',
    metavar='DIR|off',
    default=None,
    help='where compiled XLA programs are kept for the next command, '
    "so that it compiles nothing it compiled before; 'off' keeps none "
    f'(default: ${launcher.COMPILATION_CACHE_ENV}, else '
    '$JAX_COMPILATION_CACHE_DIR, '
    'else ~/.cache/trax_qkv/xla)',
  )
  return parser


def add_model_dir_flag(parser, required=True):
  """--model_dir: a model directory written by trax-qkv-validate."""
  parser.add_argument(
    '--model_dir',
    required=required,
    help='directory of a trained model, e.g. runs/validate/reference',
  )


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
  from trax_qkv import compat
  from trax_qkv.models import registry

  attention = dict(args.attention)
  old = getattr(args, 'implementation', None)
  if old is not None:
    print(
      'notice: --implementation is deprecated and will be removed in '
      f'trax_qkv {compat.REMOVED_IN}; use --attention '
      f'cross_attention={old}.',
      file=sys.stderr,
    )
    attention.setdefault('cross_attention', old)
  attention = attention or None
  registry.check_attention(attention)
  return attention


def positive_int(text):
  """argparse type: an int >= 1."""
  try:
    return launcher.positive_int(text)
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


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


def add_process_flags(parser):
  """The flags that make the command one process of a run of several."""
  from trax_qkv.supervised import distributed

  distributed.add_flags(parser)


def run_job(command, argv, args, fingerprint, job):
  """Runs `job()` alone, as one process of the run that `args`' process
  flags describe, or, with --local_processes N, as N local processes of
  `command` (started with the rest of `argv`). Returns the exit status:
  0, 2 for what is wrong with the command line (nothing was written), 1
  for a run that stopped (its last checkpoint intact); prints errors.

  Args:
    command: one of `_trax_qkv_launcher.MULTI_PROCESS_COMMANDS`.
    argv: the command line (None: sys.argv[1:]).
    args: its parsed flags.
    fingerprint: a JSON-able dict of the settings every process of a run
      must share.
    job: what the command does.
  """
  import contextlib

  from trax_qkv.supervised import checkpointing
  from trax_qkv.supervised import distributed

  if args.local_processes is not None:
    _, rest = launcher.local_processes(
      sys.argv[1:] if argv is None else list(argv)
    )
    return launcher.launch_local(command, rest, args.local_processes)
  who = 'error'
  try:
    settings = distributed.from_flags(args)
    if settings is not None and not settings.auto:
      who = f'error (process {settings.process_id})'
    quiet_start = (
      contextlib.nullcontext if args.verbose else lambda: launcher.to_devnull(2)
    )
    with distributed.joined(settings, fingerprint, quiet_start):
      # Only the chief prints progress: the others' would repeat it.
      with (
        contextlib.nullcontext()
        if distributed.is_chief()
        else launcher.to_devnull(1)
      ):
        job()
  except (ValueError, PermissionError) as e:  # the command line
    print(f'{who}: {e}', file=sys.stderr)
    return 2
  except checkpointing.RunError as e:  # the run, stopped intact
    print(f'{who}: {e}', file=sys.stderr)
    return 1
  return 0


def fingerprint(args, exclude=(), files=()):
  """What every process of a run must share: its flags but `exclude` and
  the process flags, the contents (sha256) of `files`, and the versions
  of trax_qkv, trax and jax."""
  from trax_qkv.supervised import distributed
  from trax_qkv.validation import environment

  skip = {'verbose', 'compilation_cache', *exclude, *distributed.PROCESS_FLAGS}
  settings = {
    name: value for name, value in vars(args).items() if name not in skip
  }
  for path in files:
    try:
      with open(path, 'rb') as f:
        settings[f'sha256 of {path}'] = hashlib.sha256(f.read()).hexdigest()
    except OSError:
      settings[f'sha256 of {path}'] = None  # reported when the job reads it
  for package in ('trax_qkv', 'trax', 'jax'):
    settings[f'{package} version'] = environment.package_version(package)
  return settings
