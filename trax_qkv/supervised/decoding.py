"""Decoding a trained translation Transformer: greedy and beam search.

Decoding runs the model in 'predict' mode, in batches of equal shape: every
batch is padded to the same size and source length, so the jitted model
compiles once, and the predict-mode state (encoder output and K/V caches) is
reset to its initial value before each batch -- trax's
`autoregressive_sample` does not reset it, and a second call would silently
reuse the first call's encoder output.
"""

import contextlib

import gin
import jax
import numpy as np
from trax import layers as tl
from trax import shapes
from trax.supervised import decoding

from trax_qkv.data import EOS_ID
from trax_qkv.supervised.progress import Progress


def encode_sources(vocab, sources):
  """Token ids with EOS appended, as the training pipeline makes them."""
  return [vocab.encode(s) + [EOS_ID] for s in sources]


def cut_at_eos(tokens):
  tokens = list(tokens)
  return tokens[: tokens.index(EOS_ID)] if EOS_ID in tokens else tokens


def pad_rows(rows, width):
  """Lists of ids -> int32 (len(rows), width), zero-padded."""
  out = np.zeros((len(rows), width), dtype=np.int32)
  for i, row in enumerate(rows):
    out[i, : len(row)] = row
  return out


# gin scope in which predict_model builds its models (see there).
DECODING_SCOPE = 'trax_qkv_decoding'


def sentences_per_batch(batch_size, n_beams, n_sentences):
  """Sentences decoded at once: `batch_size` greedily; with beam search
  `batch_size // n_beams`, since the model then decodes n_beams rows per
  sentence. At least 1, at most `n_sentences`."""
  per_batch = batch_size if n_beams == 1 else batch_size // n_beams
  return max(1, min(per_batch, n_sentences))


def predict_model(
  model_fn, weights_file, batch_size, source_length, max_length=None
):
  """A predict-mode model loaded from `weights_file` for fixed-shape batches.

  Args:
    model_fn: called as model_fn(mode='predict') -> Trax layer.
    weights_file: a Trax checkpoint (`model.pkl.gz`) or `save_to_file` file.
    batch_size, source_length: the shape every decoding batch will have.
    max_length: the most tokens that will be decoded, if known. It sizes
      the decoder self-attention caches, which Trax makes 2048 positions
      long: every step attends over all of them (masked), and beam search
      copies them when it re-orders beams. Set through a gin binding of
      `max_inference_length` of `trax.layers.CausalAttention` and of
      `trax_qkv.QkvCausalAttention`, scoped to DECODING_SCOPE, so that no
      other model sees it.
  """
  if max_length:
    with gin.unlock_config():  # locked once a trainer has finalized it
      for layer in (
        'trax.layers.CausalAttention',
        'trax_qkv.QkvCausalAttention',
      ):
        gin.bind_parameter(
          f'{DECODING_SCOPE}/{layer}.max_inference_length', max_length
        )
  with gin.config_scope(DECODING_SCOPE if max_length else None):
    model = model_fn(mode='predict')
  signature = shapes.signature(
    (
      np.zeros((batch_size, source_length), np.int32),
      np.zeros((batch_size, 1), np.int32),
    )
  )
  model.init_from_file(
    weights_file, weights_only=True, input_signature=signature
  )
  return model


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
  # Jitted once, reused for every batch; on one device, whatever this
  # process has (the predict-mode state is per batch, not per device).
  fast = tl.Accelerate(model, n_devices=1)
  initial_state = model.state
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


def length_penalty(length, alpha):
  """GNMT's ((5 + length) / 6) ** alpha; alpha 0 ranks by log-probability."""
  return ((5.0 + length) / 6.0) ** alpha


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
  fast = tl.Accelerate(model, n_devices=1)  # as in greedy_decode
  initial_state = model.state
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


def decode(
  model_fn,
  weights_file,
  source_ids,
  n_beams=1,
  alpha=0.6,
  batch_size=32,
  max_length=None,
  source_length=None,
  description='decoding',
  log=None,
):
  """Decodes `source_ids` with the model of `weights_file`: the one
  sequence that trax-qkv-translate and the main job run.

  Args:
    model_fn: called as model_fn(mode='predict') -> Trax layer.
    weights_file: the model's checkpoint (`model.pkl.gz`).
    source_ids: lists of token ids, EOS included (`encode_sources`).
    n_beams: 1 decodes greedily; more runs `beam_decode` with this many.
    alpha: GNMT length penalty of beam search.
    batch_size: rows decoded at once; beam search takes
      `batch_size // n_beams` sentences at a time (`sentences_per_batch`).
    max_length: most tokens decoded per sentence.
    source_length: the length every batch is padded to (default: the
      longest source), so the model compiles once.
    description, log: if `log` is given, a progress bar (or lines) named
      `description` goes to it.

  Returns:
    One list of token ids (no EOS) per source.
  """
  source_length = source_length or max(len(s) for s in source_ids)
  batch = sentences_per_batch(batch_size, n_beams, len(source_ids))
  model = predict_model(
    model_fn, weights_file, batch * n_beams, source_length, max_length
  )
  n_batches = -(-len(source_ids) // batch)
  with (
    Progress(n_batches, description, log) if log else contextlib.nullcontext()
  ) as progress:
    if n_beams == 1:
      return greedy_decode(
        model, source_ids, batch, source_length, max_length, progress=progress
      )
    return beam_decode(
      model,
      source_ids,
      batch,
      source_length,
      n_beams,
      max_length,
      alpha=alpha,
      progress=progress,
    )
