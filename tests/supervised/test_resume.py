"""Kill -9 and restart: runs resume exactly; checkpoints are never half-written.

The killed run is a real subprocess of `python3 -m _trax_qkv_cli train`,
SIGKILLed once a mid-run checkpoint exists; the restart is the same
command (in this process, to save an import of TensorFlow). The validate
command's kill and resume is test_distributed's: a two-process run that
loses a process and ends as the uninterrupted run.
"""

import errno
import itertools
import os
import signal
import subprocess
import sys
import time

from helpers import CONFIGS
from helpers import ROOT
from helpers import TWO_CPU_DEVICES
from helpers import command
from helpers import shared_data_dir
from helpers import tiny_train_bindings
import jax
import numpy as np
import pytest
import trax
from trax import layers as tl
from trax.supervised import training as trax_training

from trax_qkv.supervised import checkpointing
from trax_qkv.supervised import training

# 1 vs 2 devices after 30 steps (measured: losses 8e-8 relative, weights
# 2.3e-7 absolute): float reassociation only, the loss is the same mean.
DATA_PARALLEL_LOSS_RTOL = 1e-6
DATA_PARALLEL_WEIGHTS_ATOL = 1e-5

train_script = command('train')


def _kill_at_checkpoint(argv, output_dir, min_step, log_path):
  """Runs `argv` in a subprocess; SIGKILLs it once `output_dir` holds a
  checkpoint of step >= min_step. Returns that step."""
  with open(log_path, 'w') as log:
    process = subprocess.Popen(
      [sys.executable] + argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
    )
    deadline = time.time() + 600
    while time.time() < deadline:
      if process.poll() is not None:
        pytest.fail(
          f'{argv[2]} ended (rc {process.returncode}) before it '
          f'could be killed; log in {log_path}'
        )
      try:
        step = checkpointing.checkpoint_step(output_dir)
      except (OSError, EOFError):  # being written
        step = 0
      if step >= min_step:
        process.send_signal(signal.SIGKILL)
        assert process.wait() == -signal.SIGKILL
        return step
      time.sleep(0.05)
    process.kill()
    pytest.fail(f'no checkpoint of step {min_step} in 600 s; log {log_path}')


def _checkpoint(output_dir):
  path = os.path.join(output_dir, 'model')
  meta = trax_training.unpickle_from_file(path + '.pkl.gz', gzip=True)
  weights = tl.np_from_file(
    path + '.weights.npy.gz', compresslevel=meta['flat_weights']
  )
  slots = tl.np_from_file(
    path + '.opt_slots0.npy.gz', compresslevel=meta['slots_per_task']
  )
  return meta, weights, slots


def _assert_same_run(dir_a, dir_b):
  meta_a, weights_a, slots_a = _checkpoint(dir_a)
  meta_b, weights_b, slots_b = _checkpoint(dir_b)
  assert meta_a['step'] == meta_b['step']
  for a, b in zip(weights_a + slots_a, weights_b + slots_b, strict=True):
    assert np.array_equal(a, b)
  history_a, history_b = meta_a['history'], meta_b['history']
  for mode in ('train', 'eval'):
    for metric, values in history_a['_values'][mode].items():
      if (
        'per second' in metric
        or 'timing' in metric
        or metric.endswith('_seconds')
      ):
        continue
      assert values == history_b['_values'][mode][metric], (mode, metric)


@pytest.mark.slow
@pytest.mark.stack
def test_train_script_killed_and_rerun_equals_uninterrupted(tmp_path):
  tfds_dir = shared_data_dir(tmp_path)
  bindings = tiny_train_bindings(tfds_dir, steps=60, eval_frequency=10)

  def argv(output_dir):
    return [
      '-m',
      '_trax_qkv_cli',
      'train',
      '--config_file',
      os.path.join(CONFIGS, 'reference.gin'),
      '--output_dir',
      str(output_dir),
    ] + sum((['--config', b] for b in bindings), [])

  uninterrupted, resumed = tmp_path / 'uninterrupted', tmp_path / 'resumed'
  # The first run also prepares the data.
  assert train_script.main(argv(uninterrupted)[3:]) == 0
  killed_at = _kill_at_checkpoint(
    argv(resumed), str(resumed), 20, tmp_path / 'killed.log'
  )
  assert 20 <= killed_at < 60
  assert train_script.main(argv(resumed)[3:]) == 0
  _assert_same_run(str(uninterrupted), str(resumed))


# ------------------------------------------------- atomic checkpoint writes


