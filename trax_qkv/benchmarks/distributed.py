"""What training across processes costs (`trax-qkv-bench --only distributed`).

Measured: the Multi30k-sized Transformer (`models.translation_model`,
batch 128 x 32 -> 32) trained with trax_qkv's `ResumableLoop` -- Trax's
optimizer step, gradients averaged over every device -- in two layouts of
the same two CPU cores:

  - 'one process': one process holding two CPU devices
    (`--xla_force_host_platform_device_count=2`), Trax's own pmapped step;
  - 'two processes': two processes of one device each, each pinned to one
    core, joined by `jax.distributed` (gloo all-reduce over 127.0.0.1),
    trax_qkv's `data_parallel` step.

Each round starts each layout afresh (a process per measurement, so the
layouts alternate) and times `steps` steps after warm-up; the ratio of
each round is two processes over one process.

Computed: gradient bytes per step of the README's models and the time a
ring all-reduce of them takes at stated bandwidths (`scaling_table`).
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import trax
from trax import layers as tl
from trax import shapes
from trax.supervised import training

import _trax_qkv_launcher as launcher
from trax_qkv.benchmarks import models
from trax_qkv.benchmarks import timing
from trax_qkv.supervised import checkpointing
from trax_qkv.supervised import distributed

DEFAULT_ROUNDS = 3
STEPS = 20
WARMUP_STEPS = 3
BATCH = (128, 32, 32)
# Link speeds of the table, bytes/s: 10 and 100 Gbit/s Ethernet, and a
# GPU interconnect's order of magnitude.
BANDWIDTHS = {
  '10 Gbit/s': 10e9 / 8,
  '100 Gbit/s': 100e9 / 8,
  '1.6 Tbit/s': 1.6e12 / 8,
}


def _worker_argv(steps, output):
  return [
    sys.executable,
    '-m',
    'trax_qkv.benchmarks.distributed',
    '--steps',
    str(steps),
    '--output',
    output,
  ]


def measure(layout, steps, scratch):
  """Seconds per training step of `layout` ('one process' or 'two
  processes'), measured in fresh processes."""
  output = os.path.join(scratch, f'{layout.replace(" ", "_")}.json')
  if layout == 'one process':
    commands = [_worker_argv(steps, output)]
    env = launcher.child_environment(devices=2)
  else:
    port = launcher.free_port()
    commands = [
      _worker_argv(steps, output)
      + ['--coordinator_address', f'127.0.0.1:{port}']
      + ['--num_processes', '2', '--process_id', str(i), '--core', str(i)]
      for i in range(2)
    ]
    env = launcher.child_environment(devices=1)
  logs = [f'{output[:-5]}_{i}.log' for i in range(len(commands))]
  processes = [
    subprocess.Popen(
      c, env=env, stdout=subprocess.DEVNULL, stderr=open(log, 'w')
    )
    for c, log in zip(commands, logs)
  ]
  if any(p.wait() for p in processes):
    raise RuntimeError(
      f'the {layout} measurement failed; its output: {", ".join(logs)}'
    )
  with open(output) as f:
    return json.load(f)['seconds_per_step']


def run(rounds=DEFAULT_ROUNDS, steps=STEPS, scratch='runs/bench', log=print):
  """{'layouts': {layout: [seconds per step per round]}, 'ratios': [...],
  'scaling': scaling_table()}."""
  os.makedirs(scratch, exist_ok=True)
  layouts = ('one process', 'two processes')
  times = {layout: [] for layout in layouts}
  for r in range(rounds):
    for layout in layouts if r % 2 == 0 else layouts[::-1]:
      times[layout].append(measure(layout, steps, scratch))
      log(f'round {r + 1}/{rounds}: {layout} {times[layout][-1]:.3f} s/step')
  ratios = [b / a for a, b in zip(times['one process'], times['two processes'])]
  return dict(
    model='Transformer 128x32 -> 32 (translation), built-in attention',
    steps=steps,
    layouts=times,
    ratios=ratios,
    scaling=scaling_table(),
  )


def gradient_bytes(model):
  """Bytes of one float32 gradient of `model`'s weights."""
  return 4 * sum(int(np.size(w)) for w in jax.tree_util.tree_leaves(model))


def scaling_table():
  """Per README model: parameters, gradient MB, and the seconds of a ring
  all-reduce over N hosts (2 (N-1)/N of the bytes through each link) at
  each of BANDWIDTHS, for N = 2, 8, 64."""
  rows = []
  for name, (vocab, d_model, d_ff, n_layers, max_len) in {
    'numbers (README main job)': (512, 128, 256, 2, 64),
    'Multi30k (README recipe)': (8192, 256, 1024, 3, 128),
  }.items():
    model = models.transformer(
      vocab, d_model, d_ff, n_layers, max_len, 'train', n_heads=4
    )
    tokens = np.zeros((2, 8), np.int32)
    weights, _ = model.init(shapes.signature((tokens, tokens)))
    size = gradient_bytes(weights)
    rows.append(
      dict(
        model=name,
        parameters=size // 4,
        gradient_mb=size / 1e6,
        allreduce_seconds={
          link: {str(n): 2 * (n - 1) / n * size / speed for n in (2, 8, 64)}
          for link, speed in BANDWIDTHS.items()
        },
      )
    )
  return rows


def markdown(results):
  one, two = (
    np.asarray(results['layouts'][k]) for k in ('one process', 'two processes')
  )
  ratios = np.asarray(results['ratios'])
  lines = [
    f'Training step of the {results["model"]}, 2 CPU cores, '
    f'{len(ratios)} rounds (median, min-max):',
    '',
    '| layout | s/step | ratio to one process |',
    '|---|---|---|',
    f'| one process, 2 devices | {np.median(one):.3f} '
    f'({one.min():.3f}-{one.max():.3f}) | 1 |',
    f'| two processes x 1 device (gloo) | {np.median(two):.3f} '
    f'({two.min():.3f}-{two.max():.3f}) | {np.median(ratios):.2f} '
    f'({ratios.min():.2f}-{ratios.max():.2f}) |',
    '',
    'Ring all-reduce of one float32 gradient over N hosts, milliseconds '
    '(2 (N-1)/N of it through each link; no overlap with compute):',
    '',
    '| model | parameters | gradient MB | link | N=2 | N=8 | N=64 |',
    '|---|---|---|---|---|---|---|',
  ]
  for row in results['scaling']:
    for link, by_n in row['allreduce_seconds'].items():
      lines.append(
        f'| {row["model"]} | {row["parameters"]:,} | '
        f'{row["gradient_mb"]:.1f} | {link} | '
        + ' | '.join(f'{1e3 * by_n[n]:.3g}' for n in ('2', '8', '64'))
        + ' |'
      )
  return '\n'.join(lines) + '\n'


def write(results, output_dir):
  timing.write_results(
    results, output_dir, 'bench_distributed', markdown(results)
  )


def _worker(argv=None):
  """One measurement (in a fresh process): seconds per step, written as
  JSON to --output by the chief."""
  parser = argparse.ArgumentParser()
  parser.add_argument('--steps', type=int, required=True)
  parser.add_argument('--output', required=True)
  parser.add_argument('--core', type=int)
  distributed.add_flags(parser)
  args = parser.parse_args(argv)
  if args.core is not None:  # before JAX sizes its thread pool
    os.sched_setaffinity(0, {args.core % os.cpu_count()})
  with distributed.joined(distributed.from_flags(args), {'steps': args.steps}):
    source, target = models._batch(BATCH, 8192)
    batch = (source, target, np.ones(target.shape, np.float32))
    task = training.TrainTask(
      itertools.repeat(batch),
      tl.WeightedCategoryCrossEntropy(),
      trax.optimizers.Adam(0.001),
    )
    loop = checkpointing.ResumableLoop(
      models.translation_model('train'),
      [task],
      random_seed=0,
      checkpoint_at=lambda step: False,
      eval_at=lambda step: False,
    )
    loop.progress_log = None
    loop.run(WARMUP_STEPS)
    distributed.barrier('timed')
    start = time.perf_counter()
    loop.run(args.steps)
    seconds = (time.perf_counter() - start) / args.steps
    if distributed.is_chief():
      with open(args.output, 'w') as f:
        json.dump({'seconds_per_step': seconds}, f)


if __name__ == '__main__':
  _worker()
