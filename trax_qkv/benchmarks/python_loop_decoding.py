"""Decoding as release 0.3 did it: a Python loop per generated token.

Kept as the baseline that `trax-qkv-bench --only decoding` times and the
tests compare the compiled search (`trax_qkv.supervised.search`) with:
one call of the jitted model per token, the logits back on the host as
float64 NumPy, beams chosen per sentence with `np.argsort`, the K/V caches
reordered by eager JAX ops between steps. Greedy decoding goes through
Trax's `autoregressive_sample`.
"""

import typing

import jax
import numpy as np
from trax import layers as tl
from trax.supervised import decoding

from trax_qkv.data import EOS_ID
from trax_qkv.supervised.decoding import cut_at_eos
from trax_qkv.supervised.decoding import pad_rows
from trax_qkv.supervised.search import length_penalty


class Accelerated(typing.NamedTuple):
  """A predict-mode model jitted on one device, and its initial state."""

  fast: tl.Accelerate
  initial_state: typing.Any


def accelerated(model):
  """`model` as an `Accelerated`, unless it is one already.

  Release 0.3 jitted the model in every call (`tl.Accelerate(model)`), so
  each call compiled it again; an `Accelerated` given instead is reused,
  so that a benchmark times the loop, not the compiler. One device,
  whatever this process has: the predict-mode state is per batch."""
  if isinstance(model, Accelerated):
    return model
  return Accelerated(tl.Accelerate(model, n_devices=1), model.state)


def greedy_decode(
  model, source_ids, batch_size, source_length, max_length, progress=None
):
  """Greedy decoding, `batch_size` sources at a time.

  Args:
    model: from `predict_model(..., batch_size, source_length)`.
    source_ids: lists of token ids (EOS included), none longer than
      `source_length`.
    batch_size, source_length: the shape `model` was prepared for.
    max_length: most tokens decoded per source.
    progress: if given, a `Progress` told of every batch.

  Returns:
    One list of token ids per source, without EOS.
  """
  too_long = [i for i, s in enumerate(source_ids) if len(s) > source_length]
  if too_long:
    raise ValueError(
      f'source {too_long[0]} has {len(source_ids[too_long[0]])}'
      f' tokens; the model was prepared for {source_length}.'
    )
  fast, initial_state = accelerated(model)
  outputs = []
  for start in range(0, len(source_ids), batch_size):
    rows = source_ids[start : start + batch_size]
    batch = pad_rows(rows + [[]] * (batch_size - len(rows)), source_length)
    fast.state = initial_state
    tokens = decoding.autoregressive_sample(
      fast,
      batch,
      batch_size=batch_size,
      temperature=0.0,
      max_length=max_length,
      eos_id=EOS_ID,
      accelerate=False,
    )
    outputs.extend(cut_at_eos(row) for row in np.asarray(tokens)[: len(rows)])
    if progress is not None:
      progress.update()
  return outputs


def _select_beams(candidates, n_beams, vocab_size, step, alpha, finished):
  """One step of beam search for one source.

  `candidates` are the flat (n_beams * vocab_size) scores of every beam
  extended by every token. Candidates ending in EOS go to `finished`
  (normalised by the length penalty); the best `n_beams` others stay alive.
  Returns (scores, parent beams, tokens) of the alive ones.
  """
  scores = np.full(n_beams, -np.inf)
  parents = np.zeros(n_beams, np.int64)
  tokens = np.zeros(n_beams, np.int32)
  alive = 0
  # 2 * n_beams candidates always hold n_beams that do not end in EOS.
  for index in np.argsort(-candidates)[: 2 * n_beams]:
    if not np.isfinite(candidates[index]):
      break
    parent, token = divmod(int(index), vocab_size)
    if token == EOS_ID:
      finished.append(
        (
          candidates[index] / length_penalty(step + 1, alpha),
          candidates[index],
          parent,
        )
      )
    else:
      scores[alive], parents[alive], tokens[alive] = (
        candidates[index],
        parent,
        token,
      )
      alive += 1
      if alive == n_beams:
        break
  return scores, parents, tokens


