"""Several processes as one run, on JAX's distributed runtime.

`trax-qkv-train` and `trax-qkv-validate` join a run of N processes, on one
host or many, with `--coordinator_address HOST:PORT --num_processes N
--process_id I` (or `--distributed auto`, where
`jax.distributed.initialize()` finds the cluster itself: SLURM, Open MPI,
Cloud TPU). `joined()` starts JAX's runtime before any JAX computation and
keeps it for the command:

* every process is started with the same settings: each puts its settings
  in the coordinator's key-value store and compares them with the chief's
  (process 0) before anything is prepared or written;
* all processes read the same batches and train in lockstep
  (`data_parallel`); the chief holds the output directory and writes
  everything in it, the others write nothing there (and the commands
  print only their errors);
* a process that dies or hangs is noticed through JAX's heartbeats: within
  `--heartbeat_timeout` seconds every other process stops with one line
  naming it, and the output directory keeps its last complete checkpoint
  (checkpoints are committed atomically, by the chief alone), from which
  the same N commands resume.

JAX ends every process when one stops sending heartbeats, with a fatal log
and a stack trace; its recoverable mode (`jax_enable_recoverability`) lets
a process live on instead, so a watchdog thread here asks the coordinator
which processes are alive and ends this one with a line of its own. When
process 0, which serves the coordinator, dies, JAX's client still ends the
others at once with its fatal log: nothing in Python can catch it.

The barrier with a timeout and the live-process query are the runtime
client's (`jax._src.distributed.global_state.client`, jax 0.10.2 as
setup.cfg pins it): JAX's public API has neither.
"""

import contextlib
import dataclasses
import json
import os
import socket
import sys
import threading
import time

import jax
from jax._src import distributed as jax_distributed
from jax.experimental import multihost_utils
import numpy as np

import _trax_qkv_launcher as launcher

CHIEF = 0
DEFAULT_HEARTBEAT_TIMEOUT = 120
DEFAULT_INITIALIZATION_TIMEOUT = 300
# Waits for other processes that are alive (the chief decoding while the
# others are done): heartbeats bound them, not this.
_BARRIER_TIMEOUT_MS = 24 * 3600 * 1000
_WATCH_INTERVAL = 2.0
# Exit status of a process stopped because another was lost: a run that
# stopped with its last checkpoint intact, as the commands' own.
EXIT_RUN = 1
# The flags of `add_flags`: where this process is, not what the run does.
PROCESS_FLAGS = tuple(
  flag.removeprefix('--')
  for flag in launcher.PLACEMENT_FLAGS
  + ('--heartbeat_timeout', '--initialization_timeout')
  + (launcher.LOCAL_PROCESSES_FLAG,)
)


@dataclasses.dataclass(frozen=True)
class Settings:
  """How this process joins a run (`from_flags`)."""

  coordinator_address: str = None
  num_processes: int = None
  process_id: int = None
  auto: bool = False
  heartbeat_timeout: int = DEFAULT_HEARTBEAT_TIMEOUT
  initialization_timeout: int = DEFAULT_INITIALIZATION_TIMEOUT

  def describe(self):
    if self.auto:
      return 'the cluster found by jax.distributed.initialize()'
    return f'{self.coordinator_address} ({self.num_processes} processes)'


def add_flags(parser):
  """The flags of a command that can run as several processes."""
  group = parser.add_argument_group(
    'several processes (JAX distributed runtime; see docs/distributed.md)'
  )
  group.add_argument(
    '--coordinator_address',
    metavar='HOST:PORT',
    help='address of process 0, which coordinates the run (every process '
    'gives the same)',
  )
  group.add_argument(
    '--num_processes', type=int, metavar='N', help='processes in the run'
  )
  group.add_argument(
    '--process_id',
    type=int,
    metavar='I',
    help='this process, 0 to N-1; 0 is the chief, which writes the outputs',
  )
  group.add_argument(
    '--distributed',
    choices=['auto'],
    help="'auto': let jax.distributed.initialize() find the cluster "
    '(SLURM, Open MPI, Cloud TPU) instead of the three flags above',
  )
  group.add_argument(
    '--heartbeat_timeout',
    type=int,
    default=DEFAULT_HEARTBEAT_TIMEOUT,
    metavar='SECONDS',
    help='a process silent this long is lost, and the others stop '
    f'(default: {DEFAULT_HEARTBEAT_TIMEOUT})',
  )
  group.add_argument(
    '--initialization_timeout',
    type=int,
    default=DEFAULT_INITIALIZATION_TIMEOUT,
    metavar='SECONDS',
    help='how long to wait for the coordinator and the other processes '
    f'at start (default: {DEFAULT_INITIALIZATION_TIMEOUT})',
  )
  group.add_argument(  # an int >= 1, checked by the launcher
    launcher.LOCAL_PROCESSES_FLAG,
    metavar='N',
    help='try it on this machine: start N processes on 127.0.0.1, one CPU '
    'device each, and wait for them',
  )