def _tiny_loop(output_dir, nan_at_step=None):
  """A ResumableLoop on a 1-layer model that checkpoints every step; with
  `nan_at_step`, that step's batch holds a NaN."""

  def batches():
    rng = np.random.RandomState(0)
    for step in itertools.count():  # batch 0 is TrainTask's shape sample
      x = rng.randn(4, 3).astype(np.float32)
      if step == nan_at_step:
        x[0, 0] = np.nan
      yield x, x.sum(axis=1, keepdims=True), np.ones((4, 1), np.float32)

  task = trax_training.TrainTask(
    batches(), tl.L2Loss(), trax.optimizers.Adam(0.01)
  )
  return checkpointing.ResumableLoop(
    tl.Serial(tl.Dense(1)),
    [task],
    random_seed=0,
    output_dir=str(output_dir),
    checkpoint_at=lambda step: True,
    eval_at=lambda step: False,
  )


def _weights(loop):
  return [np.asarray(w) for w in jax.tree_util.tree_leaves(loop.model.weights)]


_KILLED_WHILE_WRITING = """
import os, sys, time
sys.path[:0] = [os.path.join(os.getcwd(), 'tests'),
                os.path.join(os.getcwd(), 'tests', 'supervised')]
from trax.supervised import training as trax_training
import test_resume
out, marker = sys.argv[1:]
loop = test_resume._tiny_loop(out)
loop.run(2)
def slow_write(*args, **kwargs):  # weights and slots are written by now
  open(marker, 'w').close()
  time.sleep(600)
trax_training.pickle_to_file = slow_write
loop.run(1)
"""


