"""Paired comparisons of variants with a baseline across seeds.

Each comparison is one variant against the baseline on one measure: the
per-seed differences d (variant - baseline, the same seed), so seed-to-
seed variation common to both cancels. The tests are statsmodels' and
scipy's; this module only says which ones the pages use and how their
results are labelled.

  interval   the mean of d and its Student t interval (n - 1 df)
  p_value    the two-sided paired t test of mean(d) = 0
  holm       Holm's step-down correction over a family of p values
  decide     the pre-registered decision of docs/why_three_dense.md:
             'worse', 'equivalent', 'better' or 'undecided'
"""

import numpy as np
from scipy import stats
from statsmodels.stats import multitest
from statsmodels.stats import power as smpower
from statsmodels.stats import weightstats

WORSE = 'worse'
EQUIVALENT = 'equivalent'
BETTER = 'better'
UNDECIDED = 'undecided'


def _differences(differences):
  d = np.asarray(differences, np.float64)
  if d.ndim != 1 or len(d) < 2 or not np.all(np.isfinite(d)):
    raise ValueError(
      'differences must be two or more finite per-seed values; got '
      f'{differences!r}.'
    )
  return d


def interval(differences, confidence=0.95):
  """(mean, low, high) of the per-seed differences: Student's t interval
  with n - 1 degrees of freedom."""
  d = _differences(differences)
  half = stats.t.ppf((1 + confidence) / 2, len(d) - 1) * d.std(ddof=1)
  half /= np.sqrt(len(d))
  mean = float(d.mean())
  return mean, float(mean - half), float(mean + half)


def p_value(differences):
  """Two-sided paired t test of mean(d) = 0 (1.0 where every d is equal
  and 0, NaN-free)."""
  d = _differences(differences)
  if np.all(d == d[0]):
    return 1.0 if d[0] == 0 else 0.0
  return float(stats.ttest_1samp(d, 0.0).pvalue)


def holm(p_values, alpha=0.05):
  """(reject, adjusted p) of Holm's correction over `p_values`, one
  family at family-wise error `alpha`."""
  reject, adjusted, _, _ = multitest.multipletests(
    list(p_values), alpha=alpha, method='holm'
  )
  return [bool(r) for r in reject], [float(p) for p in adjusted]


def one_sided_p_values(differences, margin, higher_is_worse=True):
  """{'worse', 'better', 'equivalent'}: p values of the three one-sided
  claims about the mean difference. 'worse': the t test of H0 "no
  worse than 0"; 'better': of "no better than 0"; 'equivalent': TOST of
  H0 "outside (-margin, +margin)" (the larger of its two one-sided p)."""
  d = _differences(differences)
  if not margin > 0:
    raise ValueError(f'margin must be positive; got {margin!r}.')
  sign = 1.0 if higher_is_worse else -1.0
  worse = stats.ttest_1samp(sign * d, 0.0, alternative='greater').pvalue
  better = stats.ttest_1samp(sign * d, 0.0, alternative='less').pvalue
  equivalent, _, _ = weightstats.ttost_paired(
    d, np.zeros_like(d), -margin, margin
  )
  return dict(
    worse=float(worse), better=float(better), equivalent=float(equivalent)
  )


def decide(comparisons, margin, alpha=0.05, higher_is_worse=True):
  """The pre-registered decision for each variant of one primary measure.

  Args:
    comparisons: {variant: per-seed differences from the baseline}.
    margin: the equivalence margin, in the measure's units.
    alpha: the family-wise error of each claim, Holm-corrected over the
      variants.
    higher_is_worse: True for a loss, False for accuracy or BLEU.

  Returns:
    {variant: (label, {claim: Holm-adjusted p})}: label 'worse' or
    'better' where that one-sided test rejects, 'equivalent' where TOST
    does (both where a difference is real and inside the margin: 'worse,
    within the margin'), else 'undecided'.
  """
  names = list(comparisons)
  raw = {
    n: one_sided_p_values(comparisons[n], margin, higher_is_worse)
    for n in names
  }
  adjusted = {n: {} for n in names}
  rejected = {n: set() for n in names}
  for claim in (WORSE, BETTER, EQUIVALENT):
    reject, p = holm([raw[n][claim] for n in names], alpha)
    for n, r, q in zip(names, reject, p):
      adjusted[n][claim] = q
      if r:
        rejected[n].add(claim)
  result = {}
  for n in names:
    found = rejected[n]
    direction = WORSE if WORSE in found else BETTER if BETTER in found else None
    if direction and EQUIVALENT in found:
      label = f'{direction}, within the margin'
    else:
      label = direction or (EQUIVALENT if EQUIVALENT in found else UNDECIDED)
    result[n] = (label, adjusted[n])
  return result


def power_threshold(n_seeds, alpha=0.05, power=0.8):
  """The smallest mean difference, in standard deviations of the paired
  difference, that a two-sided paired t test of `n_seeds` detects with
  `power` (statsmodels' one-sample t power)."""
  return float(
    smpower.TTestPower().solve_power(
      nobs=n_seeds, alpha=alpha, power=power, alternative='two-sided'
    )
  )
