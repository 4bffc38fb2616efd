"""Which attention the layers of trax.models' Transformer family use.

trax.models.transformer builds its attention layers by calling, when the
model is built, one of three names of `trax.layers` -- one per site:

  site               tl name          dispatcher (gin)         used by
  'self_attention'   Attention        EncoderSelfAttention     encoders
  'causal_attention' CausalAttention  DecoderSelfAttention     decoders, LMs
  'cross_attention'  AttentionQKV     EncoderDecoderAttention  Transformer

(encoders: Transformer, TransformerEncoder; decoders: Transformer,
TransformerDecoder, TransformerLM; cross-attention: Transformer's
encoder-decoder attention.)

`install()` (run when trax_qkv is imported) makes those names the
gin-configurable dispatchers above, in that module only; their default,
'trax', returns the built-in layer unchanged. So importing trax_qkv
changes no model.

Every site takes 'trax' for the built-in, every kernel name of
`trax_qkv.kernels.names()` ('reference' -- bit-identical --, 'fused',
'chunked', 'cudnn', 'auto', and any kernel registered later) for
trax_qkv's layer running that kernel, and what `register_attention` adds.
The first release's names and API are in `trax_qkv.compat`.

Select trax_qkv's layers
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

import gin
from trax import layers as tl
import trax.layers
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


SITES = {
  site.name: site
  for site in (
    Site(
      'self_attention',
      'Attention',
      tl.Attention,
      layers.Attention,
      'EncoderSelfAttention',
      'encoder self-attention',
    ),
    Site(
      'causal_attention',
      'CausalAttention',
      tl.CausalAttention,
      layers.CausalAttention,
      'DecoderSelfAttention',
      'decoder causal self-attention',
    ),
    Site(
      'cross_attention',
      'AttentionQKV',
      tl.AttentionQKV,
      layers.AttentionQKV,
      'EncoderDecoderAttention',
      'encoder-decoder (cross-) attention',
    ),
  )
}
_REGISTRY = {site: {BUILTIN: SITES[site].builtin} for site in SITES}
_overrides = {
  site: contextvars.ContextVar(f'trax_qkv_{site}', default=None)
  for site in SITES
}
# Old name -> (today's name, warning to give): `trax_qkv.compat` fills it.
_RENAMED = {}


def check_site(site):
  """Raises ValueError unless `site` is one of SITES."""
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
  check_site(site)
  if not isinstance(name, str) or not name:
    raise TypeError(f'name must be a non-empty str; got {name!r}.')
  if not callable(factory):
    raise TypeError(f'factory for {name!r} must be callable; got {factory!r}.')
  _REGISTRY[site][name] = factory


def attention_implementations(site):
  """Names that `site` accepts: 'trax', the kernels, registered ones."""
  check_site(site)
  return tuple(sorted(set(_REGISTRY[site]) | set(kernels.names())))


def rename(old, new, warn):
  """Makes `old` resolve as `new` everywhere, calling `warn(old, new)`
  each time it is used (`trax_qkv.compat` keeps the first release's
  names this way)."""
  _RENAMED[old] = (new, warn)


def canonical_name(implementation):
  """Today's name for `implementation`; factories and unknown names are
  returned as they are."""
  if isinstance(implementation, str) and implementation in _RENAMED:
    new, warn = _RENAMED[implementation]
    warn(implementation, new)
    return new
  return implementation


def resolve_attention(site, implementation):
  """The layer factory `implementation` stands for in `site`.

  Args:
    site: a name of SITES.
    implementation: a registered name ('trax', ...), a kernel name or
      'auto' (trax_qkv's layer of the site with that implementation), or a
      layer factory (returned as it is).

  Returns:
    A callable taking the arguments of the site's `trax.layers` layer.

  Raises:
    ValueError: an unknown site or name.
  """
  check_site(site)
  if callable(implementation):
    return implementation
  implementation = canonical_name(implementation)
  if implementation in _REGISTRY[site]:
    return _REGISTRY[site][implementation]
  if isinstance(implementation, str) and implementation in kernels.names():
    return functools.partial(SITES[site].ours, implementation=implementation)
  raise ValueError(
    f'{site} implementation must be one of '
    f'{attention_implementations(site)} or a layer factory; got '
    f'{implementation!r}.'
  )


def check_attention(attention):
  """Raises unless `attention` is None or a dict mapping sites to names
  (or factories) they accept.

  Raises:
    TypeError: `attention` is not a dict.
    ValueError: an unknown site or name (`resolve_attention`).
  """
  if attention is None:
    return
  if not isinstance(attention, dict):
    raise TypeError(
      f'attention must be a dict {{site: implementation}}; got {attention!r}.'
    )
  for site, name in attention.items():
    resolve_attention(site, name)


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
  chosen = {
    site: canonical_name(name)
    for site, name in implementations.items()
    if name is not None
  }
  check_attention(chosen)
  tokens = [(site, _overrides[site].set(name)) for site, name in chosen.items()]
  try:
    yield
  finally:
    for site, token in reversed(tokens):
      _overrides[site].reset(token)


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
EncoderSelfAttention = DISPATCHERS['self_attention']
DecoderSelfAttention = DISPATCHERS['causal_attention']
EncoderDecoderAttention = DISPATCHERS['cross_attention']


class _LayersWithDispatchers(types.ModuleType):
  """`trax.layers`, except that each site's `trax_name` is its dispatcher."""

  def __getattr__(self, name):
    for site in SITES.values():
      if name == site.trax_name:
        return DISPATCHERS[site.name]
    return getattr(trax.layers, name)


def layers_with_dispatchers():
  """The view of `trax.layers` that `install` gives
  trax.models.transformer, which calls each site's `trax_name` in that
  site only: there it is the site's dispatcher, whose default is the
  built-in layer."""
  return _LayersWithDispatchers('trax.layers')


def install():
  """Makes trax.models.transformer build its attention through the sites'
  dispatchers: that module (and only it) sees `layers_with_dispatchers()`
  as `tl`. Idempotent."""
  if not isinstance(trax_transformer.tl, _LayersWithDispatchers):
    trax_transformer.tl = layers_with_dispatchers()
