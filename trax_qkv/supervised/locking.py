"""One run at a time per output directory.

Two runs writing checkpoints into the same directory would interleave
them. A run holds an exclusive `flock` on `<output_dir>/.trax_qkv.lock`
while it works; the kernel drops the lock when the process ends, however
it ends, so a killed run never leaves it stuck. The file names the holder
for the error a second run gets. In a run of several processes the chief
(process 0) holds it for all of them: the others write nothing there.
"""

import contextlib
import fcntl
import os
import socket
import sys
import time

from trax_qkv import files
from trax_qkv.supervised import distributed

LOCK_FILE = '.trax_qkv.lock'


class OutputDirBusyError(ValueError):
  """Another live process is running in this output directory."""


@contextlib.contextmanager
def hold_output_dir(output_dir):
  """Within the block this process holds `output_dir` (created if needed);
  raises OutputDirBusyError, naming the holder, if a live process does.

  The lock file is opened as `files.open_lock_file` does (never through a
  symbolic link); the holder's line is written only once the lock is held.
  Processes other than the chief of a run hold nothing.
  """
  if not distributed.is_chief():
    yield
    return
  os.makedirs(output_dir, exist_ok=True)
  fd = files.open_lock_file(output_dir, LOCK_FILE)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(fd, 4096, 0).decode('utf-8', 'replace').strip()
      raise OutputDirBusyError(
        f'output_dir {output_dir} is in use by a running job '
        f'({holder or "a process that has not named itself yet"}); wait '
        'for it to end, or choose another output directory.'
      ) from None
    line = (
      f'pid {os.getpid()} on {socket.gethostname()}, started '
      f'{time.strftime("%Y-%m-%d %H:%M:%S")}: {" ".join(sys.argv)}\n'
    )
    os.ftruncate(fd, 0)
    os.pwrite(fd, line.encode('utf-8'), 0)
    try:
      yield
    finally:
      os.ftruncate(fd, 0)
  finally:
    os.close(fd)  # closing drops the lock
