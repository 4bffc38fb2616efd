"""Reading Trax's checkpoint files without running code from them.

Trax stores a checkpoint as pickles (`model.pkl.gz`, `data_counters0.pkl`)
and gzipped `.npy` streams (`model.weights.npy.gz`, `model.opt_slots0.npy.gz`).
Unpickling a file runs whatever callables it names, so a model directory
from someone else could run any command. `unpickle` admits only the
objects a real checkpoint holds (numpy and JAX arrays, dtypes and scalars,
`trax.shapes.ShapeDtype`, Trax's `History`, containers and builtin values)
and refuses any other before it is called, naming the file and the object;
it is pickle's own C unpickler otherwise, at pickle's speed. `trusting`
opens one file you trust to plain pickle, for one block. `np_from_file` is
Trax's, except that a truncated or damaged file is an error instead of a
shorter list of arrays. `trax_qkv.patches` makes Trax read through both.

This module imports neither Trax nor JAX.
"""

import collections
import contextlib
import contextvars
import functools
import gzip as gzip_lib
import io
import os
import pickle
import zlib

import numpy as np

# Every global that a checkpoint written by Trax 1.4.1 names, by writer, and
# the builtin containers and values pickle itself may name. Each entry is a
# class or function that only builds data from data when the unpickler calls
# it (Trax's own classes here are filled by setting their `__dict__`; none
# defines `__setstate__`). What the writers name, found by reading their
# pickles (tests/supervised/test_trax_checkpoints.py writes each one):
# - `training.Loop.save_checkpoint`: a dict of ints, strings, numpy arrays,
#   `ShapeDtype`s and the history as plain dicts and lists;
# - `trainer_lib.Trainer.save_state`: the same, inline weights and slots
#   (bfloat16 ones too), `opt_params` of JAX arrays, and the `History`
#   itself, whose values are `defaultdict(list)`s. (Its `_TrainerState` and
#   `_OptState` named tuples cannot be pickled: their names are not their
#   module's attributes.)
# - `Layer.save_to_file`, `trax.data`'s data counters, `trax.rl`'s task and
#   trainer files: dicts, lists and arrays, the task files' trajectories.
# Weights and optimizer slots in their own `.npy.gz` files are read without
# unpickling (`np_from_file`).
ALLOWED_GLOBALS = frozenset(
  [
    ('builtins', name)
    for name in (
      'bool',
      'bytearray',
      'bytes',
      'complex',
      'dict',
      'float',
      'frozenset',
      'int',
      'list',
      'range',
      'set',
      'slice',
      'str',
      'tuple',
    )
  ]
  + [
    ('_codecs', 'encode'),  # bytes in protocol-2 pickles
    ('collections', 'OrderedDict'),
    # Trax's History; admitted through `_defaultdict`, which checks the
    # factory (a defaultdict calls it later, for every missing key).
    ('collections', 'defaultdict'),
    ('numpy', 'dtype'),
    ('numpy', 'ndarray'),
    ('numpy.core.multiarray', '_reconstruct'),
    ('numpy.core.multiarray', 'scalar'),
    ('numpy.core.numeric', '_frombuffer'),
    ('numpy._core.multiarray', '_reconstruct'),
    ('numpy._core.multiarray', 'scalar'),
    ('numpy._core.numeric', '_frombuffer'),
    ('jax._src.array', '_reconstruct_array'),  # jax.Array state
    ('trax.shapes', 'ShapeDtype'),  # the input signature
    ('trax.supervised.history', 'History'),  # trainer_lib's metrics
    # trax.rl's task files (RLTask.save_to_file) read through the same
    # Trax function: trajectories of named tuples and arrays.
    ('trax.rl.task', 'Trajectory'),
    ('trax.rl.task', 'TimeStepBatch'),
    ('trax.rl.task', 'EnvInfo'),
  ]
  # The scalar type that the numpy dtype of bfloat16 weights names.
  + [('ml_dtypes', 'bfloat16')]
)

# The factories a checkpoint's defaultdict may have: types that build an
# empty value from nothing.
DEFAULTDICT_FACTORIES = (None, list, dict, set, int, float, str, tuple)


class CheckpointFileError(ValueError):
  """A checkpoint file that cannot be read."""


class UnsafeCheckpointError(CheckpointFileError):
  """A pickle that names an object no checkpoint holds (it could run code)."""


class CorruptCheckpointError(CheckpointFileError):
  """A checkpoint file that is truncated or damaged."""


def file_name(file):
  """The path of an open file (a GzipFile's underlying one), or '<file>'."""
  name = getattr(file, 'name', None)
  if not isinstance(name, str) and hasattr(file, 'fileobj'):
    name = getattr(file.fileobj, 'name', None)
  return name if isinstance(name, str) else '<file>'


def _defaultdict(file, factory=None, *args):
  """`collections.defaultdict` for the unpickler of `file`: a factory
  outside DEFAULTDICT_FACTORIES is refused (the dict would call it later,
  for every missing key)."""
  if factory not in DEFAULTDICT_FACTORIES:
    raise UnsafeCheckpointError(
      f'{file} holds a defaultdict whose factory is {factory!r}, which no '
      'Trax checkpoint holds: refusing to load it, since the dict would '
      f'call it. {_TRUST_HINT}'
    )
  return collections.defaultdict(factory, *args)


