"""Which attention the layers of trax.models' Transformer family use.

Trax builds cross-attention in `trax.models.transformer._EncoderDecoderBlock`
by calling `tl.AttentionQKV(d_model, n_heads=..., dropout=..., mode=...,
cache_KV_in_predict=True)`, looked up when the model is built.
`trax_qkv.patches` makes that name `EncoderDecoderAttention` below: a
gin-configurable dispatcher whose default, 'trax', returns the built-in layer
unchanged. So importing trax_qkv changes no model.

Registered names are the implementation names of `trax_qkv.AttentionQKV`
-- 'reference' (bit-identical), 'fused', 'chunked', 'cudnn', 'auto' -- and
'trax' for the built-in; `register_cross_attention` adds more. The names of
the first release ('trax_qkv', 'trax_qkv_fused', ...) still work, with a
DeprecationWarning.

Select the plugin
  from gin:     trax_qkv.EncoderDecoderAttention.implementation = 'reference'
  from Python:  trax_qkv.CrossAttentionTransformer(vocab, ..., cross_attention='reference')
"""

import contextlib
import contextvars
import functools
import warnings

import gin
from trax import layers as tl
from trax.models import transformer as trax_transformer

from trax_qkv import kernels
from trax_qkv import layers

BUILTIN = 'trax'  # the name of Trax's own layer, in every site
_REGISTRY = {}
# Names of the first release -> today's.
DEPRECATED_NAMES = {'trax_qkv': 'reference', **{
    f'trax_qkv_{name}': name for name in kernels.IMPLEMENTATIONS
    if name != 'reference'}}
_override = contextvars.ContextVar('trax_qkv_cross_attention', default=None)


def register_cross_attention(name, factory):
  """Makes `factory` selectable as cross-attention under `name`.

  Args:
    name: the registry key, used in gin and in `cross_attention=`.
    factory: called as `factory(d_feature, n_heads=, dropout=, mode=,
        cache_KV_in_predict=)`; returns a layer mapping
        `(decoder_act, encoder_act, encoder_act, mask)` to `(act, mask)`,
        like `trax.layers.AttentionQKV`.
  """
  if not isinstance(name, str) or not name:
    raise TypeError(f'name must be a non-empty str; got {name!r}.')
  if not callable(factory):
    raise TypeError(f'factory for {name!r} must be callable; got {factory!r}.')
  _REGISTRY[name] = factory


def cross_attention_implementations():
  """Names that `implementation` / `cross_attention` accept."""
  return tuple(sorted(_REGISTRY))


def canonical_name(implementation):
  """Today's name for `implementation` (a DeprecationWarning for an old one);
  factories and unknown names are returned as they are."""
  if isinstance(implementation, str) and implementation in DEPRECATED_NAMES:
    new = DEPRECATED_NAMES[implementation]
    warnings.warn(
        f'the attention name {implementation!r} is deprecated and will be '
        f'removed in the next release; use {new!r}.', DeprecationWarning,
        stacklevel=3)
    return new
  return implementation


def resolve_cross_attention(implementation):
  """A registered name or a layer factory -> the layer factory."""
  if callable(implementation):
    return implementation
  implementation = canonical_name(implementation)
  if implementation not in _REGISTRY:
    raise ValueError(
        f'cross-attention implementation must be one of '
        f'{cross_attention_implementations()} or a layer factory; got '
        f'{implementation!r}.')
  return _REGISTRY[implementation]


@contextlib.contextmanager
def use_cross_attention(implementation):
  """Within the block, Transformers are built with this cross-attention."""
  implementation = canonical_name(implementation)
  resolve_cross_attention(implementation)  # fail before building anything
  token = _override.set(implementation)
  try:
    yield
  finally:
    _override.reset(token)


@gin.configurable(module='trax_qkv', denylist=['mode'])
def EncoderDecoderAttention(d_feature, n_heads=1, dropout=0.0, mode='train',  # pylint: disable=invalid-name
                            cache_KV_in_predict=False, implementation='trax'):
  """The cross-attention layer that trax.models.Transformer builds.

  Args:
    d_feature, n_heads, dropout, mode, cache_KV_in_predict: as for
        `trax.layers.AttentionQKV`, passed through by the Transformer.
    implementation: a name from `cross_attention_implementations()` or a
        layer factory; a `use_cross_attention` block takes precedence.
  """
  chosen = _override.get() or implementation
  return resolve_cross_attention(chosen)(
      d_feature, n_heads=n_heads, dropout=dropout, mode=mode,
      cache_KV_in_predict=cache_KV_in_predict)


@gin.configurable(module='trax_qkv', denylist=['mode'])
def CrossAttentionTransformer(input_vocab_size,  # pylint: disable=invalid-name
                              output_vocab_size=None,
                              d_model=512,
                              d_ff=2048,
                              n_encoder_layers=6,
                              n_decoder_layers=6,
                              n_heads=8,
                              max_len=2048,
                              dropout=0.1,
                              dropout_shared_axes=None,
                              mode='train',
                              ff_activation=tl.Relu,
                              cross_attention='reference'):
  """`trax.models.Transformer` with the chosen cross-attention.

  Same arguments, defaults and modes as trax.models.Transformer, plus
  `cross_attention`: a registered name ('trax', 'reference', 'auto', ...)
  or a layer factory. Registered in gin under its own name, so
  `Transformer.*` bindings keep meaning trax.models.Transformer.
  """
  with use_cross_attention(cross_attention):
    return trax_transformer.Transformer(
        input_vocab_size, output_vocab_size=output_vocab_size,
        d_model=d_model, d_ff=d_ff, n_encoder_layers=n_encoder_layers,
        n_decoder_layers=n_decoder_layers, n_heads=n_heads, max_len=max_len,
        dropout=dropout, dropout_shared_axes=dropout_shared_axes, mode=mode,
        ff_activation=ff_activation)


register_cross_attention(BUILTIN, tl.AttentionQKV)
for _name in kernels.IMPLEMENTATIONS:
  register_cross_attention(_name, functools.partial(layers.AttentionQKV,
                                                    implementation=_name))
