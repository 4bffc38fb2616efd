"""What a trained translation model's cross-attention heads look at.

Runs the model in 'viz' mode, teacher-forcing a target, and reads the
attention weights that each cross-attention layer's PureAttention keeps
as its state there (the built-in's does the same).
"""

import jax
import numpy as np
from trax import shapes

from trax_qkv import data as data_lib
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

  The cross-attention layers are those the model's cross-attention site
  built (`registry.attention_sites`); each holds one PureAttention.
  """

  def __init__(self, model_fn, weights_file, max_len=None):
    """`max_len`: the model's longest input (settings['max_len']), the
    most a bucket pads to."""
    self._model = model_fn(mode='viz')
    self._weights_file = weights_file
    self._cores = [
      core
      for site, layer in registry.attention_sites(self._model)
      if site == registry.CROSS_ATTENTION
      for core in registry.walk(layer)
      if type(core).__name__ == 'PureAttention'
    ]
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
    return [np.asarray(core.state)[..., :n_tgt, :n_src] for core in self._cores]


def cross_attention_weights(
  model_fn, weights_file, source_ids, target_ids, max_len=None
):
  """Per cross-attention layer, (batch, heads, Lq, Lk) weights
  (`CrossAttentionReader`, read once)."""
  reader = CrossAttentionReader(model_fn, weights_file, max_len)
  return reader(source_ids, target_ids)


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
  source_ids = data_lib.encode_with_eos(model.vocab, [source])[0]
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
    model_fn, model.checkpoint, model.settings['max_len']
  )
  return one_map(reader, model.vocab, source_ids, target_ids) + (target,)


def encode_target(vocab, target, settings):
  """The ids of a target sentence to teacher-force, EOS included;
  ValueError if the model has no positions for them."""
  target_ids = data_lib.encode_with_eos(vocab, [target])[0]
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