class _CheckpointUnpickler(pickle.Unpickler):
  """pickle.Unpickler that resolves only ALLOWED_GLOBALS."""

  def __init__(self, file, name):
    super().__init__(file)
    self._name = name

  def find_class(self, module, name):
    if (module, name) not in ALLOWED_GLOBALS:
      raise UnsafeCheckpointError(
        f'{self._name} refers to {module}.{name}, which no Trax checkpoint '
        'holds: refusing to load it, since unpickling it could run code. '
        f'{_TRUST_HINT}'
      )
    if (module, name) == ('collections', 'defaultdict'):
      return functools.partial(_defaultdict, self._name)
    return super().find_class(module, name)


_TRUST_HINT = (
  'Load only model directories written by trax_qkv or Trax; to load a '
  'file you trust anyway, read it inside '
  '`with trax_qkv.checkpoint_files.trusting(path):`.'
)

# Real paths of the files `trusting` opened to plain pickle, per context.
_trusted = contextvars.ContextVar('trax_qkv_trusted_files', default=())


@contextlib.contextmanager
def trusting(*paths):
  """Within the block, the pickle files at `paths` are read by plain
  `pickle.load`, with everything it may run: the opt-out for a file that
  `unpickle` refuses and that you trust (you wrote it, with objects of your
  own). Every other file stays restricted, as it does outside the block
  and in other threads.

      with trax_qkv.checkpoint_files.trusting('old/model.pkl.gz'):
        model.init_from_file('old/model.pkl.gz')

  Args:
    *paths: the `.pkl` / `.pkl.gz` files to trust, as paths.
  """
  for path in paths:
    if not isinstance(path, (str, os.PathLike)):
      raise TypeError(
        f'trusting takes file paths (str or os.PathLike); got {path!r}.'
      )
  token = _trusted.set(
    _trusted.get() + tuple(os.path.realpath(p) for p in paths)
  )
  try:
    yield
  finally:
    _trusted.reset(token)


def unpickle(file):
  """`pickle.load(file)` restricted to what a checkpoint holds.

  Args:
    file: an open binary file (a GzipFile too) at the start of a pickle.

  Returns:
    The unpickled object.

  Raises:
    UnsafeCheckpointError: the pickle names an object outside
      ALLOWED_GLOBALS (raised before that object is looked up or called).
    CorruptCheckpointError: the file is truncated or not a (gzip) pickle.
  """
  name = file_name(file)
  if name != '<file>' and os.path.realpath(name) in _trusted.get():
    return pickle.load(file)
  try:
    return _CheckpointUnpickler(file, name).load()
  except UnsafeCheckpointError:
    raise
  except (
    EOFError,
    pickle.UnpicklingError,
    zlib.error,
    gzip_lib.BadGzipFile,
    ValueError,
    TypeError,
    AttributeError,
    IndexError,
  ) as e:
    raise CorruptCheckpointError(
      f'{name} is damaged or truncated ({type(e).__name__}: {e}); it is '
      'not a complete checkpoint file. Restore it, or train again.'
    ) from e


def unpickle_from_file(path, gzip=False):
  """Trax's `training.unpickle_from_file`, through `unpickle`."""
  with open(path, 'rb') as f:
    if not gzip:
      return unpickle(f)
    with gzip_lib.GzipFile(fileobj=f) as gzipf:
      return unpickle(gzipf)


# Within `reading_once`: {(path, size, mtime): arrays} of files read.
_memo = None


@contextlib.contextmanager
def reading_once():
  """Within the block, `np_from_file` reads each unchanged file once.

  A resume checks the checkpoint's weights and slots against the model
  before Trax loads them; this keeps that from reading every file twice.
  """
  global _memo
  outer, _memo = _memo, {} if _memo is None else _memo
  try:
    yield
  finally:
    _memo = outer


def np_from_file(file_path, compresslevel=None):
  """The arrays of a gzipped stream of `.npy` records (Trax's weights and
  optimizer-slot files), without unpickling.

  Trax's own `np_from_file` stops at the first record it cannot read, so a
  truncated file silently yields fewer arrays; here only a clean end of
  the stream ends the list.

  Args:
    file_path: the `.npy.gz` file.
    compresslevel: unused (gzip needs none to read); Trax passes it.

  Returns:
    The list of numpy arrays in the file.

  Raises:
    FileNotFoundError: no such file (as Trax's).
    CorruptCheckpointError: the file is truncated or damaged.
  """
  del compresslevel
  if _memo is not None:
    stat = os.stat(file_path)
    key = (os.path.abspath(file_path), stat.st_size, stat.st_mtime_ns)
    if key not in _memo:
      _memo[key] = _read_arrays(file_path)
    return list(_memo[key])
  return _read_arrays(file_path)


def _read_arrays(file_path):
  arrays = []
  with open(file_path, 'rb') as f, gzip_lib.GzipFile(fileobj=f) as gzipf:
    try:
      while gzipf.peek(1):
        arrays.append(np.load(gzipf, allow_pickle=False))
    except (EOFError, OSError, ValueError, zlib.error) as e:
      raise CorruptCheckpointError(
        f'{file_path} is damaged or truncated after {len(arrays)} arrays '
        f'({type(e).__name__}: {e}); it is not a complete checkpoint '
        'file. Restore it, or train again.'
      ) from e
  return arrays


class SafePickleModule:
  """Stands in for the `pickle` module inside Trax's modules: `load` and
  `loads` go through `unpickle`; everything else is pickle's."""

  def __getattr__(self, name):
    return getattr(pickle, name)

  @staticmethod
  def load(file, **unused_kwargs):
    return unpickle(file)

  @staticmethod
  def loads(data, **unused_kwargs):
    return unpickle(io.BytesIO(data))
