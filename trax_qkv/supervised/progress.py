"""Progress of long work: a bar on a terminal, a log line every so often
elsewhere (a log file, CI), so that a run is never silent for minutes."""

import sys
import time

import tqdm


class Progress:
  """Counts units of work (batches, steps) towards `total`.

  On a terminal it draws a tqdm bar on stderr; otherwise it calls
  `log(line)` when a tenth of the work more is done, or `every_seconds`
  have passed since its last line, and at the end.
  """

  def __init__(
    self,
    total,
    description,
    log=print,
    unit='batch',
    every_seconds=60.0,
    stream=None,
  ):
    self._total = max(int(total), 1)
    self._description = description
    self._log = log
    self._done = 0
    self._start = time.time()
    self._last_line = (0, self._start)
    self._every_seconds = every_seconds
    stream = stream or sys.stderr
    self._bar = (
      tqdm.tqdm(
        total=self._total, desc=description, unit=unit, file=stream, leave=False
      )
      if stream.isatty()
      else None
    )

  def update(self, n=1, **info):
    """`n` more units done; `info` (e.g. loss=1.23) goes into the line."""
    self._done += n
    if self._bar is not None:
      self._bar.update(n)
      if info:
        self._bar.set_postfix(info)
      return
    last_done, last_time = self._last_line
    now = time.time()
    if (
      self._done == self._total
      or self._done - last_done >= self._total / 10
      or now - last_time >= self._every_seconds
    ):
      elapsed = now - self._start
      left = elapsed / self._done * (self._total - self._done)
      extra = ''.join(
        f', {k} {v:.4g}' if isinstance(v, float) else f', {k} {v}'
        for k, v in info.items()
      )
      self._log(
        f'{self._description}: {self._done}/{self._total} '
        f'({elapsed:.0f} s, ~{left:.0f} s left{extra})'
      )
      self._last_line = (self._done, now)

  def close(self):
    if self._bar is not None:
      self._bar.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()
