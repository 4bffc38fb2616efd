"""How different a layer's attention heads are, and how focused each is.

For one layer's attention weights over a batch of sentences, each target
position of each head is a distribution over the source positions. Three
numbers summarize them, in bits, averaged over every real (unpadded)
target position of every sentence:

  divergence  the mean Jensen-Shannon divergence between the distributions
              of two heads at the same position, over all pairs of heads:
              0 when the heads attend alike, 1 when they attend to
              disjoint positions. None with a single head.
  entropy     the mean entropy of a head's distribution: 0 when all its
              mass is on one source position, log2(source length) when it
              is spread evenly.
  peak        the mean largest weight: the share of the mass on the one
              position a head attends to most.
  agreement   the share of (pair of heads, position) whose most-weighted
              source position is the same: 1 when heads point alike, about
              1 / source length for heads that point independently. Unlike
              the divergence it is not bounded by the entropy, so broad
              heads that still point apart score low. None with one head.

Voita et al. (2019) and Michel et al. (2019) study heads with measures of
this kind; these are the plain ones, computed the same way for every
model (docs/why_three_dense.md).
"""

import itertools

import numpy as np


def _entropy_bits(p):
  with np.errstate(divide='ignore', invalid='ignore'):
    return -np.sum(np.where(p > 0, p * np.log2(p), 0.0), axis=-1)


def js_divergence(p, q):
  """Jensen-Shannon divergence in bits between distributions along the
  last axis of `p` and `q` (same shape); 0 to 1."""
  m = (p + q) / 2
  return _entropy_bits(m) - (_entropy_bits(p) + _entropy_bits(q)) / 2


def layer_measures(weights, source_lengths, target_lengths):
  """The divergence, entropy and peak of one layer (see the module doc).

  Args:
    weights: (batch, heads, Lq, Lk) attention weights, as
      `attention_maps.CrossAttentionReader` reads them; rows beyond a
      sentence's lengths are padding.
    source_lengths: per sentence, how many of the Lk positions are real.
    target_lengths: per sentence, how many of the Lq positions are real.

  Returns:
    A dict with 'divergence' and 'agreement' (None for one head),
    'entropy' and 'peak', floats averaged over all real rows.

  Raises:
    ValueError: weights is not 4-D, or the lengths do not fit it.
  """
  weights = np.asarray(weights, np.float64)
  if weights.ndim != 4:
    raise ValueError(
      f'weights must be (batch, heads, Lq, Lk); got shape {weights.shape}.'
    )
  batch, _, lq, lk = weights.shape
  for name, lengths, limit in (
    ('source_lengths', source_lengths, lk),
    ('target_lengths', target_lengths, lq),
  ):
    if len(lengths) != batch or not all(0 < n <= limit for n in lengths):
      raise ValueError(
        f'{name} must give 1..{limit} for each of the {batch} sentences; '
        f'got {list(lengths)}.'
      )
  divergences, agreements, entropies, peaks = [], [], [], []
  for w, n_src, n_tgt in zip(weights, source_lengths, target_lengths):
    rows = w[:, :n_tgt, :n_src]
    # Padding gets (almost) no weight; renormalize what is left.
    rows = rows / np.sum(rows, axis=-1, keepdims=True)
    entropies.append(_entropy_bits(rows).ravel())
    peaks.append(np.max(rows, axis=-1).ravel())
    divergences += _pairs(rows, js_divergence)
    agreements += _pairs(rows, _same_argmax)
  return dict(
    divergence=_mean(divergences),
    agreement=_mean(agreements),
    entropy=_mean(entropies),
    peak=_mean(peaks),
  )


def _same_argmax(p, q):
  return (np.argmax(p, axis=-1) == np.argmax(q, axis=-1)).astype(np.float64)


def _same_argmax_off_self(p, q):
  """Over the query rows where neither head peaks on the row's own
  position (self-attention, row i against key i), 1 where the two peak
  on the same key: agreement that a shared diagonal does not make."""
  p_max, q_max = np.argmax(p, axis=-1), np.argmax(q, axis=-1)
  own = np.arange(p.shape[-2])
  off_self = (p_max != own) & (q_max != own)
  return (p_max == q_max)[off_self].astype(np.float64)


def _pairs(rows, measure):
  """`measure` of each pair of heads of (heads, ..., Lk) `rows`."""
  return [
    np.ravel(measure(rows[a], rows[b]))
    for a, b in itertools.combinations(range(len(rows)), 2)
  ]


