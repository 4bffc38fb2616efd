"""Entry points of trax_qkv's console commands (setup.cfg console_scripts).

Each command lives in `trax_qkv.cli.<command>`; this module only imports it
quietly. It sits outside the package, under a private name, because
importing anything inside `trax_qkv` first runs `trax_qkv/__init__`, which
imports Trax -- it must: a gin config that says `import trax_qkv` relies on
that import to register our configurables and sites -- and the start-up
noise of that import is what this module keeps behind --verbose. From a
checkout without installing, `python3 -m _trax_qkv_cli COMMAND [FLAGS]`
runs the same commands (COMMAND: train, validate, translate,
attention_map, bench, bench_kernels).

Importing Trax prints TensorFlow's and XLA's C++ start-up lines (absl,
oneDNN, CUDA stubs) and Gym's "unmaintained" notice, and gin logs
`Path not found` for each `include` it resolves by file path. None of it is
an error of the run. Without --verbose these go to /dev/null while the
heavy modules are imported, and gin's lookup messages are filtered; a
failing import still raises its own exception, with its traceback.
"""

import argparse
import contextlib
import functools
import importlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import warnings

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
  with to_devnull(2):
    yield


@contextlib.contextmanager
def to_devnull(fd):
  """Within the block file descriptor `fd` (1: stdout, 2: stderr; what C++
  libraries write included) goes to /dev/null."""
  stream = {1: sys.stdout, 2: sys.stderr}[fd]
  stream.flush()
  saved = os.dup(fd)
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, fd)
  try:
    yield
  finally:
    stream.flush()
    os.dup2(saved, fd)
    os.close(saved)
    os.close(devnull)


def run(command, argv=None):
  """Runs `trax_qkv.cli.<command>.main(argv)`, imported quietly unless
  argv has --verbose; returns its exit status. With --local_processes N
  it starts N processes of the command instead (`launch_local`), without
  importing it here."""
  argv = sys.argv[1:] if argv is None else list(argv)
  _die_with_launcher()
  n, rest = local_processes(argv)
  if n is not None and command in MULTI_PROCESS_COMMANDS:
    return launch_local(command, rest, n)
  with quiet_imports('--verbose' in argv):
    module = importlib.import_module(f'trax_qkv.cli.{command}')
  return module.main(argv)


# The commands that can run as several processes (their --help lists the
# flags, trax_qkv.supervised.distributed.add_flags).
MULTI_PROCESS_COMMANDS = ('train', 'validate')


def local_processes(argv):
  """(N of --local_processes N or None, argv without it)."""
  parser = argparse.ArgumentParser(add_help=False)
  parser.add_argument('--local_processes')
  known, rest = parser.parse_known_args(argv)
  return known.local_processes, rest


_PROCESS_FLAGS = (
  '--coordinator_address',
  '--num_processes',
  '--process_id',
  '--distributed',
)


def free_port():
  """A TCP port of 127.0.0.1 that nothing listens on now."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


# Set by `launch_local` in its children's environment: the launcher's pid.
LAUNCHER_ENV = 'TRAX_QKV_LAUNCHER_PID'


def _die_with_launcher():
  """In a child of `launch_local`: ends (SIGTERM) when the launcher ends,
  however it ends, so that no process of the run outlives it. (Set here,
  not between fork and exec: JAX in a launching test process warns of
  fork.)"""
  launcher = os.environ.pop(LAUNCHER_ENV, None)
  if launcher is None:
    return
  import ctypes

  PR_SET_PDEATHSIG = 1
  ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
  if os.getppid() != int(launcher):  # it ended before prctl
    sys.exit(1)


def child_environment(environ=None, devices=1):
  """A child's environment: JAX on CPU, `devices` CPU devices."""
  env = dict(os.environ if environ is None else environ)
  flags = re.sub(
    r'--xla_force_host_platform_device_count=\S*', '', env.get('XLA_FLAGS', '')
  )
  env['XLA_FLAGS'] = (
    f'{flags.strip()} --xla_force_host_platform_device_count={devices}'
  ).strip()
  env['JAX_PLATFORMS'] = 'cpu'
  here = os.path.dirname(os.path.abspath(__file__))
  env['PYTHONPATH'] = os.pathsep.join(
    p for p in (here, env.get('PYTHONPATH')) if p
  )
  return env


def launch_local(command, argv, n):
  """Runs `command` as N processes of one run on this machine (127.0.0.1,
  a free port, one CPU device each) and waits for all of them.

  Returns 0 when every process succeeded, else the first failure's exit
  status (1 for a process ended by a signal), after one line per failed
  process. Flags that place a process in a run are refused (exit 2).
  """
  try:
    n = int(n)
  except ValueError:
    n = 0
  if n < 1:
    print('error: --local_processes must be an int >= 1.', file=sys.stderr)
    return 2
  clash = [f for f in _PROCESS_FLAGS if any(a.split('=')[0] == f for a in argv)]
  if clash:
    print(
      f'error: --local_processes chooses {", ".join(clash)} itself; drop them.',
      file=sys.stderr,
    )
    return 2
  address = f'127.0.0.1:{free_port()}'
  env = dict(child_environment(), **{LAUNCHER_ENV: str(os.getpid())})
  children = [
    subprocess.Popen(
      [sys.executable, '-m', '_trax_qkv_cli', command, *argv]
      + ['--coordinator_address', address, '--num_processes', str(n)]
      + ['--process_id', str(i)],
      env=env,
    )
    for i in range(n)
  ]

  def forward(signum, frame):
    for child in children:
      if child.poll() is None:
        child.send_signal(signum)

  previous = {
    s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)
  }
  try:
    statuses = [child.wait() for child in children]
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  failed = [(i, rc) for i, rc in enumerate(statuses) if rc]
  for i, rc in failed:
    how = (
      f'was ended by {signal.Signals(-rc).name}'
      if rc < 0
      else f'exited with status {rc}'
    )
    print(f'error: process {i} of {n} {how}.', file=sys.stderr)
  return next((rc if rc > 0 else 1 for _, rc in failed), 0)


# The console_scripts of setup.cfg, one per module of trax_qkv.cli.
train = functools.partial(run, 'train')
validate = functools.partial(run, 'validate')
translate = functools.partial(run, 'translate')
attention_map = functools.partial(run, 'attention_map')
bench = functools.partial(run, 'bench')
bench_kernels = functools.partial(run, 'bench_kernels')


if __name__ == '__main__':
  if len(sys.argv) < 2 or sys.argv[1].startswith('-'):
    sys.exit(
      'usage: python3 -m _trax_qkv_cli COMMAND [FLAGS]; COMMAND is '
      'one of train, validate, translate, attention_map, bench, '
      'bench_kernels.'
    )
  sys.exit(run(sys.argv[1], sys.argv[2:]))
