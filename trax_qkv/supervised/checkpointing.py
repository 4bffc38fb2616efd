"""Checkpoints that survive a kill and resume a `training.Loop` exactly.

Trax's `training.Loop`, killed and restarted from its checkpoint, does not
continue the run it interrupted:

* it writes a checkpoint as several files in place (`model.pkl.gz`,
  `model.weights.npy.gz`, `model.opt_slots0.npy.gz`, `data_counters0.pkl`),
  so a kill during a write leaves a truncated file or a mix of two steps;
* it does not save its random key, so a resumed run replays the dropout
  keys of step 1;
* at a step that is both a checkpoint and an eval step it saves *before* the
  eval, so the checkpoint lacks that step's metrics and the eval's draws of
  random keys and eval batches.

`ResumableLoop` fixes the three: a checkpoint is written to a staging
directory, committed by one atomic rename, then moved into place (a restart
finishes an interrupted move first); the random key is part of it; and at
eval steps it is written after the evals. The position in the data streams is
Trax's own mechanism, `trax.data.CountAndSkip` counters saved with each
checkpoint (the streams must be deterministic; `trax_qkv.data`'s are).
"""

import os
import shutil

import jax
import numpy as np
from trax import layers as tl
from trax.data import inputs as trax_inputs
from trax.supervised import training

from trax_qkv import checkpoint_files
from trax_qkv import files
from trax_qkv.supervised import data_parallel
from trax_qkv.supervised import distributed
from trax_qkv.supervised.progress import Progress

RNG_SUFFIX = '.rng.npy'
_STAGING = '.{}.staging'
_COMMITTED = '.{}.committed'


def finish_interrupted_save(output_dir):
  """Moves a committed but not yet moved checkpoint into `output_dir`.

  A commit is a complete checkpoint (the rename is the commit point); moving
  its files one `os.replace` at a time is idempotent, so this completes a
  move that a kill interrupted. Staging directories that were never
  committed are incomplete and deleted.
  """
  if not os.path.isdir(output_dir):
    return
  for name in sorted(os.listdir(output_dir)):
    path = os.path.join(output_dir, name)
    if name.startswith('.') and name.endswith('.committed'):
      for filename in sorted(os.listdir(path)):
        os.replace(
          os.path.join(path, filename), os.path.join(output_dir, filename)
        )
      os.rmdir(path)
    elif name.startswith('.') and name.endswith('.staging'):
      shutil.rmtree(path)


def checkpoint_step(output_dir, basename='model'):
  """The step of the checkpoint in `output_dir` (0 when there is none)."""
  path = os.path.join(output_dir, basename + '.pkl.gz')
  if not os.path.exists(path):
    return 0
  return int(_metadata(path)['step'])


def check_checkpoint_files(output_dir, basename='model'):
  """Reads every file that a Loop resuming in `output_dir` would read (the
  checkpoint's pickle, weights and optimizer slots, the data counters)
  through `checkpoint_files`, and raises its CheckpointFileError (a
  ValueError) for one that names objects no checkpoint holds or is
  damaged. Called before a run writes anything, so such a directory is
  refused untouched.
  """
  if not os.path.isdir(output_dir):
    return
  prefix = basename + '.'
  for name in sorted(os.listdir(output_dir)):
    path = os.path.join(output_dir, name)
    if name == prefix + 'pkl.gz':
      _metadata(path)
    elif name.startswith(prefix) and name.endswith('.npy.gz'):
      checkpoint_files.np_from_file(path)
    elif name.startswith('data_counters') and name.endswith('.pkl'):
      checkpoint_files.unpickle_from_file(path)


def _metadata(path):
  """The dict of a checkpoint's `.pkl.gz` file (read without running code)."""
  meta = checkpoint_files.unpickle_from_file(path, gzip=True)
  if not isinstance(meta, dict) or not isinstance(meta.get('step'), int):
    raise checkpoint_files.CorruptCheckpointError(
      f'{path} is not a Trax checkpoint: it holds no dict with a step.'
    )
  return meta


class CheckpointMismatchError(ValueError):
  """The checkpoint to resume from was written by a different model."""


class RunError(RuntimeError):
  """Training stopped; the last checkpoint on disk is intact."""


class NonFiniteLossError(RunError):
  """The training loss became NaN or infinite."""


