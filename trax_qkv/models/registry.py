"""Which attention the layers of trax.models' Transformer family use.

trax.models.transformer builds its attention layers by calling, when the
model is built, one of three names of `trax.layers` -- one per site:

  site                tl name          used by                         dispatcher (gin)
  'self_attention'    Attention        encoders: Transformer,          EncoderSelfAttention
                                       TransformerEncoder
  'causal_attention'  CausalAttention  decoders: Transformer,          DecoderSelfAttention
                                       TransformerDecoder, TransformerLM
  'cross_attention'   AttentionQKV     Transformer's encoder-decoder   EncoderDecoderAttention
                                       attention

`trax_qkv.patches` makes those names the gin-configurable dispatchers
above, whose default, 'trax', returns the built-in layer unchanged. So
importing trax_qkv changes no model.

Every site registers the implementation names of `trax_qkv.layers` --
'reference' (bit-identical), 'fused', 'chunked', 'cudnn', 'auto' -- and
'trax' for the built-in; `register_attention` adds more. The names of the
first release ('trax_qkv', 'trax_qkv_fused', ...) still work, with a
DeprecationWarning.

Select the plugin
  from gin:     trax_qkv.DecoderSelfAttention.implementation = 'auto'
                trax_qkv.EncoderDecoderAttention.implementation = 'reference'
  from Python:  with trax_qkv.use_attention(self_attention='auto',
                                            causal_attention='auto',
                                            cross_attention='auto'):
                  model = trax.models.TransformerLM(...)
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
# Site -> (the trax.layers name that trax.models.transformer calls there,
#          the built-in layer, ours).
SITES = {
    'self_attention': ('Attention', tl.Attention, layers.Attention),
    'causal_attention': ('CausalAttention', tl.CausalAttention,
                         layers.CausalAttention),
    'cross_attention': ('AttentionQKV', tl.AttentionQKV, layers.AttentionQKV),
}
_REGISTRY = {site: {} for site in SITES}
_overrides = {site: contextvars.ContextVar(f'trax_qkv_{site}', default=None)
              for site in SITES}
# Names of the first release -> today's.
DEPRECATED_NAMES = {'trax_qkv': 'reference', **{
    f'trax_qkv_{name}': name for name in kernels.IMPLEMENTATIONS
    if name != 'reference'}}


def _check_site(site):
  if site not in SITES:
    raise ValueError(f'site must be one of {tuple(SITES)}; got {site!r}.')


def register_attention(site, name, factory):
  """Makes `factory` selectable in `site` under `name`.

  Args:
    site: 'self_attention', 'causal_attention' or 'cross_attention'.
    name: the registry key, used in gin and in `use_attention`.
    factory: called with the arguments trax.models passes to the site's
        built-in (`tl.Attention`, `tl.CausalAttention`, `tl.AttentionQKV`);
        returns a layer with the same inputs and outputs.
  """
  _check_site(site)
  if not isinstance(name, str) or not name:
    raise TypeError(f'name must be a non-empty str; got {name!r}.')
  if not callable(factory):
    raise TypeError(f'factory for {name!r} must be callable; got {factory!r}.')
  _REGISTRY[site][name] = factory


def register_cross_attention(name, factory):
  """`register_attention('cross_attention', name, factory)`."""
  register_attention('cross_attention', name, factory)


def attention_implementations(site):
  """Names that `site` accepts."""
  _check_site(site)
  return tuple(sorted(_REGISTRY[site]))


def cross_attention_implementations():
  """Names that `implementation` / `cross_attention` accept."""
  return attention_implementations('cross_attention')


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


def resolve_attention(site, implementation):
  """A registered name or a layer factory -> the layer factory."""
  _check_site(site)
  if callable(implementation):
    return implementation
  implementation = canonical_name(implementation)
  if implementation not in _REGISTRY[site]:
    raise ValueError(
        f'{site} implementation must be one of '
        f'{attention_implementations(site)} or a layer factory; got '
        f'{implementation!r}.')
  return _REGISTRY[site][implementation]


def resolve_cross_attention(implementation):
  """`resolve_attention('cross_attention', implementation)`."""
  return resolve_attention('cross_attention', implementation)


@contextlib.contextmanager
def use_attention(self_attention=None, causal_attention=None,
                  cross_attention=None):
  """Within the block, trax.models' Transformer family is built with these.

  Each argument is a registered name ('trax', 'reference', 'auto', ...) or
  a layer factory; None leaves the site as it is (the gin binding, or an
  enclosing block). Every name is checked before anything is built.
  """
  chosen = {'self_attention': self_attention,
            'causal_attention': causal_attention,
            'cross_attention': cross_attention}
  chosen = {site: canonical_name(name) for site, name in chosen.items()
            if name is not None}
  for site, name in chosen.items():
    resolve_attention(site, name)
  tokens = [(site, _overrides[site].set(name)) for site, name in chosen.items()]
  try:
    yield
  finally:
    for site, token in reversed(tokens):
      _overrides[site].reset(token)


def use_cross_attention(implementation):
  """Within the block, Transformers are built with this cross-attention."""
  return use_attention(cross_attention=canonical_name(implementation))


def _build(site, implementation, d_feature, kwargs):
  chosen = _overrides[site].get() or implementation
  return resolve_attention(site, chosen)(d_feature, **kwargs)


# The dispatchers pass on only the arguments trax.models gives them, so that
# the chosen layer's own defaults and gin bindings (e.g.
# `trax.layers.CausalAttention.max_inference_length`) apply as before.


@gin.configurable(module='trax_qkv')
def EncoderSelfAttention(d_feature, implementation=BUILTIN, **kwargs):  # pylint: disable=invalid-name
  """The encoder self-attention that trax.models builds (`tl.Attention`).

  Args:
    d_feature: as for `trax.layers.Attention`.
    implementation: a name from `attention_implementations(
        'self_attention')` or a layer factory; a `use_attention` block
        takes precedence.
    **kwargs: the other arguments of `trax.layers.Attention` (n_heads,
        dropout, mode), passed on as given.
  """
  return _build('self_attention', implementation, d_feature, kwargs)


@gin.configurable(module='trax_qkv')
def DecoderSelfAttention(d_feature, implementation=BUILTIN, **kwargs):  # pylint: disable=invalid-name
  """The causal self-attention that trax.models builds (`tl.CausalAttention`).

  Args:
    d_feature: as for `trax.layers.CausalAttention`.
    implementation: a name from `attention_implementations(
        'causal_attention')` or a layer factory; a `use_attention` block
        takes precedence.
    **kwargs: the other arguments of `trax.layers.CausalAttention` (n_heads,
        dropout, max_inference_length, use_dconv, mode), passed on as given.
  """
  return _build('causal_attention', implementation, d_feature, kwargs)


@gin.configurable(module='trax_qkv')
def EncoderDecoderAttention(d_feature, implementation=BUILTIN, **kwargs):  # pylint: disable=invalid-name
  """The cross-attention layer that trax.models.Transformer builds
  (`tl.AttentionQKV`).

  Args:
    d_feature: as for `trax.layers.AttentionQKV`.
    implementation: a name from `cross_attention_implementations()` or a
        layer factory; a `use_attention` block takes precedence.
    **kwargs: the other arguments of `trax.layers.AttentionQKV` (n_heads,
        dropout, mode, cache_KV_in_predict), passed on as given.
  """
  return _build('cross_attention', implementation, d_feature, kwargs)


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


for _site, (_, _builtin, _ours) in SITES.items():
  register_attention(_site, BUILTIN, _builtin)
  for _name in kernels.IMPLEMENTATIONS:
    register_attention(_site, _name,
                       functools.partial(_ours, implementation=_name))