def from_flags(args):
  """Settings of `add_flags`' flags; None for a one-process run.

  Raises:
    ValueError: flags that do not describe one process of a run.
  """
  given = [
    f'--{name}'
    for name in ('coordinator_address', 'num_processes', 'process_id')
    if getattr(args, name) is not None
  ]
  for name in ('heartbeat_timeout', 'initialization_timeout'):
    if getattr(args, name) < 1:
      raise ValueError(
        f'--{name} must be a number of seconds >= 1; got {getattr(args, name)}.'
      )
  if args.distributed == 'auto':
    if given:
      raise ValueError(
        f'--distributed auto finds the cluster itself; drop {" ".join(given)}.'
      )
    return Settings(
      auto=True,
      heartbeat_timeout=args.heartbeat_timeout,
      initialization_timeout=args.initialization_timeout,
    )
  if not given:
    return None
  if len(given) < 3:
    raise ValueError(
      'a process of a run needs --coordinator_address HOST:PORT, '
      f'--num_processes N and --process_id I; got only {" ".join(given)}.'
    )
  host, colon, port = args.coordinator_address.rpartition(':')
  if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(
      '--coordinator_address must be HOST:PORT (e.g. 10.0.0.1:1234, the '
      f'address of process 0); got {args.coordinator_address!r}.'
    )
  n, i = args.num_processes, args.process_id
  if n < 1:
    raise ValueError(f'--num_processes must be >= 1; got {n}.')
  if not 0 <= i < n:
    raise ValueError(
      f'--process_id must be 0 to {n - 1} (--num_processes {n}); got {i}.'
    )
  return Settings(
    args.coordinator_address,
    n,
    i,
    heartbeat_timeout=args.heartbeat_timeout,
    initialization_timeout=args.initialization_timeout,
  )


class ProcessMismatchError(ValueError):
  """A process of the run was started with other settings than the chief."""


class CoordinatorError(ValueError):
  """The coordinator cannot be reached (or, on process 0, served)."""


def _check_coordinator(settings):
  """Before JAX tries (and aborts the process when it fails): process 0
  must be able to listen on the port, the others to reach it in time."""
  host, _, port = settings.coordinator_address.rpartition(':')
  host = host.strip('[]')
  if settings.process_id == CHIEF:
    try:
      with socket.create_server(('', int(port))):
        pass
    except OSError as e:
      raise CoordinatorError(
        f'process 0 cannot listen on port {port} for '
        f'--coordinator_address {settings.coordinator_address}: '
        f'{e.strerror or e}; choose a free port.'
      ) from None
    return
  deadline = time.time() + settings.initialization_timeout
  while True:
    try:
      with socket.create_connection((host, int(port)), timeout=5):
        return
    except OSError as e:
      if time.time() >= deadline:
        raise CoordinatorError(
          f'the coordinator {settings.coordinator_address} did not answer '
          f'within {settings.initialization_timeout} s '
          f'({e.strerror or e}): start process 0 there, or give its '
          'address.'
        ) from None
      time.sleep(0.5)


def _client():
  return jax_distributed.global_state.client


class _Watchdog:
  """Ends this process, with one line, when another one of the run is
  lost (silent for the heartbeat timeout) or the coordinator is gone."""

  def __init__(self, heartbeat_timeout):
    self._timeout = heartbeat_timeout
    self._ending = threading.Event()
    self._thread = threading.Thread(
      target=self._watch, name='trax_qkv-watchdog', daemon=True
    )
    self._thread.start()

  def end(self):
    """From now on, processes that leave are done, not lost."""
    self._ending.set()

  def _watch(self):
    n, me = jax.process_count(), jax.process_index()
    everyone = list(range(n))
    while not self._ending.wait(_WATCH_INTERVAL):
      try:
        alive = _client().get_live_nodes(everyone)
      except Exception:  # noqa: BLE001 (any failure: the coordinator is gone)
        lost = (
          f'process {CHIEF} of {n} (the chief, which runs the coordinator) '
          'cannot be reached'
        )
      else:
        missing = [i for i in everyone if i not in alive]
        if not missing:
          continue
        lost = (
          f'process {", ".join(map(str, missing))} of {n} sent no heartbeat '
          f'for {self._timeout} s'
        )
      if self._ending.is_set():
        return
      _stop(
        f'error (process {me}): {lost}: it was killed, crashed or hung, so '
        'this process stops too. The output directory keeps its last '
        f'complete checkpoint; start the same {n} processes again to '
        'resume.'
      )

  def wait(self, seconds):
    """Gives the watchdog `seconds` to notice a lost process."""
    self._thread.join(seconds)


