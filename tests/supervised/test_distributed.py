"""Several processes on JAX's distributed runtime train exactly as one.

The runs are real: `python3 -m _trax_qkv_cli` processes on 127.0.0.1, one
CPU device each, joined by `jax.distributed` (gloo collectives), compared
with one process holding two CPU devices
(`--xla_force_host_platform_device_count=2`). Bad flags are refused in this
process, before JAX's runtime is started.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

from helpers import CONFIGS
from helpers import ROOT
from helpers import TWO_CPU_DEVICES
from helpers import command
from helpers import shared_data_dir
from helpers import tiny_train_bindings
from helpers import tiny_validate_flags
import numpy as np
import pytest
from trax import layers as tl

import _trax_qkv_cli
import _trax_qkv_launcher as launcher
from trax_qkv import checkpoint_files
from trax_qkv.supervised import checkpointing

train_script = command('train')
validate_script = command('validate')

# The fault tests' --heartbeat_timeout: the survivor must stop within it
# (plus the watchdog's polling and its start-up).
HEARTBEAT = 10


def _cli(*argv):
  return [sys.executable, '-m', '_trax_qkv_cli', *argv]


def _train_argv(tmp_path, output_dir, steps, eval_frequency):
  argv = ['train', '--config_file', os.path.join(CONFIGS, 'reference.gin')]
  for binding in tiny_train_bindings(
    shared_data_dir(tmp_path), steps=steps, eval_frequency=eval_frequency
  ):
    argv += ['--config', binding]
  return argv + ['--output_dir', str(output_dir)]


def _validate_argv(tmp_path, output_dir):
  return ['validate'] + tiny_validate_flags(
    shared_data_dir(tmp_path),
    output_dir,
    30,
    10,
    '--beam_sentences',
    '2',
    '--heatmap_sentences',
    '1',
  )


def _processes(argv, n, port, log_dir, ids=None):
  """Starts processes `ids` (default 0..n-1) of one run of `argv`; returns
  them."""
  return [
    subprocess.Popen(
      _cli(
        *argv,
        '--coordinator_address',
        f'127.0.0.1:{port}',
        '--num_processes',
        str(n),
        '--process_id',
        str(i),
        '--heartbeat_timeout',
        str(HEARTBEAT),
      ),
      cwd=ROOT,
      env=launcher.child_environment(),
      stdout=subprocess.DEVNULL,
      stderr=open(log_dir / f'process{i}.log', 'w'),
    )
    for i in (range(n) if ids is None else ids)
  ]


def _two_devices(argv):
  env = dict(os.environ, XLA_FLAGS=TWO_CPU_DEVICES)
  subprocess.run(
    _cli(*argv), cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL
  )


def _checkpoint(output_dir):
  """(metadata, weights, optimizer slots) of output_dir's checkpoint."""
  path = os.path.join(output_dir, 'model')
  meta = checkpoint_files.unpickle_from_file(path + '.pkl.gz', gzip=True)
  weights = tl.np_from_file(
    path + '.weights.npy.gz', compresslevel=meta['flat_weights']
  )
  slots = tl.np_from_file(
    path + '.opt_slots0.npy.gz', compresslevel=meta['slots_per_task']
  )
  return meta, weights, slots


def _assert_same_checkpoint(dir_a, dir_b):
  """Same step, weights, optimizer slots, per-step losses and eval
  metrics, bit for bit (timings aside)."""
  meta_a, weights_a, slots_a = _checkpoint(dir_a)
  meta_b, weights_b, slots_b = _checkpoint(dir_b)
  assert meta_a['step'] == meta_b['step']
  assert len(weights_a) == len(weights_b) and len(slots_a) == len(slots_b)
  for a, b in zip(weights_a + slots_a, weights_b + slots_b):
    assert np.array_equal(a, b), np.abs(a - b).max()
  for mode in ('train', 'eval'):
    values_a = meta_a['history']['_values'][mode]
    values_b = meta_b['history']['_values'][mode]
    compared = [m for m in values_a if 'per second' not in m]
    compared = [m for m in compared if not m.endswith('_seconds')]
    assert compared
    for metric in compared:
      assert [float(v) for _, v in values_a[metric]] == [
        float(v) for _, v in values_b[metric]
      ], (mode, metric)


# ------------------------------------------------------------ exactly as one


