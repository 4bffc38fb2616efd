"""What a trained Transformer's cross-attention heads look at.

Runs the model in 'viz' mode, teacher-forcing a target, and reads the
attention weights that each decoder layer's PureAttention keeps as its
state there (the built-in's does the same).
"""

import numpy as np
from trax import shapes

from trax_qkv.data import EOS_ID
from trax_qkv.models import registry
from trax_qkv.supervised import decoding
from trax_qkv.supervised import model_dir as model_dir_lib
from trax_qkv.supervised import translation


def cross_attention_weights(
  model_fn, weights_file, source_ids, target_ids, n_decoder_layers
):
  """Per decoder layer, (batch, heads, Lq, Lk) cross-attention weights.

  Encoder self-attention also contains a PureAttention and comes first in
  the layer tree; decoder causal attention does not, so the last
  `n_decoder_layers` are the cross-attention ones.
  """
  model = model_fn(mode='viz')
  src = decoding.pad_rows(source_ids, max(len(s) for s in source_ids))
  tgt = decoding.pad_rows(target_ids, max(len(t) for t in target_ids))
  model.init_from_file(
    weights_file,
    weights_only=True,
    input_signature=shapes.signature((src, tgt)),
  )
  model((src, tgt))
  found = []

  def walk(layer):
    if type(layer).__name__ == 'PureAttention':
      found.append(np.asarray(layer.state))
    for sub in layer.sublayers:
      walk(sub)

  walk(model)
  return found[-n_decoder_layers:]


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
    (source tokens, target tokens, per decoder layer (heads, Lq, Lk)
    weights, target text).
  """
  if not source.strip():
    raise ValueError('source must be a non-empty sentence.')
  registry.check_attention(attention)
  model = model_dir_lib.load(model_dir)
  model_fn = model_dir_lib.transformer_fn(model.settings, attention)
  source_ids = decoding.encode_sources(model.vocab, [source])[0]
  translation.check_sources_fit([source_ids], model.settings, [1])
  translation.check_checkpoint(model, model_fn)
  if target is None:
    target_ids = translation.translate_ids(
      model, [source], attention=attention
    )[0] + [EOS_ID]
    target = model.vocab.decode(target_ids[:-1])
  else:
    target_ids = model.vocab.encode(target) + [EOS_ID]
  if len(target_ids) > model.settings['max_len']:
    raise ValueError(
      f'target has {len(target_ids)} subwords with EOS; the '
      f'model takes at most {model.settings["max_len"]} (its '
      'max_len).'
    )
  layers = cross_attention_weights(
    model_fn,
    model.checkpoint,
    [source_ids],
    [target_ids],
    model.settings['n_decoder_layers'],
  )
  return (
    token_pieces(model.vocab, source_ids),
    token_pieces(model.vocab, target_ids),
    [w[0] for w in layers],
    target,
  )
