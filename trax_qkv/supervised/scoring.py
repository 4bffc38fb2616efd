"""Scoring translations as the field reports them: sacreBLEU and exact match.

Every score comes with sacreBLEU's signature (references, case,
tokenizer, smoothing, version), so a number can be compared with another
only where the signatures match.
"""

import functools

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.metrics import CHRF

# sacreBLEU's tokenizers offered for BLEU: '13a' (its default, for
# languages written with spaces), 'intl' (Unicode punctuation and symbols),
# 'char' (every character a token), 'zh' (Chinese), 'ja-mecab' (Japanese;
# needs `pip install 'sacrebleu[ja]'`).
BLEU_TOKENIZERS = ('13a', 'intl', 'char', 'zh', 'ja-mecab')


def check_bleu_tokenize(tokenize):
  """Raises ValueError unless sacreBLEU can tokenize with `tokenize` here."""
  if tokenize not in BLEU_TOKENIZERS:
    raise ValueError(
      f'bleu_tokenize must be one of {BLEU_TOKENIZERS}; got {tokenize!r}.'
    )
  try:
    BLEU(tokenize=tokenize)
  except RuntimeError as e:  # a tokenizer whose extra package is missing
    raise ValueError(
      f'bleu_tokenize {tokenize!r} needs a package that is not installed: '
      f"pip install 'sacrebleu[ja]' ({' '.join(str(e).split())})"
    ) from None


# Why a BLEU is None: sacreBLEU would say 0.00 for perfect translations.
BLEU_UNDEFINED = (
  'BLEU is undefined: no translation has {n} or more tokens, so its '
  'geometric mean of 1- to 4-gram precisions has no {n}-gram term; exact '
  'match and chrF measure them'
)


def scores(hypotheses, references, tokenize='13a'):
  """sacreBLEU BLEU (cased, lowercased) and chrF with their signatures, and
  exact match (`hypotheses` and `references`: one string per sentence;
  `tokenize`: sacreBLEU's BLEU tokenizer).

  A BLEU is None, and 'bleu_undefined' says why, where the translations
  have no n-grams of an order BLEU multiplies in (single-word targets,
  as the numbers corpus's German ones).
  """
  if len(hypotheses) != len(references):
    raise ValueError(
      f'{len(hypotheses)} hypotheses for {len(references)} references.'
    )
  check_bleu_tokenize(tokenize)
  out = {
    'exact_match': float(
      np.mean([h == r for h, r in zip(hypotheses, references)])
    )
  }
  for name, metric in (
    ('bleu', BLEU(tokenize=tokenize)),
    ('bleu_lowercase', BLEU(tokenize=tokenize, lowercase=True)),
    ('chrf', CHRF()),
  ):
    result = metric.corpus_score(hypotheses, [references])
    out[name] = result.score
    out[f'{name}_signature'] = str(metric.get_signature())
    missing = [
      n + 1
      for n, total in enumerate(getattr(result, 'totals', []))
      if not total
    ]
    if missing:
      out[name] = None
      out['bleu_undefined'] = BLEU_UNDEFINED.format(n=missing[0])
  return out


@functools.lru_cache(maxsize=4)
def _scorer(name, tokenize, references):
  """sacreBLEU's metric `name` holding `references` (a tuple of strings)
  preprocessed once: comparing many systems on one test set would
  otherwise extract the references' n-grams again for every system."""
  references = [list(references)]
  return {
    'bleu': lambda: BLEU(tokenize=tokenize, references=references),
    'bleu_lowercase': lambda: BLEU(
      tokenize=tokenize, lowercase=True, references=references
    ),
    'chrf': lambda: CHRF(references=references),
  }[name]()


@functools.lru_cache(maxsize=64)
def _statistics(name, tokenize, references, hypotheses):
  """Per-sentence sufficient statistics of `hypotheses` against
  `references` (tuples of strings), read-only: a baseline's are reused
  for every system compared with it."""
  scorer = _scorer(name, tokenize, references)
  stats = np.array(
    scorer._extract_corpus_statistics(list(hypotheses), None), np.float64
  )
  stats.flags.writeable = False
  return stats


def paired_bootstrap(
  references, baseline, systems, metric='bleu_lowercase', tokenize='13a',
  n_samples=1000, seed=12345,
):  # fmt: skip
  """The difference in a corpus score between `systems` and `baseline`,
  with a 95 % interval by paired bootstrap resampling of the test
  sentences (sacreBLEU's paired test resamples them so).

  Args:
    references: one string per test sentence.
    baseline, systems: per seed, one hypothesis per sentence; the two
      lists pair seeds in order, and the difference is the mean over them.
    metric: 'bleu', 'bleu_lowercase' or 'chrf', as `scores` names them.
    tokenize: sacreBLEU's BLEU tokenizer.
    n_samples: resamples of the test set, the same for every system.
    seed: of the resampling.

  Returns:
    (difference, low, high): the observed difference of the seeds' mean
    scores and the 2.5th and 97.5th percentiles of the resampled ones.
  """
  if len(baseline) != len(systems) or not baseline:
    raise ValueError(
      'baseline and systems must give the same number (>= 1) of seeds; '
      f'got {len(baseline)} and {len(systems)}.'
    )
  references = tuple(references)
  scorer = _scorer(metric, tokenize, references)

  def stats(hypotheses):
    if len(hypotheses) != len(references):
      raise ValueError(
        f'{len(hypotheses)} hypotheses for {len(references)} references.'
      )
    return _statistics(metric, tokenize, references, tuple(hypotheses))

  pairs = [(stats(b), stats(s)) for b, s in zip(baseline, systems)]

  def difference(b_totals, s_totals):
    return np.mean(
      [
        scorer._compute_score_from_stats(s).score
        - scorer._compute_score_from_stats(b).score
        for b, s in zip(b_totals, s_totals)
      ]
    )

  # Each resample as the number of times it draws each sentence: one
  # product then sums every resample's statistics. They are counts, so
  # the sums are exact in any order.
  n = len(references)
  rng = np.random.default_rng(seed)
  draws = np.stack(
    [
      np.bincount(rng.integers(n, size=n), minlength=n)
      for _ in range(n_samples)
    ]
  ).astype(np.float64)
  totals = [(draws @ b, draws @ s) for b, s in pairs]
  samples = [
    difference([b[i] for b, _ in totals], [s[i] for _, s in totals])
    for i in range(n_samples)
  ]
  low, high = np.percentile(samples, [2.5, 97.5])
  observed = difference(
    [b.sum(0) for b, _ in pairs], [s.sum(0) for _, s in pairs]
  )
  return float(observed), float(low), float(high)
