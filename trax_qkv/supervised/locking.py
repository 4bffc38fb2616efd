"""One run at a time per output directory.

Two runs writing checkpoints into the same directory would interleave
them. A run holds an exclusive `flock` on `<output_dir>/.trax_qkv.lock`
while it works; the kernel drops the lock when the process ends, however
it ends, so a killed run never leaves it stuck. The file names the holder
for the error a second run gets.
"""

import contextlib
import fcntl
import os
import socket
import sys
import time

LOCK_FILE = '.trax_qkv.lock'


class OutputDirBusyError(ValueError):
  """Another live process is running in this output directory."""


@contextlib.contextmanager
def hold_output_dir(output_dir):
  """Within the block this process holds `output_dir` (created if needed);
  raises OutputDirBusyError, naming the holder, if a live process does."""
  os.makedirs(output_dir, exist_ok=True)
  f = open(os.path.join(output_dir, LOCK_FILE), 'a+', encoding='utf-8')  # pylint: disable=consider-using-with
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    f.seek(0)
    holder = f.read().strip() or 'a process that has not named itself yet'
    f.close()
    raise OutputDirBusyError(
        f'output_dir {output_dir} is in use by a running job ({holder}); '
        'wait for it to end, or choose another output directory.') from None
  f.seek(0)
  f.truncate()
  f.write(f'pid {os.getpid()} on {socket.gethostname()}, started '
          f'{time.strftime("%Y-%m-%d %H:%M:%S")}: {" ".join(sys.argv)}\n')
  f.flush()
  try:
    yield
  finally:
    f.seek(0)
    f.truncate()
    fcntl.flock(f, fcntl.LOCK_UN)
    f.close()
