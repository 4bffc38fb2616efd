"""The figures of docs/why_three_dense.md, from its committed runs.

  python3 -m trax_qkv.research.why_figures \
      --runs docs/runs/why_three_dense --output_dir docs/images/why_three_dense

Reads the seeded runs' summary.json (self/seed*, cross/seed*) and the
synthetic experiment's results.json and attention.json, draws each
figure and writes the numbers it drew to figures.json beside them, so
that a test can tell whether the committed figures are the committed
runs'.
"""

import argparse
import glob
import json
import os

import numpy as np

from trax_qkv import files
from trax_qkv.research import figures
from trax_qkv.research import statistics
from trax_qkv.research import synthetic_runs
from trax_qkv.research import synthetic_tasks

BASELINE = 'reference'
# The primary measure of the pre-registered comparison, and its margin.
MEASURE = 'eval_loss'
MARGIN = 0.05
NUMBERS = 'figures.json'
# The synthetic task where the bound bites, and the models drawn.
SYNTHETIC_TASK = 'swap'
SYNTHETIC_MODELS = (
  'reference',
  'shared_query_key',
  'no_projection',
  'raw_values',
)


def _summaries(runs_dir, experiment):
  """The summary.json of each seed of one experiment, in seed order."""
  summaries = []
  for path in sorted(
    glob.glob(os.path.join(runs_dir, experiment, 'seed*', 'summary.json'))
  ):
    with open(path, encoding='utf-8') as f:
      summaries.append(json.load(f))
  return summaries


def seeded_differences(summaries, measure=MEASURE):
  """[(variant, mean, low, high)]: each variant's paired difference from
  the baseline in `measure` across the seeds' `summaries`."""
  names = [
    k
    for k, v in summaries[0].items()
    if isinstance(v, dict) and measure in v and k != BASELINE
  ]
  return [
    (
      name,
      *statistics.interval(
        [s[name][measure] - s[BASELINE][measure] for s in summaries]
      ),
    )
    for name in names
  ]


def synthetic_curves(results, task=SYNTHETIC_TASK, models=SYNTHETIC_MODELS):
  """{inputs: {model: per-seed accuracy curves}} of one task, for the
  inputs without and with a LayerNorm; models without runs left out."""
  panels = {}
  for front, inputs in (('raw', 'embeddings'), ('layer_norm', 'LayerNorm')):
    panels[inputs] = {}
    for model in models:
      prefix = f'{task}/{front}/{model}/'
      seeds = [
        r['curve'] for k, r in sorted(results.items()) if k.startswith(prefix)
      ]
      if seeds:
        panels[inputs][model] = seeds
  return panels


def synthetic_attention(
  attention, task=SYNTHETIC_TASK, models=SYNTHETIC_MODELS
):
  """{model: (heads, L, L)} of the learned attention kept for `task`
  (`synthetic_runs.ATTENTION`), in `models`' order, those kept only."""
  found = {}
  for model in models:
    for name, weights in attention.items():
      if name.startswith(f'{task}/raw/{model}/'):
        found[model] = np.asarray(weights)
  return found


def partner_and_self(weights, task=SYNTHETIC_TASK):
  """Per head, (mean weight a row puts on its target, on itself) of
  (heads, L, L) attention, over the rows that have a target."""
  targets = synthetic_tasks.targets_of(task, weights.shape[-1])
  rows = np.flatnonzero(targets >= 0)
  return [
    [round(float(head[rows, targets[rows]].mean()), 3),
     round(float(head[rows, rows].mean()), 3)]
    for head in weights
  ]  # fmt: skip


def draw(runs_dir, output_dir):
  """Draws every figure into output_dir; returns the numbers drawn."""
  numbers = {}
  for experiment in ('self', 'cross'):
    summaries = _summaries(runs_dir, experiment)
    rows = seeded_differences(summaries)
    numbers[f'forest_{experiment}'] = rows
    fig = figures.forest(
      rows,
      MARGIN,
      f'{experiment}-attention varied: eval loss, variant − reference\n'
      f'{len(summaries)} seeds, {summaries[0]["steps"]:,} steps; '
      '95 % t intervals, uncorrected',
      'eval loss difference (nats)',
    )
    fig.savefig(os.path.join(output_dir, f'forest_{experiment}.png'), dpi=110)
  with open(
    os.path.join(runs_dir, 'synthetic', synthetic_runs.RESULTS),
    encoding='utf-8',
  ) as f:
    results = json.load(f)['runs']
  curves = synthetic_curves(results)
  numbers['synthetic_swap'] = curves
  fig = figures.learning_curves(
    curves,
    f'"{SYNTHETIC_TASK}" (each of a pair reads the other): accuracy, '
    'mean and range over seeds',
  )
  fig.savefig(os.path.join(output_dir, 'synthetic_swap.png'), dpi=110)
  with open(
    os.path.join(runs_dir, 'synthetic', synthetic_runs.ATTENTION),
    encoding='utf-8',
  ) as f:
    panels = synthetic_attention(json.load(f))
  numbers['synthetic_attention'] = {
    model: partner_and_self(weights) for model, weights in panels.items()
  }
  fig = figures.attention_grid(
    panels,
    f'"{SYNTHETIC_TASK}", seed {synthetic_runs.ATTENTION_SEED}: '
    'learned attention\n(rows read columns; partners sit\n'
    'next to the diagonal)',
  )
  fig.savefig(os.path.join(output_dir, 'synthetic_attention.png'), dpi=110)
  return numbers


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog='python3 -m trax_qkv.research.why_figures', description=__doc__
  )
  parser.add_argument('--runs', required=True, help='docs/runs/why_three_dense')
  parser.add_argument('--output_dir', required=True)
  args = parser.parse_args(argv)
  if not os.path.isdir(args.runs):
    parser.error(f'--runs must be a directory of runs; got {args.runs!r}')
  os.makedirs(args.output_dir, exist_ok=True)
  numbers = draw(args.runs, args.output_dir)
  files.write_json(os.path.join(args.output_dir, NUMBERS), numbers)
  print(f'written to {args.output_dir}')
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
