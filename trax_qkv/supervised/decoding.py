"""Decoding a trained translation Transformer: greedy and beam search.

A `Decoder` runs the model in 'predict' mode as one compiled program per
batch shape (`search.greedy_search` / `search.beam_search` under
`jax.jit`): the predict-mode state (encoder output, K/V caches) starts
from its initial value in every call -- trax's `autoregressive_sample`
keeps it between calls -- and stays on the device until the batch is
done. Sources are sorted by length and padded to a few bucket lengths, so
a file of any size compiles a handful of programs; results come back in
input order.
"""

import contextlib
import functools

import gin
import jax
import jax.numpy as jnp
import numpy as np
from trax import shapes

from trax_qkv.data import EOS_ID
from trax_qkv.supervised import search
from trax_qkv.supervised.progress import Progress


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


def predict_model(
  model_fn, weights_file, batch_size, source_length, max_length=None
):
  """A predict-mode model loaded from `weights_file` for fixed-shape batches.

  Args:
    model_fn: called as model_fn(mode='predict') -> Trax layer.
    weights_file: a Trax checkpoint (`model.pkl.gz`) or `save_to_file` file.
    batch_size, source_length: the shape of the batches it starts with.
    max_length: the most tokens that will be decoded, if known. It sizes
      the decoder self-attention caches, which Trax makes 2048 positions
      long: every step attends over all of them (masked), and beam search
      copies them when it re-orders beams. Set through a gin binding of
      `max_inference_length` of `trax.layers.CausalAttention` and of
      `trax_qkv.QkvCausalAttention`, scoped to DECODING_SCOPE, so that no
      other model sees it.
  """
  model = _predict_layer(model_fn, max_length)
  model.init_from_file(
    weights_file,
    weights_only=True,
    input_signature=_signature(batch_size, source_length),
  )
  return model


def _predict_layer(model_fn, max_length):
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
    return model_fn(mode='predict')


def _signature(rows, source_length):
  return shapes.signature(
    (np.zeros((rows, source_length), np.int32), np.zeros((rows, 1), np.int32))
  )


def bucket_length(length, limit=None):
  """The padded source length of a batch whose longest source has `length`
  tokens: the next of 8, 12, 16, 24, 32, 48, 64, ... (each a half or a
  third above the last), at most `limit`. Few lengths mean few compiled
  programs; close ones mean little padding."""
  bucket = 8
  while bucket < length:
    bucket = bucket * 3 // 2 if bucket & (bucket - 1) == 0 else bucket * 4 // 3
  return max(length, min(bucket, limit or bucket))


# A shorter bucket is worth its own program only over many batches:
# compiling one costs as much as the padding of a few hundred batches
# (measured in docs/decoding.md).
MIN_BATCHES_PER_BUCKET = 256


