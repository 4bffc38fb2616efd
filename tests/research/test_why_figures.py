"""The page's figures are its committed runs': regenerated here, the
numbers they draw equal the committed figures.json."""

import json
import os

from helpers import ROOT
import pytest

from trax_qkv.research import why_figures

RUNS = os.path.join(ROOT, 'docs', 'runs', 'why_three_dense')
IMAGES = os.path.join(ROOT, 'docs', 'images', 'why_three_dense')


def test_figures_are_drawn_from_the_committed_runs(tmp_path):
  assert why_figures.main(['--runs', RUNS, '--output_dir', str(tmp_path)]) == 0
  with open(os.path.join(IMAGES, why_figures.NUMBERS), encoding='utf-8') as f:
    committed = json.load(f)
  assert json.loads((tmp_path / why_figures.NUMBERS).read_text()) == committed
  for name in (
    'forest_self.png',
    'forest_cross.png',
    'synthetic_swap.png',
    'synthetic_attention.png',
  ):
    assert (tmp_path / name).stat().st_size > 10_000
    assert os.path.exists(os.path.join(IMAGES, name))
  # The forest plot's rows are the paired differences of the page's
  # table: one_head's self-attention eval loss, +0.18 [+0.08, +0.27].
  one_head = dict((r[0], r[1:]) for r in committed['forest_self'])['one_head']
  assert [round(x, 2) for x in one_head] == [0.18, 0.08, 0.27]
  # Every seed of each model drawn, 5 in the synthetic experiment.
  for curves in committed['synthetic_swap'].values():
    assert curves and all(len(seeds) == 5 for seeds in curves.values())
  # The learned attention the page describes: every head of Trax's layer
  # weighs the partner above the token itself, every head of
  # shared_query_key the token itself above the partner.
  heads = committed['synthetic_attention']
  assert list(heads) == list(why_figures.SYNTHETIC_MODELS)
  assert all(partner > itself for partner, itself in heads['reference'])
  assert all(partner < itself for partner, itself in heads['shared_query_key'])


def test_a_missing_runs_directory_is_refused(tmp_path, capsys):
  with pytest.raises(SystemExit):
    why_figures.main(['--runs', str(tmp_path / 'none'), '--output_dir', 'x'])
  assert '--runs must be a directory of runs' in capsys.readouterr().err
  assert not os.path.exists('x')


def test_trained_figures_draw_the_seeds_curves_and_one_sentence(tmp_path):
  """Once trained/seed* are there: the forest rows are the paired
  differences, the curves every seed's evaluations from step 1,000, the
  sentence each model's heads with their diagonal."""
  import numpy as np

  losses = {'reference': 2.0, 'shared_query_key': 2.1, 'no_projection': 2.3}
  for seed in range(3):
    run = tmp_path / 'runs' / why_figures.TRAINED / f'seed{seed}'
    run.mkdir(parents=True)
    summary = {'steps': 3000, 'seed': seed}
    for name, loss in losses.items():
      loss += 0.01 * seed
      curve = [[1, 9.0], [1000, loss + 1], [2000, loss + 0.5], [3000, loss]]
      summary[name] = {'eval_loss': loss, 'eval_loss_curve': curve}
    (run / 'summary.json').write_text(json.dumps(summary))
  tokens = ['▁Ein', '▁Hund', '▁rennt', '.', '<EOS>']
  eye = np.eye(len(tokens))
  uniform = np.full((len(tokens),) * 2, 1 / len(tokens))
  measured = {
    'sentence': {'source': 'Ein Hund rennt.', 'tokens': tokens},
    'reference': {'sentence_attention': [[uniform.tolist()] * 2]},
    'shared_query_key': {'sentence_attention': [[eye.tolist()] * 2]},
  }
  seed0 = tmp_path / 'runs' / why_figures.TRAINED / 'seed0'
  (seed0 / 'circuits.json').write_text(json.dumps(measured))
  numbers = {}
  why_figures.draw_trained(str(tmp_path / 'runs'), str(tmp_path), numbers)
  rows = {r[0]: r[1:] for r in numbers['forest_trained']}
  assert list(rows) == ['shared_query_key', 'no_projection']
  assert np.allclose(rows['no_projection'], [0.3, 0.3, 0.3])  # no spread
  curves = numbers['trained_curves']
  assert curves['reference'][2] == [[1000, 3.02], [2000, 2.52], [3000, 2.02]]
  assert numbers['trained_sentence'] == {
    'reference': [0.2, 0.2],
    'shared_query_key': [1.0, 1.0],
  }
  for name in ('forest_trained', 'trained_curves', 'trained_sentence'):
    assert (tmp_path / f'{name}.png').stat().st_size > 10_000