class CheckpointWriteError(RunError):
  """A checkpoint could not be written (disk full, ...)."""


def _shapes(arrays):
  """Shapes of the arrays, skipping Trax's empty markers (None and ())."""
  return [
    np.shape(a)
    for a in arrays
    if a is not None and not (isinstance(a, tuple) and not a)
  ]


def _first_misfit(saved, expected, what):
  """Where two lists of shapes differ, in words; None when they agree."""
  if len(saved) != len(expected):
    return f'it holds {len(saved)} {what} arrays, the model has {len(expected)}'
  for i, (a, b) in enumerate(zip(saved, expected)):
    if a != b:
      return f'{what} #{i} has shape {a}, the model expects {b}'
  return None


def check_checkpoint_fits(
  model, directory, basename='model', slots_per_task=None
):
  """Raises CheckpointMismatchError unless the checkpoint's weights (and,
  given the optimizer slots of each task, its slot files) have the shapes
  of `model`'s initialized weights (and of those slots), one by one.

  Trax matches weights and slots by shape and quietly keeps its fresh ones
  where none fits, so resuming with another d_model, vocabulary or
  optimizer would otherwise train a half-restored model. A file that
  cannot be read raises CorruptCheckpointError (a ValueError) instead.
  """
  path = os.path.join(directory, basename)
  if not os.path.exists(path + '.pkl.gz'):
    return
  meta = _metadata(path + '.pkl.gz')
  saved = meta.get('flat_weights')
  if isinstance(saved, int):  # stored in their own file, at that compression
    saved = checkpoint_files.np_from_file(path + '.weights.npy.gz')
  expected, _ = tl.flatten_weights_and_state(model.weights, model.state)
  problem = _first_misfit(_shapes(saved), _shapes(expected), 'weight')
  if problem is None and isinstance(meta.get('slots_per_task'), int):
    for i, slots in enumerate(slots_per_task or ()):
      problem = _first_misfit(
        _shapes(checkpoint_files.np_from_file(f'{path}.opt_slots{i}.npy.gz')),
        _shapes(jax.tree_util.tree_leaves(slots)),
        'optimizer slot',
      )
      if problem:
        break
  if problem:
    raise CheckpointMismatchError(
      f'checkpoint {path}.pkl.gz (step {meta["step"]}) does not fit the '
      f'model: {problem}. It was written by a model of another size '
      '(d_model, d_ff, layers, heads or vocabulary) or with another '
      'optimizer; resume with the same settings, or train into a new '
      'output directory.'
    )


def _fsync_dir(path):
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