def n_batches(n_sentences, batch_size):
  """How many batches `Decoder.decode` makes of `n_sentences`."""
  return -(-n_sentences // batch_size)


def batch_rows(n_sentences, batch_size):
  """Sentences per batch: as many batches as `batch_size` needs, all of
  one size (one program), as even as can be -- 100 sentences at
  batch_size 32 run as 4 batches of 25, not 32, 32, 32 and 4 padded to
  32. A further program would cost more than a few empty rows."""
  return -(-n_sentences // n_batches(n_sentences, batch_size))


def plan_batches(lengths, batch_size, limit=None):
  """[(indices, padded source length)]: the sources (by their `lengths`)
  sorted longest first into batches of `batch_rows`, each padded to the
  `bucket_length` of its longest source, at most `limit`. A length
  shorter than the previous batch's starts only where
  MIN_BATCHES_PER_BUCKET batches or more remain (all as short or
  shorter): the last ones share one length, and an input of fewer
  batches than that is padded to its longest source's bucket, one
  program."""
  order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
  rows = batch_rows(len(order), batch_size)
  batches = [order[i : i + rows] for i in range(0, len(order), rows)]
  plan, current = [], None
  for i, batch in enumerate(batches):
    if current is None or len(batches) - i >= MIN_BATCHES_PER_BUCKET:
      current = bucket_length(lengths[batch[0]], limit)
    plan.append((batch, current))
  return plan


class Decoder:
  """Greedy decoding or beam search with one model, compiled per shape.

  Each batch shape -- (sentences, padded source length, max_length) --
  compiles one program (`search.greedy_search` or `search.beam_search`
  under `jax.jit`), reused by every later batch of that shape.

  Attributes:
    compilations: how many programs were traced and compiled so far.
  """

  def __init__(self, model_fn, weights_file, n_beams=1, alpha=0.6):
    """
    Args:
      model_fn: called as model_fn(mode='predict') -> Trax layer.
      weights_file: the model's checkpoint (`model.pkl.gz`), read once.
      n_beams: 1 decodes greedily; more runs beam search with this many.
      alpha: GNMT length penalty of beam search.
    """
    self.model_fn, self.weights_file = model_fn, weights_file
    self.n_beams, self.alpha = n_beams, alpha
    self.compilations = 0
    self._weights = None
    self._models = {}  # max_length -> (predict-mode model, jitted search)
    self._states = {}  # (max_length, rows, source length) -> initial state

  def with_search(self, n_beams, alpha):
    """A Decoder of the same model that searches with other settings,
    sharing the weights once they are read; its programs are its own."""
    other = Decoder(self.model_fn, self.weights_file, n_beams, alpha)
    other._weights = self._weights
    return other

  def _prepared(self, max_length, rows, source_length):
    """(model, program, initial state) for this batch shape. The model's
    decoder caches hold `max_length` positions (`predict_model`)."""
    if max_length not in self._models:
      if self._weights is None:  # the first model reads the checkpoint
        model = predict_model(
          self.model_fn, self.weights_file, rows, source_length, max_length
        )
        self._weights = model.weights
        self._states[max_length, rows, source_length] = model.state
      else:
        model = _predict_layer(self.model_fn, max_length)
      program = jax.jit(functools.partial(self._search, model, max_length))
      self._models[max_length] = model, program
    model, program = self._models[max_length]
    key = (max_length, rows, source_length)
    if key not in self._states:  # init sets the state's shapes
      self._states[key] = model.init(_signature(rows, source_length))[1]
    return model, program, self._states[key]

  def _search(self, model, max_length, weights, state, rng, sources, active):
    self.compilations += 1  # runs once per trace, i.e. per compilation

    def step(state, tokens):
      # One row per source, or (beam search after its first step) n_beams.
      beams = tokens.shape[0] // sources.shape[0]
      inputs = (jnp.repeat(sources, beams, axis=0), tokens)
      outputs, state = model.pure_fn(inputs, weights, state, rng)
      return outputs[0], state

    if self.n_beams == 1:
      return search.greedy_search(step, state, max_length, EOS_ID, active)
    return search.beam_search(
      step, state, self.n_beams, max_length, EOS_ID, self.alpha, active
    )

  def decode_batch(self, batch, n_real, max_length, with_log_probs=False):
    """Hypotheses (ids without EOS) of the first `n_real` rows of `batch`,
    an int32 (sentences, source length) array of padded sources, at most
    `max_length` tokens each. With `with_log_probs` (beam search only),
    (ids, the model's log-probability of ids + EOS as the search summed
    it) instead."""
    model, program, state = self._prepared(max_length, *batch.shape)
    active = np.arange(len(batch)) < n_real
    result = program(self._weights, state, model.rng, batch, active)
    if self.n_beams == 1:
      return [cut_at_eos(row) for row in np.asarray(result)[:n_real]]
    tokens, lengths, log_probs = (np.asarray(x) for x in result)
    ids = [tokens[i, : lengths[i]].tolist() for i in range(n_real)]
    if with_log_probs:
      return list(zip(ids, log_probs[:n_real].astype(float).tolist()))
    return ids

  def decode(
    self, source_ids, batch_size, max_length, source_length=None,
    with_log_probs=False, description='decoding', log=None,
  ):  # fmt: skip
    """One hypothesis per source, in order (see `decode_batch`), in the
    batches of `plan_batches` (padded source length at most
    `source_length`). If `log` is given, a progress bar (or lines) named
    `description` goes to it."""
    lengths = [len(s) for s in source_ids]
    rows = batch_rows(len(source_ids), batch_size)
    plan = plan_batches(lengths, batch_size, source_length)
    out = [None] * len(source_ids)
    with (
      Progress(len(plan), description, log) if log else contextlib.nullcontext()
    ) as progress:
      for chosen, length in plan:
        batch = pad_rows(
          [source_ids[i] for i in chosen] + [[]] * (rows - len(chosen)), length
        )
        decoded = self.decode_batch(
          batch, len(chosen), max_length, with_log_probs
        )
        for i, hypothesis in zip(chosen, decoded):
          out[i] = hypothesis
        if progress is not None:
          progress.update()
    return out


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
  """Decodes `source_ids` with the model of `weights_file` in one call of
  a new `Decoder` (the main job's test decodes).

  Args:
    model_fn: called as model_fn(mode='predict') -> Trax layer.
    weights_file: the model's checkpoint (`model.pkl.gz`).
    source_ids: lists of token ids, EOS included
      (`trax_qkv.data.encode_with_eos`).
    n_beams: 1 decodes greedily; more runs beam search with this many.
    alpha: GNMT length penalty of beam search.
    batch_size: sentences decoded at once (beam search runs n_beams rows
      for each).
    max_length: most tokens decoded per sentence.
    source_length: the longest a batch is padded to (default: the longest
      source); batches are padded to `bucket_length` within it.
    description, log: as for `Decoder.decode`.

  Returns:
    One list of token ids (no EOS) per source.
  """
  return Decoder(model_fn, weights_file, n_beams, alpha).decode(
    source_ids,
    batch_size,
    max_length,
    source_length or max(len(s) for s in source_ids),
    description=description,
    log=log,
  )
