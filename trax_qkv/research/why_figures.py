"""The figures of docs/why_three_dense.md, from its committed runs.

  python3 -m trax_qkv.research.why_figures \
      --runs docs/runs/why_three_dense --output_dir docs/images/why_three_dense

Reads the seeded runs' summary.json (self/seed*, cross/seed*, and
trained/seed* with seed 0's circuits.json once the trained-model runs
are there) and the synthetic experiment's results.json and
attention.json, draws each figure and writes the numbers it drew to
figures.json beside them, so that a test can tell whether the committed
figures are the committed runs'.
"""

import argparse
import glob
import os

import numpy as np

from trax_qkv import files
from trax_qkv.research import figures
from trax_qkv.research import preregistered
from trax_qkv.research import statistics
from trax_qkv.research import synthetic_runs
from trax_qkv.research import synthetic_tasks

BASELINE = 'reference'
NUMBERS = 'figures.json'
# The synthetic task where the bound bites, and the models drawn.
SYNTHETIC_TASK = 'swap'
SYNTHETIC_MODELS = (
  'reference',
  'shared_query_key',
  'no_projection',
  'raw_values',
)
# The trained-model measurement's runs (seed*/ under it), and whose
# attention to one sentence is drawn: Trax's layer beside the symmetric.
TRAINED = 'trained'
SENTENCE_MODELS = ('reference', 'shared_query_key', 'no_projection')


def _summaries(runs_dir, experiment):
  """The summary.json of each seed of one experiment, in seed order."""
  summaries = []
  for path in sorted(
    glob.glob(os.path.join(runs_dir, experiment, 'seed*', 'summary.json'))
  ):
    summaries.append(files.read_json_object(path, 'a validate summary'))
  return summaries


def _models_with(summary, key):
  """The models of a summary.json that report `key`, in its order."""
  return [k for k, v in summary.items() if isinstance(v, dict) and key in v]


def seeded_differences(summaries, measure=preregistered.PRIMARY_MEASURE):
  """[(variant, mean, low, high)]: each variant's paired difference from
  the baseline in `measure` across the seeds' `summaries`."""
  names = [k for k in _models_with(summaries[0], measure) if k != BASELINE]
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


def trained_curves(summaries, first_step=1000):
  """{model: per-seed [[step, eval loss]]} from the seeds' summaries'
  eval_loss_curve, from `first_step` on (the loss at step 1, near
  log(vocabulary), would flatten the rest)."""
  return {
    name: [
      [point for point in s[name]['eval_loss_curve'] if point[0] >= first_step]
      for s in summaries
    ]
    for name in _models_with(summaries[0], 'eval_loss_curve')
  }


def curve_differences(curves, baseline=BASELINE):
  """{variant: per-seed [[step, variant − baseline]]} of `trained_curves`'
  output, the baseline's evaluations at the same steps."""
  base = [dict(seed) for seed in curves[baseline]]  # step -> loss, per seed
  return {
    name: [
      [[step, value - at[step]] for step, value in seed]
      for seed, at in zip(seeds, base, strict=True)
    ]
    for name, seeds in curves.items()
    if name != baseline
  }


def sentence_panels(measured, models, layer=0):
  """{model: (heads, L, L)}: one layer of the encoder self-attention that
  trax-qkv-circuits kept for one test sentence (circuits.json's
  'sentence_attention'), for those of `models` it measured."""
  return {
    model: np.asarray(measured[model]['sentence_attention'][layer])
    for model in models
    if model in measured
  }


def _save(fig, output_dir, name):
  fig.savefig(os.path.join(output_dir, name), dpi=110)


def _forest(summaries, experiment, corrected=''):
  rows = seeded_differences(summaries)
  fig = figures.forest(
    rows,
    preregistered.MARGIN,
    f'{experiment}: eval loss, variant − reference\n'
    f'{len(summaries)} seeds, {summaries[0]["steps"]:,} steps; '
    f'95 % t intervals{corrected}',
    'eval loss difference (nats)',
  )
  return rows, fig


def _draw_synthetic(runs_dir, output_dir, numbers):
  results = files.read_json_object(
    os.path.join(runs_dir, 'synthetic', synthetic_runs.RESULTS),
    'synthetic results',
  )['runs']
  curves = synthetic_curves(results)
  numbers['synthetic_swap'] = curves
  fig = figures.learning_curves(
    curves,
    f'"{SYNTHETIC_TASK}" (each of a pair reads the other): accuracy, '
    'mean and range over seeds',
  )
  _save(fig, output_dir, 'synthetic_swap.png')
  panels = synthetic_attention(
    files.read_json_object(
      os.path.join(runs_dir, 'synthetic', synthetic_runs.ATTENTION),
      'learned attention',
    )
  )
  numbers['synthetic_attention'] = {
    model: partner_and_self(weights) for model, weights in panels.items()
  }
  fig = figures.attention_grid(
    panels,
    f'"{SYNTHETIC_TASK}", seed {synthetic_runs.ATTENTION_SEED}: '
    'learned attention\n(rows read columns; partners sit\n'
    'next to the diagonal)',
  )
  _save(fig, output_dir, 'synthetic_attention.png')


def draw_trained(runs_dir, output_dir, numbers):
  """The trained-model measurement's figures, once its runs are there:
  the forest plot, the learning curves, one sentence's attention."""
  summaries = _summaries(runs_dir, TRAINED)
  if not summaries:
    return
  numbers['forest_trained'], fig = _forest(
    summaries,
    'trained models, self-attention varied',
    ', uncorrected (the decisions: Holm)',
  )
  _save(fig, output_dir, 'forest_trained.png')
  curves = trained_curves(summaries)
  numbers['trained_curves'] = curves
  fig = figures.learning_curves(
    {
      'eval loss (validation split, nats)': curves,
      'variant − reference, paired by seed': curve_differences(curves),
    },
    f'Trained models: eval loss while training, mean and range over '
    f'{len(summaries)} seeds',
    ylabel='nats',
    sharey=False,
  )
  _save(fig, output_dir, 'trained_curves.png')
  measured = files.read_json_object(
    os.path.join(runs_dir, TRAINED, 'seed0', 'circuits.json'),
    'circuit measures',
  )
  panels = sentence_panels(measured, SENTENCE_MODELS)
  numbers['trained_sentence'] = {
    model: [float(np.mean(np.diagonal(h))) for h in weights]
    for model, weights in panels.items()
  }
  sentence = measured['sentence']
  fig = figures.attention_grid(
    panels,
    f'"{sentence["source"]}": encoder self-attention, layer 1, seed 0\n'
    '(rows read columns; the diagonal: a token on itself)',
    tokens=sentence['tokens'],
  )
  _save(fig, output_dir, 'trained_sentence.png')


def draw(runs_dir, output_dir):
  """Draws every figure into output_dir; returns the numbers drawn."""
  numbers = {}
  for experiment in ('self', 'cross'):
    numbers[f'forest_{experiment}'], fig = _forest(
      _summaries(runs_dir, experiment),
      f'{experiment}-attention varied, early in training',
      ', uncorrected',
    )
    _save(fig, output_dir, f'forest_{experiment}.png')
  _draw_synthetic(runs_dir, output_dir, numbers)
  draw_trained(runs_dir, output_dir, numbers)
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
