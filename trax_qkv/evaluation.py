"""Decoding a trained translation Transformer and scoring it (sacreBLEU).

Decoding runs the model in 'predict' mode, in batches of equal shape: every
batch is padded to the same size and source length, so the jitted model
compiles once, and the predict-mode state (encoder output and K/V caches) is
reset to its initial value before each batch -- trax's
`autoregressive_sample` does not reset it, and a second call would silently
reuse the first call's encoder output.
"""

import numpy as np
import sacrebleu
from trax import layers as tl
from trax import shapes
from trax.supervised import decoding

from trax_qkv.data import EOS_ID


def encode_sources(vocab, sources):
  """Token ids with EOS appended, as the training pipeline makes them."""
  return [vocab.encode(s) + [EOS_ID] for s in sources]


def cut_at_eos(tokens):
  tokens = list(tokens)
  return tokens[:tokens.index(EOS_ID)] if EOS_ID in tokens else tokens


def pad_rows(rows, width):
  """Lists of ids -> int32 (len(rows), width), zero-padded."""
  out = np.zeros((len(rows), width), dtype=np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def predict_model(model_fn, weights_file, batch_size, source_length):
  """A predict-mode model loaded from `weights_file` for fixed-shape batches.

  Args:
    model_fn: called as model_fn(mode='predict') -> Trax layer.
    weights_file: a Trax checkpoint (`model.pkl.gz`) or `save_to_file` file.
    batch_size, source_length: the shape every decoding batch will have.
  """
  model = model_fn(mode='predict')
  signature = shapes.signature((np.zeros((batch_size, source_length),
                                         np.int32),
                                np.zeros((batch_size, 1), np.int32)))
  model.init_from_file(weights_file, weights_only=True,
                       input_signature=signature)
  return model


def greedy_decode(model, source_ids, batch_size, source_length, max_length):
  """Greedy decoding of `source_ids` (lists of ids) -> lists of ids, no EOS.

  `model` comes from `predict_model(..., batch_size, source_length)`.
  """
  too_long = [i for i, s in enumerate(source_ids) if len(s) > source_length]
  if too_long:
    raise ValueError(f'source {too_long[0]} has {len(source_ids[too_long[0]])}'
                     f' tokens; the model was prepared for {source_length}.')
  fast = tl.Accelerate(model)  # jit once, reuse for every batch
  initial_state = model.state
  outputs = []
  for start in range(0, len(source_ids), batch_size):
    rows = source_ids[start:start + batch_size]
    batch = pad_rows(rows + [[]] * (batch_size - len(rows)), source_length)
    fast.state = initial_state
    tokens = decoding.autoregressive_sample(
        fast, batch, batch_size=batch_size, temperature=0.0,
        max_length=max_length, eos_id=EOS_ID, accelerate=False)
    outputs.extend(cut_at_eos(row) for row in np.asarray(tokens)[:len(rows)])
  return outputs


def beam_decode(model, source_ids, source_length, n_beams, max_length):
  """Best beam per source, one at a time (trax's beam_search takes batch 1).

  `model` comes from `predict_model(..., 1, source_length)`.
  """
  initial_state = model.state
  results = []
  for ids in source_ids:
    model.state = initial_state
    beams = decoding.beam_search(model, pad_rows([ids], source_length),
                                 n_beams=n_beams, max_length=max_length,
                                 eos_id=EOS_ID, accelerate=True)
    results.append(cut_at_eos(np.asarray(beams[0][0])[0]))
  return results


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
