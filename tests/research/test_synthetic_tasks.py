"""The synthetic tasks' model, training and measures, on a tiny case."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
from trax import shapes

import trax_qkv  # noqa: F401  (registers the variants)
from trax_qkv.models import registry
from trax_qkv.research import synthetic_tasks as tasks

TINY = dict(length=8, d_model=16, steps=40, batch=32, eval_every=20)


def test_targets_of_every_task():
  assert tasks.targets_of('swap', 6).tolist() == [1, 0, 3, 2, 5, 4]
  assert tasks.targets_of('previous', 4).tolist() == [-1, 0, 1, 2]
  assert tasks.targets_of('copy', 8).tolist() == [-1] * 4 + [1, 2, 3, -1]
  setting = tasks.Setting(task='copy', **TINY)
  tokens, positions, _, targets, weights = tasks.batch(
    setting, np.random.RandomState(0)
  )
  assert np.array_equal(tokens[:, :4], tokens[:, 4:])
  assert np.array_equal(targets[:, 4:7], tokens[:, 5:8])
  assert weights[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 0]
  offsets = tasks.batch(
    dataclasses.replace(setting, task='previous_offset'),
    np.random.RandomState(0),
  )[1]
  assert np.all(np.diff(offsets, axis=1) == 1) and offsets[:, 0].max() > 0
  with pytest.raises(ValueError, match='task must be one of'):
    tasks.Setting(task='reverse')
  with pytest.raises(ValueError, match='implementation must be one of'):
    tasks.Setting(implementation='nope')


@pytest.mark.slow
def test_scores_are_the_layers_and_keep_the_bound_where_symmetric():
  """Trained 40 steps on swap: the scores read from the projections are
  the layer's own (their softmax is its 'viz' weights), a shared Q = K
  head keeps every consequence of the bound, Trax's three Dense break
  it; a second run is the same run."""
  measured = {}
  for name in ('reference', 'shared_query_key'):
    setting = tasks.Setting(implementation=name, **TINY)
    net, curve = tasks.train(setting)
    inputs = tasks.batch(setting, np.random.RandomState(1))[:3]
    viz = tasks.model(setting, mode='viz')
    viz.init(shapes.signature(inputs), rng=jax.random.PRNGKey(0))
    viz.weights = net.weights
    viz(inputs)
    (core,) = [
      layer
      for layer in registry.walk(viz)
      if type(layer).__name__ == 'PureAttention'
    ]
    scores = tasks.head_scores(net, setting, inputs)
    softmax = np.exp(scores - scores.max(-1, keepdims=True))
    softmax /= softmax.sum(-1, keepdims=True)
    np.testing.assert_allclose(softmax, core.state, rtol=1e-4, atol=1e-6)
    measured[name] = tasks.measure(net, setting, curve, n_sequences=64)
  assert measured['shared_query_key']['bound_breaking_rows'] == 0
  assert measured['shared_query_key']['mutual_pairs'] == 0
  assert measured['reference']['mutual_pairs'] > 0
  for m in measured.values():
    assert len(m['curve']) == 3 and 0 < m['accuracy'] <= 1
    shares = np.add(m['argmax_on_target'], m['argmax_on_self'])
    assert np.all(shares <= 1 + 1e-9)
  setting = tasks.Setting(implementation='shared_query_key', **TINY)
  net, curve = tasks.train(setting)
  again = tasks.measure(net, setting, curve, n_sequences=64)
  assert again == measured['shared_query_key']


def test_the_experiment_resumes_and_tabulates(tmp_path, monkeypatch):
  """A rerun trains only what results.json lacks; the table has a row per
  task, input and implementation, over its seeds."""
  from trax_qkv.research import synthetic_runs as runs

  def measures(accuracy, solved):
    return {
      'accuracy': accuracy, 'steps_to_solve': solved, 'curve': [],
      'argmax_on_target': [1.0, 0.5], 'argmax_on_self': [0.0, 0.25],
      'bound_breaking_rows': 0, 'mutual_pairs': 0,
    }  # fmt: skip

  trained = []

  def train(setting):
    trained.append(runs.key(setting))
    return None, [(0, 0.5)]

  monkeypatch.setattr(tasks, 'train', train)
  monkeypatch.setattr(
    tasks, 'measure', lambda net, s, curve: measures(0.5 + s.seed / 4, 100)
  )
  monkeypatch.setattr(
    tasks, 'mean_attention', lambda net, s: np.full((2, 4, 4), 1 / 3)
  )
  grid = runs.settings([0, 1], ['swap', 'copy'], [False], ['reference'])
  runs.run(str(tmp_path), grid[:1], log=lambda _: None)
  results = runs.run(str(tmp_path), grid, log=lambda _: None)
  assert trained == [
    'swap/raw/reference/0',
    'swap/raw/reference/1',
    'copy/raw/reference/0',
    'copy/raw/reference/1',
  ]
  # Seed 0's learned attention on swap is kept, rounded; no other run's.
  kept = json.loads((tmp_path / runs.ATTENTION).read_text())
  assert kept == {'swap/raw/reference/0': [[[0.333] * 4] * 4] * 2}
  saved = json.loads((tmp_path / runs.RESULTS).read_text())
  assert saved['runs'] == results and saved['environment']['jax']
  table = runs.table(results).splitlines()
  assert len(table) == 4
  assert table[2] == (
    '| swap | raw | `reference` | 2 | 0.625 [0.500, 0.750] '
    '| [-0.963, 2.213] | 2/2 | 100 | 0.75 / 0.12 | [0.750, 0.750] | 0, 0 |'
  )  # the t interval of two seeds: 0.625 ± 12.71 × 0.177 / √2


def test_the_committed_table_is_the_committed_results():
  """docs/runs/why_three_dense/synthetic/synthetic.md, which the page
  cites, is `table` of the results.json beside it."""
  from helpers import ROOT

  from trax_qkv.research import synthetic_runs as runs

  here = os.path.join(ROOT, 'docs', 'runs', 'why_three_dense', 'synthetic')
  with open(os.path.join(here, runs.RESULTS), encoding='utf-8') as f:
    results = json.load(f)['runs']
  assert len(results) == 320  # 4 tasks, 2 inputs, 8 layers, 5 seeds
  with open(os.path.join(here, runs.TABLE), encoding='utf-8') as f:
    assert f.read() == runs.table(results)
