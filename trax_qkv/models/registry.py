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
import dataclasses
import functools
import types
import warnings

import gin
import trax.layers
from trax import layers as tl
from trax.models import transformer as trax_transformer

from trax_qkv import kernels
from trax_qkv import layers

BUILTIN = 'trax'  # the name of Trax's own layer, in every site


@dataclasses.dataclass(frozen=True)
class Site:
  """One place where trax.models' Transformer family builds attention.

  Everything per site derives from these records: the registry, the gin
  dispatchers, the view of `trax.layers` that trax.models.transformer gets
  (`layers_with_dispatchers`), training's saved settings, model
  directories and the benchmarks. A new site is one more record.

  Attributes:
    name: the site's name in `use_attention`, `register_attention`,
      model.json and `--sites`.
    trax_name: the `trax.layers` name trax.models.transformer calls there.
    builtin: Trax's layer (registered as BUILTIN).
    ours: trax_qkv's drop-in, registered under every kernel name.
    dispatcher: the gin name (module `trax_qkv`) of the site's dispatcher.
    role: what the site is, in words.
  """
  name: str
  trax_name: str
  builtin: object
  ours: object
  dispatcher: str
  role: str


SITES = {site.name: site for site in (
    Site('self_attention', 'Attention', tl.Attention, layers.Attention,
         'EncoderSelfAttention', 'encoder self-attention'),
    Site('causal_attention', 'CausalAttention', tl.CausalAttention,
         layers.CausalAttention, 'DecoderSelfAttention',
         'decoder causal self-attention'),
    Site('cross_attention', 'AttentionQKV', tl.AttentionQKV,
         layers.AttentionQKV, 'EncoderDecoderAttention',
         'encoder-decoder (cross-) attention'),
)}
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
def use_attention(**implementations):
  """Within the block, trax.models' Transformer family is built with these.

  Args:
    **implementations: site name (`self_attention`, `causal_attention`,
      `cross_attention`: `SITES`) -> a registered name ('trax',
      'reference', 'auto', ...) or a layer factory; None leaves the site as
      it is (the gin binding, or an enclosing block). Every site and name is
      checked before anything is built.
  """
  chosen = {site: canonical_name(name)
            for site, name in implementations.items() if name is not None}
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


def _make_dispatcher(site):
  """The gin-configurable layer factory that trax.models calls in `site`.

  It passes on only the arguments trax.models gives it, so that the chosen
  layer's own defaults and gin bindings (e.g.
  `trax.layers.CausalAttention.max_inference_length`) apply as before.
  """
  def dispatcher(d_feature, implementation=BUILTIN, **kwargs):
    chosen = _overrides[site.name].get() or implementation
    return resolve_attention(site.name, chosen)(d_feature, **kwargs)

  dispatcher.__name__ = dispatcher.__qualname__ = site.dispatcher
  dispatcher.__doc__ = f"""The {site.role} that trax.models builds
  (`trax.layers.{site.trax_name}`).

  Args:
    d_feature: as for `trax.layers.{site.trax_name}`.
    implementation: a name from `attention_implementations(
        {site.name!r})` or a layer factory; a `use_attention` block takes
        precedence.
    **kwargs: the other arguments of `trax.layers.{site.trax_name}`,
        passed on as given.
  """
  return gin.configurable(site.dispatcher, module='trax_qkv')(dispatcher)


DISPATCHERS = {name: _make_dispatcher(site) for name, site in SITES.items()}
EncoderSelfAttention = DISPATCHERS['self_attention']  # pylint: disable=invalid-name
DecoderSelfAttention = DISPATCHERS['causal_attention']  # pylint: disable=invalid-name
EncoderDecoderAttention = DISPATCHERS['cross_attention']  # pylint: disable=invalid-name


class _LayersWithDispatchers(types.ModuleType):
  """`trax.layers`, except that each site's `trax_name` is its dispatcher."""

  def __getattr__(self, name):
    for site in SITES.values():
      if name == site.trax_name:
        return DISPATCHERS[site.name]
    return getattr(trax.layers, name)


def layers_with_dispatchers():
  """The view of `trax.layers` that `trax_qkv.patches` gives
  trax.models.transformer, which calls each site's `trax_name` in that
  site only: there it is the site's dispatcher, whose default is the
  built-in layer."""
  return _LayersWithDispatchers('trax.layers')


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


for _site in SITES.values():
  register_attention(_site.name, BUILTIN, _site.builtin)
  for _name in kernels.IMPLEMENTATIONS:
    register_attention(_site.name, _name,
                       functools.partial(_site.ours, implementation=_name))