def _gather_beams(state, order, rows):
  """Each row of every batched state array replaced by row `order[i]`.

  Batched arrays have `rows` or a multiple of it as leading axis (the
  decoder's K/V caches hold rows * heads, batch-major); scalars (cache
  positions) are shared by all rows and stay.
  """

  def gather(x):
    if not np.ndim(x) or x.shape[0] % rows:
      return x
    per_row = x.reshape((rows, x.shape[0] // rows) + x.shape[1:])
    return per_row[order].reshape(x.shape)

  return jax.tree_util.tree_map(gather, state)


def beam_decode(
  model,
  source_ids,
  batch_size,
  source_length,
  n_beams,
  max_length,
  alpha=0.6,
  with_log_probs=False,
  progress=None,
):
  """Beam search, `batch_size` sources (of `n_beams` rows each) at a time.

  Each source runs as `n_beams` rows, and after every step each row's
  predict-mode state (decoder K/V caches) is replaced by its parent
  beam's. A hypothesis ends at EOS and is ranked by log-probability /
  `length_penalty(length, alpha)`; a source is done when no alive beam can
  still beat its best finished one. (Trax's own `beam_search` takes one
  source at a time and ignores EOS.)

  Args:
    model: from `predict_model(..., batch_size * n_beams, source_length)`.
    source_ids: lists of token ids (EOS included).
    batch_size: sources per batch; source_length: their padded length.
    n_beams: beams per source.
    max_length: most tokens decoded per source.
    alpha: GNMT length penalty.
    with_log_probs: also return each hypothesis' log-probability.
    progress: if given, a `Progress` told of every batch.

  Returns:
    Per source, the best hypothesis' token ids without EOS; with
    `with_log_probs`, (ids, the model's log-probability of ids + EOS as
    the search summed it).
  """
  rows = batch_size * n_beams
  fast, initial_state = accelerated(model)
  bound = length_penalty(max_length, alpha)
  outputs = []
  for start in range(0, len(source_ids), batch_size):
    sources = source_ids[start : start + batch_size]
    batch = pad_rows(
      sources + [[]] * (batch_size - len(sources)), source_length
    )
    repeated = np.repeat(batch, n_beams, axis=0)
    fast.state = initial_state
    scores = np.full((batch_size, n_beams), -np.inf)
    scores[:, 0] = 0.0  # all beams start equal: expand only the first
    prefixes = np.zeros((batch_size, n_beams, 0), np.int32)
    finished = [[] for _ in range(batch_size)]  # (score, log-prob, prefix)
    token = np.zeros((rows, 1), np.int32)
    for step in range(max_length):
      logits = np.asarray(fast((repeated, token))[0][:, -1], np.float64)
      log_probs = logits - logits.max(axis=-1, keepdims=True)
      log_probs -= np.log(np.exp(log_probs).sum(axis=-1, keepdims=True))
      vocab_size = log_probs.shape[-1]
      candidates = scores[..., None] + log_probs.reshape(
        batch_size, n_beams, vocab_size
      )
      parents = np.zeros((batch_size, n_beams), np.int64)
      tokens = np.zeros((batch_size, n_beams), np.int32)
      for b in range(batch_size):
        ended = []
        scores[b], parents[b], tokens[b] = _select_beams(
          candidates[b].reshape(-1), n_beams, vocab_size, step, alpha, ended
        )
        finished[b] += [
          (s, log_prob, prefixes[b, p].tolist()) for s, log_prob, p in ended
        ]
      prefixes = np.concatenate(
        [
          np.take_along_axis(prefixes, parents[..., None], axis=1),
          tokens[..., None],
        ],
        axis=2,
      )
      order = (np.arange(batch_size)[:, None] * n_beams + parents).reshape(-1)
      fast.state = _gather_beams(fast.state, order, rows)
      token = tokens.reshape(rows, 1)
      # Log-probabilities only fall as a beam grows, so an alive beam can
      # score at most (its score now) / (the largest length penalty).
      if all(
        finished[b] and max(finished[b])[0] >= scores[b].max() / bound
        for b in range(len(sources))
      ):
        break
    for b in range(len(sources)):
      if finished[b]:
        _, log_prob, ids = max(finished[b], key=lambda f: f[0])
      else:  # max_length reached without EOS: the best alive beam
        best = int(np.argmax(scores[b]))
        log_prob, ids = scores[b, best], prefixes[b, best].tolist()
      outputs.append((ids, float(log_prob)) if with_log_probs else ids)
    if progress is not None:
      progress.update()
  return outputs
