"""Scoring translations as the field reports them: sacreBLEU and exact match."""

import numpy as np
import sacrebleu


def scores(hypotheses, references):
  """sacreBLEU BLEU (cased, lowercased) and chrF, and exact match."""
  if len(hypotheses) != len(references):
    raise ValueError(f'{len(hypotheses)} hypotheses for '
                     f'{len(references)} references.')
  exact = np.mean([h == r for h, r in zip(hypotheses, references)])
  return {
      'bleu': sacrebleu.corpus_bleu(hypotheses, [references]).score,
      'bleu_lowercase': sacrebleu.corpus_bleu(hypotheses, [references],
                                              lowercase=True).score,
      # chrF: on single-word targets (German number words) BLEU has no
      # 2- to 4-grams to match and is 0 even for perfect output.
      'chrf': sacrebleu.corpus_chrf(hypotheses, [references]).score,
      'exact_match': float(exact),
  }