def test_sigkill_while_writing_keeps_the_previous_checkpoint(tmp_path):
  """A real SIGKILL inside the write of step 3's checkpoint (after its
  weights and slots, before its metadata): no cleanup runs. The restart
  finds step 2's checkpoint whole, as a run stopped there has it, and
  clears the staging. (That the run then trains on exactly, data
  included, is the killed-command tests' above.)"""
  out, marker = tmp_path / 'out', tmp_path / 'writing'
  process = subprocess.Popen(
    [sys.executable, '-c', _KILLED_WHILE_WRITING, str(out), str(marker)],
    cwd=ROOT,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  deadline = time.time() + 300
  while not marker.exists():
    assert process.poll() is None and time.time() < deadline
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  assert process.wait() == -signal.SIGKILL
  assert '.model.staging' in os.listdir(out)  # the write, cut short
  assert checkpointing.checkpoint_step(str(out)) == 2
  restarted = _tiny_loop(out)
  assert restarted.step == 2
  assert not [n for n in os.listdir(out) if n.startswith('.')]  # cleared
  straight = _tiny_loop(tmp_path / 'straight')
  straight.run(2)
  for a, b in zip(_weights(straight), _weights(restarted), strict=True):
    assert np.array_equal(a, b)
  assert np.array_equal(np.asarray(straight._rng), np.asarray(restarted._rng))
  restarted.run(1)  # and writes step 3 over the remains
  assert checkpointing.checkpoint_step(str(out)) == 3
  assert not [n for n in os.listdir(out) if n.startswith('.')]


def test_kill_after_commit_is_completed_on_restart(tmp_path, monkeypatch):
  loop = _tiny_loop(tmp_path)
  loop.run(2)
  # Dies right after the commit rename, before any file is moved into place.
  monkeypatch.setattr(
    checkpointing, 'finish_interrupted_save', lambda output_dir: None
  )
  loop.run(1)
  monkeypatch.undo()
  assert os.path.isdir(tmp_path / '.model.committed')
  assert checkpointing.checkpoint_step(str(tmp_path)) == 2
  restarted = _tiny_loop(tmp_path)
  assert restarted.step == 3
  for a, b in zip(_weights(loop), _weights(restarted), strict=True):
    assert np.array_equal(a, b)
  assert np.array_equal(np.asarray(loop._rng), np.asarray(restarted._rng))


def test_nan_loss_stops_at_its_step_and_keeps_the_last_good_checkpoint(
  tmp_path,
):
  loop = _tiny_loop(tmp_path, nan_at_step=4)
  with pytest.raises(
    checkpointing.NonFiniteLossError,
    match=r'the training loss is nan at step 4, so training '
    r'stopped there; the last checkpoint in .* \(step 3\) '
    r'is the last good one',
  ):
    loop.run(10)
  assert checkpointing.checkpoint_step(str(tmp_path)) == 3
  restarted = _tiny_loop(tmp_path)
  assert restarted.step == 3
  assert all(np.all(np.isfinite(w)) for w in _weights(restarted))


def _next_step_program(loop):
  """Runs one step of `loop`; the text of the program it ran."""
  trainer = loop._trainer_per_task[0]
  update = trainer._accelerated_update_fn
  programs = []

  def recorded(*args):
    programs.append(update.lower(*args).as_text())
    return update(*args)

  trainer._accelerated_update_fn = recorded
  try:
    loop.run(1)
  finally:
    trainer._accelerated_update_fn = update
  return programs[0]


def test_a_resumed_run_trains_with_the_program_it_compiled(tmp_path):
  """Restored optimizer slots are placed as a fresh run's are, so a
  resumed run's training step is the same program, read from the
  compilation cache instead of compiled again (trax_qkv.patches, patch
  3)."""
  first = _next_step_program(_tiny_loop(tmp_path))
  restarted = _tiny_loop(tmp_path)
  assert restarted.step == 1
  assert _next_step_program(restarted) == first


def test_training_reports_progress_between_evals(tmp_path):
  loop = _tiny_loop(tmp_path)
  lines = []
  loop.progress_log = lines.append
  loop.run(10)
  assert len(lines) == 10  # a line per tenth of the steps
  assert lines[-1].startswith('training: 10/10 (') and ', loss ' in lines[-1]


def _no_space(kind):
  if kind == 'tensorflow':  # what Trax's writer (tf.io.gfile) raises
    import tensorflow as tf

    return tf.errors.ResourceExhaustedError(
      None, None, 'model.weights.npy.gz._tmp_; No space left on device'
    )
  return OSError(errno.ENOSPC, 'No space left on device')


@pytest.mark.parametrize('kind', ['python', 'tensorflow'])
def test_disk_full_while_writing_keeps_the_previous_checkpoint(
  tmp_path, monkeypatch, kind
):
  loop = _tiny_loop(tmp_path)
  loop.run(2)
  at_step_2 = _weights(loop)

  def disk_full(*args, **kwargs):
    raise _no_space(kind)

  monkeypatch.setattr(trax_training, 'pickle_to_file', disk_full)
  with pytest.raises(
    checkpointing.CheckpointWriteError,
    match=r'could not write the checkpoint of step 3 to .*'
    r'No space left on device.*The checkpoint there \(step '
    r'2\) is untouched',
  ):
    loop.run(1)
  monkeypatch.undo()
  assert not [n for n in os.listdir(tmp_path) if n.startswith('.')]
  restarted = _tiny_loop(tmp_path)
  assert restarted.step == 2
  for a, b in zip(at_step_2, _weights(restarted), strict=True):
    assert np.array_equal(a, b)


def test_checkpoint_of_another_model_is_refused(tmp_path):
  _tiny_loop(tmp_path).run(1)
  wider = tl.Serial(tl.Dense(2))
  wider.init(trax.shapes.ShapeDtype((4, 3)))
  with pytest.raises(
    checkpointing.CheckpointMismatchError,
    match=r'weight #0 has shape \(3, 1\), the model '
    r'expects \(3, 2\)',
  ):
    checkpointing.check_checkpoint_fits(wider, str(tmp_path))


# ------------------------------------------------------ data parallelism

_TWO_DEVICE_RUN = """
import sys
from trax_qkv.supervised import training
config, out, bindings = sys.argv[1], sys.argv[2], sys.argv[3:]
loop = training.train_from_configs([config], bindings, out)
assert loop.n_devices == 2, loop.n_devices
"""


@pytest.mark.slow
@pytest.mark.stack
def test_two_device_data_parallel_matches_one_device(tmp_path):
  """Without dropout (each device draws its own masks). That the built-in
  and the plugin train bit-identically on two devices, dropout on, is
  tests/supervised/test_distributed.py's check."""
  bindings = tiny_train_bindings(
    shared_data_dir(tmp_path), steps=30, eval_frequency=30
  ) + ['Transformer.dropout = 0.0']
  config = os.path.join(CONFIGS, 'reference.gin')
  one_device, two_devices = tmp_path / 'one_device', tmp_path / 'two_devices'
  training.train_from_configs([config], bindings, str(one_device))
  env = dict(os.environ, XLA_FLAGS=TWO_CPU_DEVICES)
  subprocess.run(
    [sys.executable, '-c', _TWO_DEVICE_RUN, config, str(two_devices)]
    + bindings,
    cwd=ROOT,
    env=env,
    check=True,
    stdout=subprocess.DEVNULL,
  )
  # Same math on two half-batches: equal up to float reassociation.
  meta_1, weights_1, _ = _checkpoint(str(one_device))
  meta_2, weights_2, _ = _checkpoint(str(two_devices))
  loss = 'metrics/WeightedCategoryCrossEntropy'
  loss_1 = [v for _, v in meta_1['history']['_values']['train'][loss]]
  loss_2 = [v for _, v in meta_2['history']['_values']['train'][loss]]
  np.testing.assert_allclose(loss_2, loss_1, rtol=DATA_PARALLEL_LOSS_RTOL)
  for a, b in zip(weights_1, weights_2, strict=True):
    np.testing.assert_allclose(b, a, rtol=0, atol=DATA_PARALLEL_WEIGHTS_ATOL)