def _slurm_job_with_a_free_port():
  """A SLURM_JOB_ID whose coordinator port (JAX's SLURM rule: the job id
  modulo 4096, from 61440 on) is free here."""
  for job in range(1000, 5096):
    with socket.socket() as s:
      try:
        s.bind(('127.0.0.1', job % 4096 + 61440))
      except OSError:
        continue
      return job
  pytest.skip('no free port in 61440-65535 for an emulated SLURM job')


def _start_as_slurm_job(argv, log_dir):
  """Starts `argv --distributed auto` as two tasks of an emulated SLURM job
  on one node, with the environment srun gives them, which JAX's SLURM
  detection reads (the real srun is not here); returns the processes."""
  job = _slurm_job_with_a_free_port()
  return [
    subprocess.Popen(
      _cli(
        *argv, '--distributed', 'auto', '--heartbeat_timeout', str(HEARTBEAT)
      ),
      cwd=ROOT,
      env=dict(
        launcher.child_environment(),
        SLURM_JOB_ID=str(job),
        SLURM_STEP_NODELIST='127.0.0.1',
        SLURM_NTASKS='2',
        SLURM_PROCID=str(i),
        SLURM_LOCALID=str(i),
      ),
      stdout=subprocess.DEVNULL,
      stderr=open(log_dir / f'process{i}.log', 'w'),
    )
    for i in range(2)
  ]


def _kill_process_1(chief, other, run_dir, logs, min_step):
  """Once `run_dir` holds a checkpoint of step >= min_step, SIGKILLs
  `other`; the chief must stop on the missed heartbeat (its one error
  line says so), not hang, keeping its last complete checkpoint, whose
  step it returns."""
  deadline = time.time() + 600
  while checkpointing.checkpoint_step(str(run_dir)) < min_step:
    assert chief.poll() is None and other.poll() is None, (
      logs / 'process0.log'
    ).read_text()
    assert time.time() < deadline
    time.sleep(0.05)
  other.send_signal(signal.SIGKILL)
  assert other.wait() == -signal.SIGKILL
  assert chief.wait(timeout=HEARTBEAT + 60) == 1
  errors = [
    line
    for line in (logs / 'process0.log').read_text().splitlines()
    if line.startswith('error')
  ]
  assert len(errors) == 1, errors
  assert 'process 1 of 2' in errors[0]
  assert f'sent no heartbeat for {HEARTBEAT} s' in errors[0]
  assert 'start the same 2 processes again to resume' in errors[0]
  checkpointing.check_checkpoint_files(str(run_dir))
  return checkpointing.checkpoint_step(str(run_dir))


@pytest.mark.slow
@pytest.mark.stack
def test_two_processes_killed_and_rerun_validate_as_one_with_two_devices(
  tmp_path,
):
  """Two processes train, decode and score as one process with two
  devices does, and a run of two that loses a process resumes exactly.

  The killed run is a SLURM job's two tasks, joined by --distributed auto;
  when process 1 is SIGKILLed during the first model's training, the chief
  stops on the missed heartbeat. The rerun is the same two processes,
  started by --local_processes 2: it resumes the first model, trains the
  second from its start, decodes and scores. Every step of both models
  ran on two processes, so ending as the uninterrupted one-process run
  ends shows both that two processes train as two devices and that the
  resume is exact."""
  steps = 30
  two_devices, two_processes = tmp_path / 'devices', tmp_path / 'processes'
  _two_devices(_validate_argv(tmp_path, two_devices))

  argv = _validate_argv(tmp_path, two_processes)
  logs = tmp_path / 'killed'
  logs.mkdir()
  chief, other = _start_as_slurm_job(argv, logs)
  kept = _kill_process_1(chief, other, two_processes / 'trax', logs, 10)
  assert 10 <= kept < steps

  assert (
    _trax_qkv_cli.run('validate', argv[1:] + ['--local_processes', '2']) == 0
  )
  # Every step's loss, the eval metrics, the final weights and optimizer
  # slots of both models: bit for bit.
  for name in ('trax', 'reference'):
    _assert_same_checkpoint(two_processes / name, two_devices / name)
  summaries = [
    json.loads((run / 'summary.json').read_text())
    for run in (two_processes, two_devices)
  ]
  scores = ('final_loss', 'eval_loss', 'eval_accuracy', 'bleu', 'chrf')
  scores += ('eval_loss_curve',)  # the killed run's evals carried over
  for name in ('trax', 'reference'):
    for key in (*scores, 'exact_match'):
      assert summaries[0][name][key] == summaries[1][name][key], (name, key)
  for decodes in ('decodes_reference.txt', 'decodes_beam_trax.txt'):
    assert (two_processes / decodes).read_text() == (
      two_devices / decodes
    ).read_text()
  # The built-in and the plugin stay bit-identical across processes.
  assert summaries[0]['max_loss_diff'] == 0.0
  _assert_same_checkpoint(two_processes / 'trax', two_processes / 'reference')
  # The resumed model counts every step once, its training time too.
  history = _checkpoint(two_processes / 'trax')[0]['history']['_values']
  for metric in ('metrics/step_loss', 'metrics/step_seconds'):
    assert [s for s, _ in history['train'][metric]] == list(range(1, steps + 1))
  assert summaries[0]['trax']['train_seconds'] == pytest.approx(
    sum(seconds for _, seconds in history['train']['metrics/step_seconds'])
  )
  # One run of two processes: one chief wrote, one set of data positions.
  counters = {p.name for p in two_processes.glob('**/data_counters*')}
  assert counters == {'data_counters0.pkl'}


