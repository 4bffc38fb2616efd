"""Resuming from a checkpoint: Trax's reader against trax_qkv's.

A real checkpoint of the main job's Multi30k-sized Transformer (vocabulary
8192, d_model 256, d_ff 1024, 3+3 layers, Adam) is written by one training
step, then loaded again and again, interleaved (`timing.interleaved_times`)
(`quick`: the bench's toy Transformer instead, a smoke test):

  - 'trax': `training.Loop.load_checkpoint` as Trax 1.4.1 reads it (its
    pickle.load and np_from_file, `patches.trax_checkpoint_reading`);
  - 'trax_qkv': `ResumableLoop.load_checkpoint`: the restricted unpickler,
    the complete-file check of every weight and slot file, and the shape
    check of weights and optimizer slots against the model;
  - 'trax_qkv_resume': what a resumed trax-qkv-train or trax-qkv-validate
    reads in all: `checkpointing.check_checkpoint_files` (every file read
    once before the run writes anything) and then the load.
"""

import os
import tempfile

import jax
import numpy as np
import trax
from trax import layers as tl
from trax.supervised import training

from trax_qkv import patches
from trax_qkv.benchmarks import models
from trax_qkv.benchmarks import timing
from trax_qkv.supervised import checkpointing

DEFAULT_ROUNDS = 7
# The checkpointed model: (its name in the table, its builder).
MODEL = ('the Multi30k-sized model', models.translation_model)
QUICK_MODEL = ('the toy Transformer', models.toy_transformer)


def _loop(loop_class, output_dir, builder):
  vocab = models.vocab_size(builder)
  model = models.build(builder, models.BUILTIN, 'train')

  def batches():
    rng = np.random.RandomState(0)
    while True:
      source = rng.randint(1, vocab, (8, 32)).astype(np.int32)
      target = rng.randint(1, vocab, (8, 32)).astype(np.int32)
      yield source, target, np.ones((8, 32), np.float32)

  task = training.TrainTask(
    batches(), tl.WeightedCategoryCrossEntropy(), trax.optimizers.Adam(0.001)
  )
  return loop_class(
    model,
    [task],
    output_dir=output_dir,
    random_seed=0,
    checkpoint_at=lambda step: True,
  )


def run(rounds=DEFAULT_ROUNDS, quick=False, log=print):
  """Times both readers on one checkpoint; returns the results dict."""
  model_name, builder = QUICK_MODEL if quick else MODEL
  with tempfile.TemporaryDirectory() as output_dir:
    log(f'writing a checkpoint of {model_name} ...')
    writer = _loop(checkpointing.ResumableLoop, output_dir, builder)
    writer.progress_log = None
    writer.run(1)
    size = sum(
      os.path.getsize(os.path.join(output_dir, f))
      for f in os.listdir(output_dir)
      if f.startswith('model.')
    )
    trax_loop = _loop(training.Loop, output_dir, builder)
    ours = _loop(checkpointing.ResumableLoop, output_dir, builder)

    def trax_load():
      with patches.trax_checkpoint_reading():
        training.Loop.load_checkpoint(trax_loop)

    log(f'loading it ({size / 2**20:.0f} MB), {rounds} rounds ...')

    def resume():
      checkpointing.check_checkpoint_files(output_dir)
      ours.load_checkpoint()

    times = timing.interleaved_times(
      {
        'trax': trax_load,
        'trax_qkv': ours.load_checkpoint,
        'trax_qkv_resume': resume,
      },
      rounds,
      settle=timing.settle_seconds(),
    )
  results = {
    'device': jax.devices()[0].device_kind,
    'rounds': rounds,
    'model': model_name,
    'checkpoint_mb': size / 2**20,
    'times_s': times,
  }
  for name in ('trax_qkv', 'trax_qkv_resume'):
    ratios = [t / b for t, b in zip(times[name], times['trax'])]
    results[f'{name}_ratio_median'] = float(np.median(ratios))
    results[f'{name}_ratio_quartiles'] = [
      float(q) for q in np.percentile(ratios, (25, 75))
    ]
  return results


def markdown(results):
  times = results['times_s']
  rows = [
    ('Trax 1.4.1 (`Loop.load_checkpoint`)', 'trax'),
    ('trax_qkv (`ResumableLoop.load_checkpoint`)', 'trax_qkv'),
    (
      'trax_qkv, a resume in all (files checked, then loaded)',
      'trax_qkv_resume',
    ),
  ]
  lines = [
    f'Checkpoint of {results["model"]} ({results["checkpoint_mb"]:.1f}'
    f' MB on disk), {results["rounds"]} interleaved rounds on '
    f'{results["device"]}.',
    '',
    '| reader | seconds (median) | / Trax |',
    '|---|---|---|',
  ]
  for label, name in rows:
    ratio = ''
    if name != 'trax':
      low, high = results[f'{name}_ratio_quartiles']
      ratio = (
        f'**{results[f"{name}_ratio_median"]:.2f}×** [{low:.2f}–{high:.2f}]'
      )
    lines.append(f'| {label} | {np.median(times[name]):.3f} | {ratio} |')
  return '\n'.join(lines) + '\n'


def write(results, output_dir):
  timing.write_results(
    results, output_dir, 'bench_checkpoints', markdown(results)
  )
