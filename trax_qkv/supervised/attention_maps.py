"""What a trained translation model's cross-attention heads look at.

Runs the model in 'viz' mode, teacher-forcing a target, and reads the
attention weights that each cross-attention layer's PureAttention keeps
as its state there (the built-in's does the same).
"""

import contextlib
import dataclasses

import jax
import numpy as np
from trax import shapes

from trax_qkv import kernels
from trax_qkv.data import EOS_ID
from trax_qkv.models import registry
from trax_qkv.supervised import decoding
from trax_qkv.supervised import model_dir as model_dir_lib
from trax_qkv.supervised import translation


class CrossAttentionReader:
  """A 'viz'-mode model whose checkpoint is read once, for many sentences.

  The model runs as one compiled program per shape of the padded (source,
  target) batch, kept as the decoder keeps its searches; sources and
  targets are padded to the decoder's length buckets, so that few shapes
  (and programs) serve all sentences. A sentence of a shape seen before
  costs one forward pass, not a re-initialization (docs/serving.md).

  A Transformer's encoder self-attention also contains a PureAttention
  and comes first in the layer tree; decoder causal attention does not,
  so the last `n_layers` (`model_dir.cross_attention_layers`) are the
  cross-attention ones.
  """

  def __init__(self, model_fn, weights_file, n_layers, max_len=None):
    """`max_len`: the model's longest input (settings['max_len']), the
    most a bucket pads to."""
    self._model = model_fn(mode='viz')
    self._weights_file, self._n_layers = weights_file, n_layers
    self._max_len = max_len
    self._weights = None
    self._states = {}  # input shapes -> the state `init` makes for them
    # 'viz' mode drops nothing. The key is made when traced, not at import:
    # that would start JAX's backend before jax.distributed could.
    self._forward = jax.jit(
      lambda x, weights, state: self._model.pure_fn(
        x, weights, state, jax.random.PRNGKey(0)
      )[1]
    )

  def __call__(self, source_ids, target_ids):
    """Per cross-attention layer, (batch, heads, Lq, Lk) weights of
    the (source, target) id lists, Lq and Lk the longest's lengths."""
    model = self._model
    n_src = max(len(s) for s in source_ids)
    n_tgt = max(len(t) for t in target_ids)
    src = decoding.pad_rows(
      source_ids, decoding.bucket_length(n_src, self._max_len)
    )
    tgt = decoding.pad_rows(
      target_ids, decoding.bucket_length(n_tgt, self._max_len)
    )
    key = (src.shape, tgt.shape)
    if self._weights is None:
      model.init_from_file(
        self._weights_file,
        weights_only=True,
        input_signature=shapes.signature((src, tgt)),
      )
      self._weights = model.weights
      self._states[key] = model.state
    elif key not in self._states:
      # init sets the state's shapes; the weights stay the checkpoint's.
      model.init(shapes.signature((src, tgt)))
      model.weights = self._weights
      self._states[key] = model.state
    # The viz-mode state after the pass holds each PureAttention's weights.
    model.state = self._forward((src, tgt), self._weights, self._states[key])
    found = [
      np.asarray(layer.state)
      for layer in registry.walk(model)
      if type(layer).__name__ == 'PureAttention'
    ]
    return [w[..., :n_tgt, :n_src] for w in found[-self._n_layers :]]


def cross_attention_weights(
  model_fn, weights_file, source_ids, target_ids, n_layers, max_len=None
):
  """Per cross-attention layer, (batch, heads, Lq, Lk) weights
  (`CrossAttentionReader`, read once)."""
  reader = CrossAttentionReader(model_fn, weights_file, n_layers, max_len)
  return reader(source_ids, target_ids)


