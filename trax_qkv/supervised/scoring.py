"""Scoring translations as the field reports them: sacreBLEU and exact match.

Every score comes with sacreBLEU's signature (references, case,
tokenizer, smoothing, version), so a number can be compared with another
only where the signatures match.
"""

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
