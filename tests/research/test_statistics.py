"""The paired comparisons: what each function returns on data whose
answer is known, and the pre-registered decisions on constructed seeds."""

import numpy as np
import pytest
from scipy import stats

from trax_qkv.research import statistics


def test_interval_is_student_t_of_the_differences():
  d = [0.194, 0.061, 0.011]
  mean, low, high = statistics.interval(d)
  expected = stats.t.interval(
    0.95, 2, loc=np.mean(d), scale=stats.sem(d)
  )  # fmt: skip
  assert mean == pytest.approx(np.mean(d))
  assert (low, high) == pytest.approx(expected)
  assert statistics.p_value(d) == pytest.approx(stats.ttest_1samp(d, 0).pvalue)
  assert statistics.p_value([0.0, 0.0, 0.0]) == 1.0


def test_holm_steps_down():
  # Sorted 0.01, 0.03, 0.04: x3, x2, x1, then made monotone.
  reject, adjusted = statistics.holm([0.01, 0.04, 0.03])
  assert adjusted == pytest.approx([0.03, 0.06, 0.06])
  assert reject == [True, False, False]


def test_three_seeds_detect_about_three_standard_deviations():
  assert statistics.power_threshold(3) == pytest.approx(3.26, abs=0.01)
  assert statistics.power_threshold(10) < statistics.power_threshold(3)


def test_decisions_on_constructed_seeds():
  margin = 0.05
  decided = statistics.decide(
    {
      'clearly_worse': [0.20, 0.18, 0.22],
      'clearly_better': [-0.20, -0.18, -0.22],
      'tiny': [0.001, -0.002, 0.0005],
      'noisy': [0.30, -0.20, 0.05],
      'small_but_real': [0.010, 0.011, 0.0105],
    },
    margin,
  )
  labels = {name: label for name, (label, _) in decided.items()}
  assert labels == {
    'clearly_worse': 'worse',
    'clearly_better': 'better',
    'tiny': 'equivalent',
    'noisy': 'undecided',
    'small_but_real': 'worse, within the margin',
  }
  # Holm over the five variants: each adjusted p is at least the raw one.
  raw = statistics.one_sided_p_values([0.20, 0.18, 0.22], margin)
  assert decided['clearly_worse'][1]['worse'] >= raw['worse']
  # Accuracy or BLEU: higher is better.
  flipped = statistics.decide(
    {'a': [0.20, 0.18, 0.22], 'b': [0.3, -0.2, 0.05]},
    margin,
    higher_is_worse=False,
  )
  assert flipped['a'][0] == 'better'


@pytest.mark.parametrize(
  'differences', [[0.1], [[0.1, 0.2]], [0.1, float('nan'), 0.2]]
)
def test_bad_differences_are_refused(differences):
  with pytest.raises(ValueError, match='differences must be two or more'):
    statistics.interval(differences)


def test_bad_margin_is_refused():
  with pytest.raises(ValueError, match='margin must be positive'):
    statistics.decide({'a': [0.1, 0.2, 0.3]}, 0)
