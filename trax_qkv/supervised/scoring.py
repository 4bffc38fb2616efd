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


def scores(hypotheses, references, tokenize='13a'):
  """sacreBLEU BLEU (cased, lowercased) and chrF with their signatures, and
  exact match (`hypotheses` and `references`: one string per sentence;
  `tokenize`: sacreBLEU's BLEU tokenizer)."""
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
  # chrF: on single-word targets (German number words) BLEU has no 2- to
  # 4-grams to match and is 0 even for perfect output.
  for name, metric in (
    ('bleu', BLEU(tokenize=tokenize)),
    ('bleu_lowercase', BLEU(tokenize=tokenize, lowercase=True)),
    ('chrf', CHRF()),
  ):
    out[name] = metric.corpus_score(hypotheses, [references]).score
    out[f'{name}_signature'] = str(metric.get_signature())
  return out