# ------------------------------------------------------- faults at start-up


@pytest.mark.slow
def test_a_process_with_other_settings_stops_the_run_before_writing(
  tmp_path,
):
  out = tmp_path / 'out'
  argv = _train_argv(tmp_path, out, steps=20, eval_frequency=10)
  port = launcher.free_port()
  (chief,) = _processes(argv, 2, port, tmp_path, ids=[0])
  (other,) = _processes(
    _train_argv(tmp_path, out, steps=30, eval_frequency=10),
    2,
    port,
    tmp_path,
    ids=[1],
  )
  assert chief.wait(timeout=300) == 2 and other.wait(timeout=300) == 2
  for i in (0, 1):
    log = (tmp_path / f'process{i}.log').read_text()
    assert (
      f'error (process {i}): process 1 was started with other settings '
      'than process 0' in log
    )
    assert 'train.steps = 20' in log and 'train.steps = 30' in log
  assert not out.exists()


def _main_fails(script, argv, capsys):
  assert script.main(argv) == 2
  return capsys.readouterr().err


@pytest.mark.parametrize(
  'flags, message',
  [
    (
      ['--coordinator_address', '127.0.0.1:1', '--num_processes', '2'],
      'needs --coordinator_address HOST:PORT, --num_processes N and '
      '--process_id I; got only',
    ),
    (
      ['--coordinator_address', '127.0.0.1:1234', '--num_processes', '2']
      + ['--process_id', '2'],
      '--process_id must be 0 to 1 (--num_processes 2); got 2',
    ),
    (
      ['--coordinator_address', 'nohost', '--num_processes', '2']
      + ['--process_id', '0'],
      '--coordinator_address must be HOST:PORT',
    ),
    (
      ['--distributed', 'auto', '--num_processes', '2'],
      '--distributed auto finds the cluster itself; drop --num_processes',
    ),
    (['--heartbeat_timeout', '0', '--distributed', 'auto'], 'heartbeat'),
  ],
)
@pytest.mark.parametrize('script', [train_script, validate_script])
def test_bad_process_flags_are_refused_before_anything(
  tmp_path, capsys, script, flags, message
):
  out = tmp_path / 'out'
  argv = ['--output_dir', str(out)] + flags
  if script is train_script:
    argv += ['--config_file', os.path.join(CONFIGS, 'reference.gin')]
  assert message in _main_fails(script, argv, capsys)
  assert not out.exists()


def test_unreachable_coordinator_is_one_line(tmp_path, capsys):
  out = tmp_path / 'out'
  start = time.time()
  error = _main_fails(
    validate_script,
    ['--output_dir', str(out), '--coordinator_address']
    + [f'127.0.0.1:{launcher.free_port()}', '--num_processes', '2']
    + ['--process_id', '1', '--initialization_timeout', '2'],
    capsys,
  )
  # The flag's 2 s: not the default 300 s, nor 2 read as minutes (120 s),
  # however slow the machine.
  assert time.time() - start < 60
  assert error.count('\n') == 1
  assert 'did not answer within 2 s' in error
  assert not out.exists()


def test_coordinator_port_in_use_is_one_line(tmp_path, capsys):
  out = tmp_path / 'out'
  with socket.socket() as busy:
    busy.bind(('', 0))
    busy.listen()
    port = busy.getsockname()[1]
    error = _main_fails(
      validate_script,
      ['--output_dir', str(out), '--coordinator_address']
      + [f'127.0.0.1:{port}', '--num_processes', '2', '--process_id', '0'],
      capsys,
    )
  assert f'process 0 cannot listen on port {port}' in error
  assert not out.exists()