def _mean(parts):
  """The mean of every value of `parts`; None where there is none."""
  values = np.concatenate(parts) if parts else np.zeros(0)
  return float(np.mean(values)) if values.size else None


def measures(layers, source_lengths, target_lengths):
  """`layer_measures` of each layer's weights: a dict of per-layer lists
  ('divergence', 'agreement', 'entropy', 'peak')."""
  per_layer = [
    layer_measures(w, source_lengths, target_lengths) for w in layers
  ]
  return {key: [m[key] for m in per_layer] for key in per_layer[0]}


def model_measures(reader, source_ids, target_ids, batch_size=50):
  """`measures` of a model's cross-attention over many sentence pairs.

  Args:
    reader: an `attention_maps.CrossAttentionReader` of the model.
    source_ids, target_ids: the sentences' id lists (EOS included), the
      targets teacher-forced.
    batch_size: sentences read at a time.

  Returns:
    A dict of per-layer lists, as `measures`, averaged over all sentences
    (each batch weighted by its number of target positions).
  """
  per_batch, rows = [], []
  for start in range(0, len(source_ids), batch_size):
    src = source_ids[start : start + batch_size]
    tgt = target_ids[start : start + batch_size]
    lengths = [len(s) for s in src], [len(t) for t in tgt]
    per_batch.append(measures(reader(src, tgt), *lengths))
    rows.append(sum(lengths[1]))
  return {
    key: [
      None if values[0] is None else float(np.average(values, weights=rows))
      for values in zip(*(batch[key] for batch in per_batch))
    ]
    for key in per_batch[0]
  }


def softmax_rows(scores, causal):
  """The attention weights of (..., n, n) `scores`: each row's softmax over
  the keys it sees (with `causal`, keys 0..i only)."""
  n = scores.shape[-1]
  if causal:
    scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
  a = np.exp(scores - scores.max(axis=-1, keepdims=True))
  return a / a.sum(axis=-1, keepdims=True)


def score_measures(q, k, lengths, causal):
  """What the mathematics of docs/why_three_dense.md predicts of one
  self-attention layer, from its queries and keys.

  Args:
    q, k: (batch, heads, L, d_head) projected queries and keys, as the
      layer's kernel gets them; positions beyond a sentence's length are
      padding.
    lengths: per sentence, how many of the L positions are real.
    causal: whether position i attends to positions 0..i only.

  Returns:
    A dict of floats: 'diagonal', the mean weight a position puts on
    itself (over every real position of every head; with `causal`, 1 at
    position 0 by construction); 'asymmetry', ‖S − Sᵀ‖ / ‖S‖ (Frobenius)
    of the scores S = q kᵀ / √d_head over the real positions, before any
    mask, averaged over sentences and heads: 0 for a symmetric score;
    'entropy' and 'agreement' of the attention weights, as
    `layer_measures` computes them (agreement None for one head);
    'agreement_off_self', the agreement over only the (pair of heads,
    position) where neither head peaks on the position itself: heads
    that each peak on the token itself agree for that reason alone
    (None for one head, or where no such position is left).
  """
  q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
  if q.ndim != 4 or q.shape != k.shape or len(lengths) != q.shape[0]:
    raise ValueError(
      'q and k must be (batch, heads, L, d_head) of one shape, with a '
      f'length per sentence; got {q.shape}, {k.shape}, {list(lengths)}.'
    )
  diagonals, asymmetries, entropies, agreements, off_self = [], [], [], [], []
  for qs, ks, n in zip(q, k, lengths, strict=True):
    s = qs[:, :n] @ np.swapaxes(ks[:, :n], -1, -2) / np.sqrt(q.shape[-1])
    norms = np.linalg.norm(s, axis=(-2, -1))
    skew = np.linalg.norm(s - np.swapaxes(s, -1, -2), axis=(-2, -1))
    asymmetries.append(
      np.divide(skew, norms, out=np.zeros_like(skew), where=norms > 0)
    )
    a = softmax_rows(s, causal)
    diagonals.append(np.diagonal(a, axis1=-2, axis2=-1).ravel())
    entropies.append(_entropy_bits(a).ravel())
    agreements += _pairs(a, _same_argmax)
    off_self += _pairs(a, _same_argmax_off_self)
  return dict(
    diagonal=_mean(diagonals),
    asymmetry=_mean(asymmetries),
    entropy=_mean(entropies),
    agreement=_mean(agreements),
    agreement_off_self=_mean(off_self),
  )
