"""Entry points of trax_qkv's console commands (setup.cfg console_scripts).

Each command lives in `trax_qkv.cli.<command>`; this module only imports it
quietly. It sits outside the package, under a private name, because
importing anything inside `trax_qkv` first runs `trax_qkv/__init__`, which
imports Trax -- it must: a gin config that says `import trax_qkv` relies on
that import to register our configurables and sites -- and the start-up
noise of that import is what this module keeps behind --verbose. From a
checkout without installing, `python3 -m _trax_qkv_cli COMMAND [FLAGS]`
runs the same commands (COMMAND: train, validate, translate,
attention_map, compare, circuits, bench, bench_kernels, serve).

Importing Trax prints TensorFlow's and XLA's C++ start-up lines (absl,
oneDNN, CUDA stubs) and Gym's "unmaintained" notice, and gin logs
`Path not found` for each `include` it resolves by file path. None of it is
an error of the run. Without --verbose these go to /dev/null while the
heavy modules are imported, and gin's lookup messages are filtered; a
failing import still raises its own exception, with its traceback.
"""

import contextlib
import functools
import importlib
import logging
import os
import sys
import warnings

import _trax_qkv_launcher as launcher

# Warnings of libraries about themselves, not about the user's run.
_NOISE_WARNINGS = (
  'jax.process_count has been renamed',  # trax calls the old name
  'GzipFile was opened for writing',  # trax's checkpoint writer
)


class _DropGinPathLookups(logging.Filter):
  def filter(self, record):
    return not str(record.msg).startswith('Path not found')


@contextlib.contextmanager
def quiet_imports(verbose=False):
  """Within the block, stderr (file descriptor 2) goes to /dev/null unless
  `verbose`; afterwards library noise warnings and gin's lookups stay
  filtered for the rest of the process."""
  if verbose:
    yield
    return
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  for message in _NOISE_WARNINGS:
    warnings.filterwarnings('ignore', message=message)
  logging.getLogger().addFilter(_DropGinPathLookups())
  with launcher.to_devnull(2):
    yield


def run(command, argv=None):
  """Runs `trax_qkv.cli.<command>.main(argv)`, imported quietly unless
  argv has --verbose; returns its exit status. With --local_processes N
  it starts N processes of the command instead (`_trax_qkv_launcher`),
  without importing it here."""
  argv = sys.argv[1:] if argv is None else list(argv)
  launcher.die_with_launcher()
  launcher.set_compilation_cache(argv)
  n, rest = launcher.local_processes(argv)
  if n is not None and command in launcher.MULTI_PROCESS_COMMANDS:
    return launcher.launch_local(command, rest, n)
  with quiet_imports('--verbose' in argv):
    module = importlib.import_module(f'trax_qkv.cli.{command}')
  from trax_qkv import files

  try:
    status = module.main(argv)
    try:
      sys.stdout.flush()  # output redirected to a full disk fails here
    except OSError as e:
      raise OSError(e.errno, e.strerror, 'standard output') from e
  except Exception as e:
    # A file the command writes (or reads) failed it mid-run: a full disk,
    # a quota, a directory made read-only or removed. What it wrote before
    # is whole (files.atomic_path, atomic checkpoints).
    cause = files.write_error(e)
    if cause is None:
      raise
    print(f'error: {cause}', file=sys.stderr)
    try:
      sys.stdout.flush()
    except OSError:  # else Python's exit flushes it again, and fails
      with contextlib.suppress(OSError):
        sys.stdout.close()
    return 1
  return status


# The console_scripts of setup.cfg, one per module of trax_qkv.cli.
train = functools.partial(run, 'train')
validate = functools.partial(run, 'validate')
translate = functools.partial(run, 'translate')
attention_map = functools.partial(run, 'attention_map')
compare = functools.partial(run, 'compare')
circuits = functools.partial(run, 'circuits')
bench = functools.partial(run, 'bench')
bench_kernels = functools.partial(run, 'bench_kernels')
serve = functools.partial(run, 'serve')


if __name__ == '__main__':
  if len(sys.argv) < 2 or sys.argv[1].startswith('-'):
    sys.exit(
      'usage: python3 -m _trax_qkv_cli COMMAND [FLAGS]; COMMAND is '
      'one of train, validate, translate, attention_map, compare, circuits, '
      'bench, bench_kernels, serve.'
    )
  sys.exit(run(sys.argv[1], sys.argv[2:]))
