"""Starting the processes of a run: what trax_qkv's commands do before, or
instead of, importing Trax.

It sits outside the package, beside `_trax_qkv_cli`, and imports nothing of
trax_qkv: importing anything inside `trax_qkv` first imports Trax, and a
launcher of N processes, which only waits for them, should not pay that.
`_trax_qkv_cli` (the console scripts), `trax_qkv.cli` and
`trax_qkv.supervised.distributed` all take these definitions from here.
"""

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys

# The commands that can run as several processes (their --help lists the
# flags: trax_qkv.supervised.distributed.add_flags).
MULTI_PROCESS_COMMANDS = ('train', 'validate')
# Runs N processes of a command on this machine (`launch_local`).
LOCAL_PROCESSES_FLAG = '--local_processes'
# The flags that place one process in a run; `launch_local` sets them.
PLACEMENT_FLAGS = (
  '--coordinator_address',
  '--num_processes',
  '--process_id',
  '--distributed',
)
# Set by `launch_local` in its children's environment: the launcher's pid.
LAUNCHER_ENV = 'TRAX_QKV_LAUNCHER_PID'
# Where the commands keep compiled programs, unless --compilation_cache
# says otherwise: a directory, or 'off'.
COMPILATION_CACHE_ENV = 'TRAX_QKV_COMPILATION_CACHE'
COMPILATION_CACHE_FLAG = '--compilation_cache'


def positive_int(text):
  """int(text) if it is an int >= 1; ValueError saying so otherwise."""
  try:
    value = int(text)
  except (TypeError, ValueError):
    value = 0
  if value < 1:
    raise ValueError(f'must be an int >= 1; got {text!r}')
  return value


def compilation_cache_dir(flag=None, environ=None):
  """The directory of JAX's persistent compilation cache for a command,
  or None (off): --compilation_cache, else $TRAX_QKV_COMPILATION_CACHE,
  else JAX's own $JAX_COMPILATION_CACHE_DIR, else the user's cache
  directory ($XDG_CACHE_HOME or ~/.cache) / trax_qkv / xla."""
  environ = os.environ if environ is None else environ
  value = flag if flag is not None else environ.get(COMPILATION_CACHE_ENV)
  if value is not None:
    return None if value in ('', 'off') else value
  if environ.get('JAX_COMPILATION_CACHE_DIR'):
    return environ['JAX_COMPILATION_CACHE_DIR']
  base = environ.get('XDG_CACHE_HOME') or os.path.join(
    os.path.expanduser('~'), '.cache'
  )
  return os.path.join(base, 'trax_qkv', 'xla')


def set_compilation_cache(argv, environ=None):
  """Puts the cache of `argv`'s --compilation_cache (or its default) in
  `environ` (os.environ) for JAX, which reads it when it is imported."""
  environ = os.environ if environ is None else environ
  parser = argparse.ArgumentParser(add_help=False)
  parser.add_argument(COMPILATION_CACHE_FLAG)
  flag = parser.parse_known_args(argv)[0].compilation_cache
  path = compilation_cache_dir(flag, environ)
  if path is None:
    environ['JAX_ENABLE_COMPILATION_CACHE'] = 'false'
  else:
    environ['JAX_COMPILATION_CACHE_DIR'] = path


def local_processes(argv):
  """(N of --local_processes N or None, argv without it)."""
  parser = argparse.ArgumentParser(add_help=False)
  parser.add_argument(LOCAL_PROCESSES_FLAG)
  known, rest = parser.parse_known_args(argv)
  return known.local_processes, rest


def free_port():
  """A TCP port of 127.0.0.1 that nothing listens on now."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def die_with_launcher():
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
  process. A bad N, or flags that place a process in a run, are refused
  (exit 2).
  """
  try:
    n = positive_int(n)
  except ValueError as e:
    print(f'error: {LOCAL_PROCESSES_FLAG} {e}.', file=sys.stderr)
    return 2
  clash = [
    f for f in PLACEMENT_FLAGS if any(a.split('=')[0] == f for a in argv)
  ]
  if clash:
    print(
      f'error: {LOCAL_PROCESSES_FLAG} chooses {", ".join(clash)} itself; '
      'drop them.',
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
  statuses = _wait_forwarding_signals(children)
  failed = [(i, rc) for i, rc in enumerate(statuses) if rc]
  for i, rc in failed:
    how = (
      f'was ended by {signal.Signals(-rc).name}'
      if rc < 0
      else f'exited with status {rc}'
    )
    print(f'error: process {i} of {n} {how}.', file=sys.stderr)
  return next((rc if rc > 0 else 1 for _, rc in failed), 0)


def _wait_forwarding_signals(children):
  """The children's exit statuses; SIGINT and SIGTERM reach them meanwhile."""

  def forward(signum, frame):
    for child in children:
      if child.poll() is None:
        child.send_signal(signum)

  previous = {
    s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)
  }
  try:
    return [child.wait() for child in children]
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


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
