"""The scores a trained Transformer's self-attention computes, per site.

The model runs eagerly with the 'reference' kernel (the same weights and
math as the kernel or Trax's layer it was trained with) and each call of
the kernel hands over its queries and keys; `registry.attention_sites`
says which site made each call. `head_measures.score_measures` reads
them: a position's weight on itself, argmax agreement between heads;
`sentence_attention` gives one sentence's weights, to draw.
"""

import contextlib
import dataclasses

import jax
import numpy as np
from trax import shapes

from trax_qkv import kernels
from trax_qkv.models import registry
from trax_qkv.research import head_measures
from trax_qkv.supervised import decoding
from trax_qkv.supervised import model_dir as model_dir_lib


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


def _queries_and_keys(model_fn, weights_file, source_ids, target_ids):
  """([(q, k)] of the encoder's self-attention layers, [(q, k)] of the
  decoder's), each (batch, heads, L, d_head), teacher-forcing
  `target_ids`; `model_fn` as `self_attention_scores` takes it."""
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
  # A Transformer runs its attention layers in the tree's order; a site
  # left to Trax's own layer calls no kernel of ours.
  sites = [
    site
    for site, layer in registry.attention_sites(model)
    if any(
      type(part).__module__.startswith('trax_qkv.')
      for part in registry.walk(layer)
    )
  ]
  kinds = [
    'causal' if s == registry.CAUSAL_ATTENTION else 'attend' for s in sites
  ]
  if [kind for kind, _, _ in calls] != kinds:
    raise ValueError(
      f"each of trax_qkv's attention layers must run the reference kernel "
      f'once: sites {sites}, kernel calls {[kind for kind, _, _ in calls]}.'
    )
  encoder = [
    (q, k)
    for site, (_, q, k) in zip(sites, calls)
    if site == registry.SELF_ATTENTION
  ]
  # The causal kernel gets (batch * heads, L, d_head): split the batch.
  decoder = [
    tuple(x.reshape(len(src), -1, *x.shape[1:]) for x in (q, k))
    for site, (_, q, k) in zip(sites, calls)
    if site == registry.CAUSAL_ATTENTION
  ]
  return encoder, decoder


def self_attention_scores(model_fn, weights_file, source_ids, target_ids):
  """`head_measures.score_measures` of a Transformer's encoder and decoder
  self-attention layers, teacher-forcing `target_ids`: {'encoder': ...,
  'decoder': ...}, each a dict of per-layer lists. `model_fn` must build
  every self-attention site with the 'reference' kernel (as
  `model_dir.model_fn(settings, measured_attention(settings))` does)."""
  encoder, decoder = _queries_and_keys(
    model_fn, weights_file, source_ids, target_ids
  )
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


def sentence_attention(model_fn, weights_file, source_ids, target_ids):
  """One sentence's encoder self-attention weights, as the model computes
  them: per layer, (heads, L, L) (rows: the positions reading, columns:
  the positions read); `model_fn` as `self_attention_scores` takes it."""
  encoder, _ = _queries_and_keys(
    model_fn, weights_file, [source_ids], [target_ids]
  )
  weights = []
  for q, k in encoder:
    q, k = np.asarray(q[0], np.float64), np.asarray(k[0], np.float64)
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    weights.append(head_measures.softmax_rows(scores, causal=False))
  return weights


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