@contextlib.contextmanager
def captured_queries_and_keys():
  """Within the block, JAX runs eagerly and every attention that runs
  trax_qkv's 'reference' kernel (its layers' default, the variants') adds
  (kind, q, k) to the list it yields, in the order the model calls them:
  'attend' with (batch, heads, L, d_head) queries and keys, or 'causal'
  (causal self-attention) with (batch * heads, L, d_head) ones."""
  original = kernels.KERNELS[kernels.REFERENCE]
  calls = []

  def heads(x, n_heads):
    b, length, d = x.shape
    return (
      np.asarray(x).reshape(b, length, n_heads, d // n_heads).swapaxes(1, 2)
    )

  def attend(q, k, v, mask, n_heads, **dropout):
    calls.append(('attend', heads(q, n_heads), heads(k, n_heads)))
    return original.attend(q, k, v, mask, n_heads, **dropout)

  def causal(q, k, v, **dropout):
    calls.append(('causal', np.asarray(q), np.asarray(k)))
    return original.causal(q, k, v, **dropout)

  kernels.KERNELS[kernels.REFERENCE] = dataclasses.replace(
    original, attend=attend, causal=causal
  )
  try:
    with jax.disable_jit():
      yield calls
  finally:
    kernels.KERNELS[kernels.REFERENCE] = original


def self_attention_scores(model_fn, weights_file, source_ids, target_ids):
  """`head_measures.score_measures` of a Transformer's encoder and decoder
  self-attention layers, teacher-forcing `target_ids`: {'encoder': ...,
  'decoder': ...}, each a dict of per-layer lists. `model_fn` must build
  every self-attention site with the 'reference' kernel (as
  `model_dir.model_fn(settings, measured_attention(settings))` does)."""
  from trax_qkv.supervised import head_measures

  src = decoding.pad_rows(source_ids, max(map(len, source_ids)))
  tgt = decoding.pad_rows(target_ids, max(map(len, target_ids)))
  model = model_fn(mode='eval')
  model.init_from_file(
    weights_file,
    weights_only=True,
    input_signature=shapes.signature((src, tgt)),
  )
  with captured_queries_and_keys() as calls:
    model((src, tgt))
  causal = [(q, k) for kind, q, k in calls if kind == 'causal']
  # The encoder's layers run first; then each decoder layer's causal
  # self-attention and cross-attention.
  encoder = [(q, k) for kind, q, k in calls if kind == 'attend']
  encoder = encoder[: len(encoder) - len(causal)]
  # The causal kernel gets (batch * heads, L, d_head): split the batch.
  decoder = [
    tuple(x.reshape(len(src), -1, *x.shape[1:]) for x in qk) for qk in causal
  ]
  result = {}
  for part, layers, lengths, is_causal in (
    ('encoder', encoder, [len(s) for s in source_ids], False),
    ('decoder', decoder, [len(t) for t in target_ids], True),
  ):
    measured = [
      head_measures.score_measures(q, k, lengths, is_causal) for q, k in layers
    ]
    result[part] = {key: [m[key] for m in measured] for key in measured[0]}
  return result


def measured_attention(settings):
  """{site: implementation} that measures the model of `settings` with the
  'reference' kernel where it ran a kernel or Trax's layer (the same
  weights and math; a variant stays itself)."""
  return {
    site: 'reference'
    if name == registry.BUILTIN or name in kernels.names()
    else name
    for site, name in settings[model_dir_lib.ATTENTION].items()
  }


def token_pieces(vocab, ids):
  """The subword of each id, for axis labels ('<eos>' for EOS)."""
  return [vocab.decode([i]) if i != EOS_ID else '<eos>' for i in ids]


def for_sentence(model_dir, source, target=None, attention=None):
  """The cross-attention of the model in `model_dir` for one sentence.

  Args:
    model_dir: a directory written by trax-qkv-validate or trax-qkv-train.
    source: the source sentence.
    target: the target to teacher-force (default: the model's greedy
      translation).
    attention: {site: implementation} to run instead of what the model was
      trained with ('viz' mode runs the reference math in trax_qkv's
      layers either way).

  Returns:
    (source tokens, target tokens, per cross-attention layer (heads, Lq, Lk)
    weights, target text).
  """
  if not source.strip():
    raise ValueError('source must be a non-empty sentence.')
  registry.check_attention(attention)
  model = model_dir_lib.load(model_dir)
  model_fn = model_dir_lib.model_fn(model.settings, attention)
  source_ids = decoding.encode_sources(model.vocab, [source])[0]
  translation.check_sources_fit([source_ids], model.settings, [1])
  translation.check_checkpoint(model, model_fn)
  if target is None:
    target_ids = translation.translate_ids(
      model, [source], attention=attention
    )[0] + [EOS_ID]
    target = model.vocab.decode(target_ids[:-1])
  else:
    target_ids = encode_target(model.vocab, target, model.settings)
  reader = CrossAttentionReader(
    model_fn,
    model.checkpoint,
    model_dir_lib.cross_attention_layers(model.settings),
    model.settings['max_len'],
  )
  return one_map(reader, model.vocab, source_ids, target_ids) + (target,)


def encode_target(vocab, target, settings):
  """The ids of a target sentence to teacher-force, EOS included;
  ValueError if the model has no positions for them."""
  target_ids = vocab.encode(target) + [EOS_ID]
  if len(target_ids) > settings['max_len']:
    raise ValueError(
      f'target has {len(target_ids)} subwords with EOS; the '
      f'model takes at most {settings["max_len"]} (its '
      'max_len).'
    )
  return target_ids


def one_map(reader, vocab, source_ids, target_ids):
  """(source tokens, target tokens, per cross-attention layer (heads, Lq, Lk)
  weights) of one sentence pair, by a `CrossAttentionReader`."""
  layers = reader([source_ids], [target_ids])
  return (
    token_pieces(vocab, source_ids),
    token_pieces(vocab, target_ids),
    [w[0] for w in layers],
  )
