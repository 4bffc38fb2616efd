"""Writing files whole, and locks on directories.

Every file a run writes appears whole or not at all: it is written to a
temporary file beside its destination and renamed onto it (`atomic_path`),
so a kill, a full disk or a second reader never sees half a file.

Locks are `flock`s on a file in the directory they guard. The lock file is
opened without following a symbolic link and must be a regular file, so a
link planted there cannot make a run write through it; it is never
truncated. The kernel drops a lock when its process ends, however it ends.

This module uses the standard library only.
"""

import contextlib
import fcntl
import json
import os
import stat
import sys
import tempfile


@contextlib.contextmanager
def atomic_path(path):
  """Yields a temporary path beside `path`; when the block ends without an
  exception it is renamed onto `path`, else removed.

  An OSError that names no file (a write to a full disk) is raised again
  naming `path`.

  Args:
    path: the file to write (its directory must exist).
  """
  directory, name = os.path.split(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=f'.{name}.', suffix='.tmp', dir=directory)
  os.close(fd)
  try:
    yield tmp
    os.replace(tmp, path)
  except OSError as e:
    if e.filename is not None:
      raise
    raise OSError(e.errno, e.strerror, path) from e
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def nearest_existing(path):
  """`path` itself if it exists, else its closest ancestor that does (where
  creating it would start)."""
  path = os.path.abspath(path)
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return path


def write_text(path, text):
  """Writes `text` (UTF-8) to `path` whole."""
  with atomic_path(path) as tmp:
    with open(tmp, 'w', encoding='utf-8') as f:
      f.write(text)


def write_json(path, value, **options):
  """Writes `value` as indented JSON to `path` whole; `options` go to
  json.dumps (e.g. default=str)."""
  write_text(path, json.dumps(value, indent=2, **options) + '\n')


def read_json_object(path, expected):
  """The JSON object (a dict) in `path`.

  Raises:
    ValueError: naming `path` and `expected` (what the object should hold,
      e.g. 'model settings'), when it is not UTF-8 JSON or not an object.
  """
  try:
    with open(path, encoding='utf-8') as f:
      value = json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(
      f'{path} is not valid JSON ({e}); expected a JSON object of {expected}.'
    ) from None
  if not isinstance(value, dict):
    raise ValueError(
      f'{path} holds a {type(value).__name__}; expected a '
      f'JSON object of {expected}.'
    )
  return value


class LockFileError(ValueError):
  """The lock file is a symbolic link or not a regular file."""


def open_lock_file(directory, name):
  """Opens (creating) `directory/name` for a lock, read-write, without
  following a symbolic link; raises LockFileError unless it is a regular
  file. Returns the file descriptor."""
  path = os.path.join(directory, name)
  try:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
  except OSError:
    if os.path.islink(path):
      raise LockFileError(
        f'{path} is a symbolic link; a lock file must be a regular file. '
        'Remove it (nothing of a run lives there).'
      ) from None
    if not os.path.isdir(path):
      raise
    fd = None
  if fd is None or not stat.S_ISREG(os.fstat(fd).st_mode):
    if fd is not None:
      os.close(fd)
    raise LockFileError(
      f'{path} is not a regular file; a lock file must be one. Remove it.'
    )
  return fd


@contextlib.contextmanager
def locked(directory, name):
  """Within the block this process holds an exclusive lock of `directory`
  (created if needed) through `directory/name`, waiting for any other
  holder first. Yields the lock's file descriptor."""
  os.makedirs(directory, exist_ok=True)
  fd = open_lock_file(directory, name)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield fd
  finally:
    os.close(fd)  # closing drops the lock


def write_error(error):
  """What went wrong, in one line, if `error` is a failed file operation
  (a full disk, a quota, a read-only or vanished directory: an OSError, or
  TensorFlow's file system error, which Trax's checkpoint writer raises);
  else None.

  TensorFlow is not imported here: where it is not loaded, none of its
  errors can have been raised.
  """
  if isinstance(error, OSError):
    if error.filename is None:
      return str(error)
    return f'{error.strerror or error}: {error.filename}'
  tf = sys.modules.get('tensorflow')
  op_error = getattr(getattr(tf, 'errors', None), 'OpError', None)
  if op_error is not None and isinstance(error, op_error):
    return ' '.join(str(error.message).split())
  return None