def _stop(line):
  """Ends the process at once: JAX's own shutdown would wait for the lost
  process, then abort."""
  print(line, file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(EXIT_RUN)


def _looks_like_a_lost_peer(error):
  """A collective that failed because another process went away."""
  text = f'{type(error).__name__}: {error}'
  return 'Gloo' in text or 'JaxRuntimeError' in text or 'UNAVAILABLE' in text


_barriers = 0


def is_distributed():
  """Whether this process is one of several (jax.distributed)."""
  return jax.process_count() > 1


def barrier(name):
  """Waits until every process of the run gets here (at once when alone)."""
  global _barriers
  if not is_distributed():
    return
  _barriers += 1
  _client().wait_at_barrier(f'trax_qkv/{name}/{_barriers}', _BARRIER_TIMEOUT_MS)


def is_chief():
  return jax.process_index() == CHIEF


def chief_only(fn, *args, **kwargs):
  """Runs `fn` on the chief alone, then lets every process on (what it
  wrote is then complete)."""
  if is_chief():
    fn(*args, **kwargs)
  barrier(fn.__name__)


def chief_first(fn, *args, **kwargs):
  """Runs `fn` on the chief, then, once it is done, on every other process
  (which then reads what the chief prepared); returns its value."""
  if is_chief():
    value = fn(*args, **kwargs)
    barrier(fn.__name__)
    return value
  barrier(fn.__name__)
  return fn(*args, **kwargs)


def same_seed(seed):
  """`seed`, or when None one drawn by the chief, on every process."""
  if not is_distributed():
    return seed
  drawn = np.int64(np.random.SeedSequence().entropy % 2**31)
  chosen = np.int64(-1 if seed is None else seed)
  seeds = multihost_utils.broadcast_one_to_all(np.array([chosen, drawn]))
  return int(seeds[1] if seeds[0] < 0 else seeds[0])


def _compare_settings(fingerprint, n, me, timeout):
  """Raises ProcessMismatchError unless every process's `fingerprint`
  (a JSON-able dict) equals the chief's."""
  client = _client()
  text = json.dumps(fingerprint, sort_keys=True)
  client.key_value_set(f'trax_qkv/settings/{me}', text)
  others = [CHIEF] if me != CHIEF else range(1, n)
  mine = json.loads(text)  # as the others read it (tuples are lists)
  for i in others:
    theirs = json.loads(
      client.blocking_key_value_get(f'trax_qkv/settings/{i}', timeout * 1000)
    )
    if theirs != mine:
      chief, other = (mine, theirs) if me == CHIEF else (theirs, mine)
      other_id = i if me == CHIEF else me
      differences = '; '.join(
        f'{key}: {chief.get(key)!r} vs {other.get(key)!r}'
        for key in sorted(set(chief) | set(other))
        if chief.get(key) != other.get(key)
      )
      raise ProcessMismatchError(
        f'process {other_id} was started with other settings than process '
        f'0, the chief ({differences}); start every process of the run '
        'with the same flags but --process_id.'
      )


@contextlib.contextmanager
def joined(settings, fingerprint, quiet_start=contextlib.nullcontext):
  """Within the block this process is one of the run of `settings` (None:
  it runs alone, and this does nothing).

  Args:
    settings: `from_flags`' Settings, or None.
    fingerprint: a JSON-able dict of everything that must be the same on
      every process (the command's settings); compared before the block.
    quiet_start: a context manager factory; the runtime starts within
      one (the commands pass one that hides JAX's and XLA's C++ start-up
      logs: a failure raises, its message in the exception, and the fatal
      ones are checked for before, `_check_coordinator`).

  Raises:
    CoordinatorError, ProcessMismatchError (ValueErrors): before the block,
      nothing done.
  """
  if settings is None:
    yield
    return
  if not settings.auto:
    _check_coordinator(settings)
  jax.config.update('jax_enable_recoverability', True)
  with quiet_start():
    jax.distributed.initialize(
      settings.coordinator_address,
      settings.num_processes,
      settings.process_id,
      initialization_timeout=settings.initialization_timeout,
      heartbeat_timeout_seconds=settings.heartbeat_timeout,
    )
    n, me = jax.process_count(), jax.process_index()  # starts the backend
  try:
    _compare_settings(fingerprint, n, me, settings.initialization_timeout)
  except BaseException:
    _leave()
    raise
  watchdog = _Watchdog(settings.heartbeat_timeout)
  try:
    yield
    barrier('end')
  except BaseException as e:
    if _looks_like_a_lost_peer(e):
      watchdog.wait(settings.heartbeat_timeout + 3 * _WATCH_INTERVAL)
    raise
  finally:
    watchdog.end()
    _leave()


def _leave():
  """Leaves the run; the chief, whose process serves the coordinator,
  waits (a few seconds at most) for the others to leave first."""
  if is_chief() and is_distributed():
    deadline = time.time() + 10
    everyone = list(range(jax.process_count()))
    while time.time() < deadline:
      try:
        if len(_client().get_live_nodes(everyone)) <= 1:
          break
      except Exception:  # noqa: BLE001
        break
      time.sleep(0.2)
  jax.distributed.shutdown()