class ResumableLoop(training.Loop):
  """`training.Loop` whose checkpoints are atomic and resume a run exactly.

  Same constructor and behaviour as `training.Loop`; only when and how
  checkpoints are written and what they hold differ (see the module doc),
  and `run` ends with a checkpoint of its last step.
  It also stops at a NaN or infinite loss, and reports progress between
  evals to `progress_log` (None: nowhere).

  As one process of several (`jax.distributed`), it trains as one Loop
  holding every device of every process (`data_parallel`): every process
  reads the same batches and the same checkpoint, with the same random
  seed; only the chief (process 0) writes.
  """

  progress_log = print

  def __init__(self, *args, output_dir=None, **kwargs):
    if distributed.is_distributed():
      # Trax's n_devices counts this process's devices; a seed of None
      # would draw a different one per process.
      kwargs['n_devices'] = None
      kwargs['random_seed'] = distributed.same_seed(kwargs.get('random_seed'))
    if output_dir is not None:
      # Every process reads the checkpoint once the chief has completed it.
      distributed.chief_only(
        finish_interrupted_save, os.path.expanduser(output_dir)
      )
    self._pending_checkpoints = []
    self._saved_step = 0  # of the checkpoint 'model' on disk
    self._evals_done_at = None
    self._in_run = False
    self._progress = None
    super().__init__(*args, output_dir=output_dir, **kwargs)
    if distributed.is_distributed() and self._output_dir is not None:
      # The chief saves the data positions (all processes read the same
      # batches); Trax would read a file per process.
      trax_inputs.load_data_counters(self._output_dir, host_id=0)

  def _init_trainer(self, task):
    if not distributed.is_distributed():
      return super()._init_trainer(task)
    data_parallel.check_supported(self)
    return data_parallel.init_trainer(self, task)

  def _init_evaluator(self, eval_task):
    if not distributed.is_distributed():
      return super()._init_evaluator(eval_task)
    return data_parallel.init_evaluator(self._eval_model, eval_task)

  def _run_one_step(self, task_index, task_changed):
    loss, stats = super()._run_one_step(task_index, task_changed)
    if not np.all(np.isfinite(np.asarray(loss))):
      # Raised before this step's weights can be saved.
      where = (
        f'the last checkpoint in {self._output_dir} (step '
        f'{checkpoint_step(self._output_dir)}) is the last good one'
        if self._output_dir
        else 'nothing was saved'
      )
      raise NonFiniteLossError(
        f'the training loss is {np.mean(np.asarray(loss))} at step '
        f'{self.step}, so training stopped there; {where}. Lower the '
        'learning rate or check the data before resuming.'
      )
    if self._progress is not None:
      self._progress.update(loss=float(np.mean(np.asarray(loss))))
    return loss, stats

  def run(self, n_steps=1):
    self._in_run = True
    if self.progress_log is not None:
      self._progress = Progress(
        n_steps, 'training', self.progress_log, unit='step', every_seconds=120
      )
    try:
      super().run(n_steps)
    finally:
      self._in_run = False
      if self._progress is not None:
        self._progress.close()
        self._progress = None
    # Trax saves only at checkpoint steps: a run whose last step is none
    # (steps not a multiple of the checkpoint interval) would lose the
    # steps since the last one, and a rerun would train them again.
    if self._output_dir is not None and self._saved_step != self.step:
      self.save_checkpoint('model')

  def run_evals(self, summary_writers=None):
    super().run_evals(summary_writers)
    self._evals_done_at = self.step
    pending, self._pending_checkpoints = self._pending_checkpoints, []
    for basename in pending:
      self.save_checkpoint(basename)

  def save_checkpoint(self, basename):
    """Saves atomically; inside `run`, at an eval step, after the evals."""
    if (
      self._in_run
      and self._eval_at(self.step)
      and self._evals_done_at != self.step
    ):
      self._pending_checkpoints.append(basename)
      return
    if not self.is_chief:
      return  # Trax would still write this process's data counters
    if self._output_dir is None:
      super().save_checkpoint(basename)
      return
    output_dir = self._output_dir
    staging = os.path.join(output_dir, _STAGING.format(basename))
    try:
      shutil.rmtree(staging, ignore_errors=True)
      os.makedirs(staging)
      self._output_dir = staging  # Trax writes every file of it under here
      try:
        super().save_checkpoint(basename)
      finally:
        self._output_dir = output_dir
      np.save(
        os.path.join(staging, basename + RNG_SUFFIX), np.asarray(self._rng)
      )
      for filename in os.listdir(staging):
        with open(os.path.join(staging, filename), 'rb+') as f:
          os.fsync(f.fileno())
      _fsync_dir(staging)
      os.rename(staging, os.path.join(output_dir, _COMMITTED.format(basename)))
    except Exception as e:  # the commit (rename) did not happen
      cause = files.write_error(e)
      if cause is None:
        raise
      shutil.rmtree(staging, ignore_errors=True)
      raise CheckpointWriteError(
        f'could not write the checkpoint of step {self.step} to '
        f'{output_dir}: {cause}. The checkpoint there (step '
        f'{checkpoint_step(output_dir, basename)}) is untouched, and '
        'running the same command again resumes from it.'
      ) from e
    _fsync_dir(output_dir)
    finish_interrupted_save(output_dir)
    if basename == 'model':
      self._saved_step = self.step

  def load_checkpoint(self, directory=None, filename=None):
    directory = directory or self._output_dir
    if directory is None:  # nowhere to load from; Trax logs that
      super().load_checkpoint(directory, filename)
      return
    filename = filename or 'model'
    with checkpoint_files.reading_once():
      check_checkpoint_fits(
        self._model,
        directory,
        filename,
        [t.slots for t in self._trainer_per_task],
      )
      super().load_checkpoint(directory, filename)
    if directory == self._output_dir and filename == 'model':
      self._saved_step = self.step
    rng_file = os.path.join(directory, filename + RNG_SUFFIX)
    if os.path.exists(rng_file):
      self._rng = np.load(rng_file)
