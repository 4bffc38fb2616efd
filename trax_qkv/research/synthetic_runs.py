"""The synthetic experiment: every task, implementation and seed, resumable.

  python3 -m trax_qkv.research.synthetic_runs --output_dir DIR
      [--seeds 0 1 2 3 4] [--tasks swap previous previous_offset copy]
      [--layer_norm both|with|without] [--implementations NAME ...]

Trains `synthetic_tasks.Setting` for each combination, appends each run's
measures to DIR/results.json as it finishes (a rerun skips what is there,
so an interrupted experiment resumes), and writes DIR/synthetic.md, the
table docs/why_three_dense.md shows. The attention that seed 0 learned
on swap (without LayerNorm), averaged over sequences, goes to
DIR/attention.json for the page's picture of it. Every run is seeded;
rerun on the same machine and stack, a combination has given the same
final accuracy, with a curve point or a count sometimes a few apart
(docs/why_three_dense.md says how many).
"""

import argparse
import json
import os
import platform

import jax
import numpy as np

from trax_qkv import files
from trax_qkv.research import statistics
from trax_qkv.research import synthetic_tasks as tasks

# The question's variants: the symmetric ones (no QK projection, with and
# without a temperature; shared Q = K; raw Q and K) and those that keep
# an asymmetric score (raw values, one K/V head, one head).
IMPLEMENTATIONS = (
  'reference',
  'no_projection',
  'no_projection_temperature',
  'shared_query_key',
  'raw_queries_keys',
  'raw_values',
  'multi_query',
  'one_head',
)
RESULTS = 'results.json'
TABLE = 'synthetic.md'
ATTENTION = 'attention.json'
# Whose learned attention is kept: one seed of the task where the bound
# bites, without LayerNorm (every head's weights, about 7 kB per run).
ATTENTION_TASKS = ('swap',)
ATTENTION_SEED = 0


def key(setting):
  return (
    f'{setting.task}/{"layer_norm" if setting.layer_norm else "raw"}/'
    f'{setting.implementation}/{setting.seed}'
  )


def run(output_dir, settings, log=print):
  """Trains each setting not yet in output_dir's results; returns them
  all ({key: measures})."""
  os.makedirs(output_dir, exist_ok=True)
  path = os.path.join(output_dir, RESULTS)
  attention_path = os.path.join(output_dir, ATTENTION)
  results, attention = {}, {}
  if os.path.exists(path):
    results = files.read_json_object(path, 'synthetic results')['runs']
  if os.path.exists(attention_path):
    attention = files.read_json_object(attention_path, 'learned attention')
  for setting in settings:
    if key(setting) in results:
      continue
    net, curve = tasks.train(setting)
    results[key(setting)] = tasks.measure(net, setting, curve)
    if (
      setting.seed == ATTENTION_SEED
      and setting.task in ATTENTION_TASKS
      and not setting.layer_norm
    ):
      weights = tasks.mean_attention(net, setting)
      attention[key(setting)] = np.round(weights, 3).tolist()
      files.write_text(attention_path, json.dumps(attention) + '\n')
    log(f'{key(setting)}: accuracy {results[key(setting)]["accuracy"]:.3f}')
    files.write_json(path, {'environment': environment(), 'runs': results})
  return results


def environment():
  return {
    'jax': jax.__version__,
    'python': platform.python_version(),
    'processor': platform.processor() or platform.machine(),
    'cpu': _cpu_name(),
  }


def _cpu_name():
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.machine()


def _t_interval(values):
  """'[low, high]': the 95 % Student t interval of the seeds' mean."""
  _, low, high = statistics.interval(values)
  return f'[{low:.3f}, {high:.3f}]'


def table(results):
  """Markdown: per task, input and implementation, over its seeds: mean
  accuracy [min, max] and its 95 % t interval, seeds solved (>= 0.99),
  the median steps to solve, where the heads' maxima fall (on the target
  / on itself, mean over heads and seeds; the t interval of the share on
  the target), and rows or pairs breaking the bound (sums)."""
  groups = {}
  for name, measures in results.items():
    task, inputs, implementation, _ = name.split('/')
    groups.setdefault((task, inputs, implementation), []).append(measures)
  rows = [
    '| task | input | implementation | seeds | accuracy, mean [min, max] '
    '| accuracy, 95 % t interval | solved | steps to solve (median) '
    '| argmax on target / on itself | argmax on target, 95 % t interval '
    '| bound broken (rows, pairs) |',
    '|---|---|---|---:|---|---|---:|---:|---|---|---|',
  ]
  order = {name: i for i, name in enumerate(IMPLEMENTATIONS)}
  for (task, inputs, implementation), runs in sorted(
    groups.items(),
    key=lambda g: (tasks.TASKS.index(g[0][0]), g[0][1], order[g[0][2]]),
  ):
    accuracy = [r['accuracy'] for r in runs]
    solved = [r['steps_to_solve'] for r in runs if r['steps_to_solve']]
    steps = f'{np.median(solved):.0f}' if solved else '-'
    on_target = [np.mean(r['argmax_on_target']) for r in runs]
    target = np.mean(on_target)
    itself = np.mean([np.mean(r['argmax_on_self']) for r in runs])
    broken = sum(r['bound_breaking_rows'] for r in runs)
    mutual = sum(r['mutual_pairs'] for r in runs)
    rows.append(
      f'| {task} | {inputs} | `{implementation}` | {len(runs)} '
      f'| {np.mean(accuracy):.3f} [{min(accuracy):.3f}, {max(accuracy):.3f}] '
      f'| {_t_interval(accuracy)} '
      f'| {len(solved)}/{len(runs)} | {steps} | {target:.2f} / {itself:.2f} '
      f'| {_t_interval(on_target)} | {broken}, {mutual} |'
    )
  return '\n'.join(rows) + '\n'


def settings(seeds, task_names, layer_norms, implementations=IMPLEMENTATIONS):
  return [
    tasks.Setting(
      task=task, implementation=implementation, layer_norm=layer_norm,
      seed=seed,
    )
    for task in task_names
    for layer_norm in layer_norms
    for implementation in implementations
    for seed in seeds
  ]  # fmt: skip


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog='python3 -m trax_qkv.research.synthetic_runs', description=__doc__
  )
  parser.add_argument('--output_dir', required=True)
  parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2, 3, 4])
  parser.add_argument(
    '--tasks', nargs='+', choices=tasks.TASKS, default=list(tasks.TASKS)
  )
  parser.add_argument(
    '--layer_norm', choices=('both', 'with', 'without'), default='both'
  )
  parser.add_argument(
    '--implementations',
    nargs='+',
    choices=IMPLEMENTATIONS,
    default=list(IMPLEMENTATIONS),
  )
  args = parser.parse_args(argv)
  layer_norms = {
    'both': (False, True),
    'with': (True,),
    'without': (False,),
  }[args.layer_norm]
  results = run(
    args.output_dir,
    settings(args.seeds, args.tasks, layer_norms, args.implementations),
  )
  files.write_text(os.path.join(args.output_dir, TABLE), table(results))
  print(os.path.join(args.output_dir, TABLE))
  return 0


if __name__ == '__main__':
  import trax_qkv  # noqa: F401  (registers the variants)

  raise SystemExit(main())
