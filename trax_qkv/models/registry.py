"""Which attention the attention layers of trax.models use.

trax.models builds attention in three sites, each Trax's layer of one
`trax.layers` name, called when a model is built or bound as a default
argument when Trax is imported:

  site               tl name          dispatcher (gin)         used by
  'self_attention'   Attention        EncoderSelfAttention     encoders
  'causal_attention' CausalAttention  DecoderSelfAttention     decoders, LMs
  'cross_attention'  AttentionQKV     EncoderDecoderAttention  encoder-decoder

Each `Site` record says which modules of trax.models call its name and
which functions take it as a default argument (`Site.modules`,
`Site.defaults`); patch 8 of `trax_qkv.patches` routes all of them
through the site's dispatcher, whose default, 'trax', builds the layer
Trax would have built. So importing trax_qkv changes no model.

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
import trax.layers

from trax_qkv import kernels
from trax_qkv import layers

BUILTIN = 'trax'  # the name of Trax's own layer, in every site


# The modules of trax.models that build attention, by their short names.
_TRANSFORMER = 'trax.models.transformer'
_RNN = 'trax.models.rnn'
_REZERO = 'trax.models.research.rezero'
_CONFIGURABLE = 'trax.models.research.configurable_transformer'
_TRANSFORMER2 = 'trax.models.research.transformer2'


@dataclasses.dataclass(frozen=True)
class Site:
  """One place where trax.models builds attention.

  Everything per site derives from these records: the registry, the gin
  dispatchers, what patch 8 routes through them, training's saved
  settings, model directories and the benchmarks. A new site is one more
  record.

  Attributes:
    name: the site's name in `use_attention`, `register_attention`,
      model.json and `--sites`.
    trax_name: the `trax.layers` name Trax's models build there.
    ours: trax_qkv's drop-in, registered under every kernel name.
    dispatcher: the gin name (module `trax_qkv`) of the site's dispatcher.
    role: what the site is, in words.
    modules: the modules of trax.models that call `tl.<trax_name>` while
      building a model.
    defaults: (module, function, parameter) of the trax.models functions
      whose parameter defaults to the layer, bound when Trax is imported.
  """

  name: str
  trax_name: str
  ours: object
  dispatcher: str
  role: str
  modules: tuple
  defaults: tuple = ()

  @property
  def builtin(self):
    """Trax's layer, as `trax.layers` holds it now (a user's replacement
    of it included, as trax.models itself would call it)."""
    return getattr(trax.layers, self.trax_name)


SITES = {
  site.name: site
  for site in (
    Site(
      'self_attention',
      'Attention',
      layers.Attention,
      'EncoderSelfAttention',
      'encoder self-attention',
      modules=(_TRANSFORMER, _REZERO),
      defaults=(
        (_CONFIGURABLE, 'ConfigurableTransformerEncoder', 'attention_type'),
        (_CONFIGURABLE, 'ConfigurableTransformer', 'encoder_attention_type'),
        (_TRANSFORMER2, 'Transformer2', 'encoder_attention_type'),
      ),
    ),
    Site(
      'causal_attention',
      'CausalAttention',
      layers.CausalAttention,
      'DecoderSelfAttention',
      'decoder causal self-attention',
      modules=(_TRANSFORMER, _REZERO),
      defaults=(
        (_CONFIGURABLE, 'ConfigurableTransformerLM', 'attention_type'),
        # Trax's name for the decoder's causal self-attention there.
        (
          _CONFIGURABLE,
          'ConfigurableTransformer',
          'encoder_decoder_attention_type',
        ),
        (_TRANSFORMER2, 'Transformer2', 'decoder_attention_type'),
      ),
    ),
    Site(
      'cross_attention',
      'AttentionQKV',
      layers.AttentionQKV,
      'EncoderDecoderAttention',
      'encoder-decoder (cross-) attention',
      modules=(_TRANSFORMER, _RNN, _REZERO, _CONFIGURABLE),
    ),
  )
}
_REGISTRY = {site: {} for site in SITES}
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
  if name == BUILTIN:
    raise ValueError(
      f"name must not be {BUILTIN!r}, which is Trax's own layer; got {name!r}."
    )
  if not callable(factory):
    raise TypeError(f'factory for {name!r} must be callable; got {factory!r}.')
  _REGISTRY[site][name] = factory


def attention_implementations(site):
  """Names that `site` accepts: 'trax', the kernels, registered ones."""
  check_site(site)
  return tuple(sorted({BUILTIN, *_REGISTRY[site], *kernels.names()}))


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
  if implementation == BUILTIN:
    bound = _builtin_of_this_call.get()
    return bound[1] if bound and bound[0] == site else SITES[site].builtin
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


# (site, layer): what a dispatcher builds for 'trax' while a `BoundDefault`
# calls it, the default argument Trax bound when it was imported.
_builtin_of_this_call = contextvars.ContextVar(
  'trax_qkv_builtin_of_this_call', default=None
)


def _make_dispatcher(site):
  """The gin-configurable layer factory that trax.models calls in `site`.

  It passes on only the arguments trax.models gives it, so that the chosen
  layer's own defaults and gin bindings (e.g.
  `trax.layers.CausalAttention.max_inference_length`) apply as before; a
  call the built-in would refuse (no `d_feature`: the first of
  configurable_transformer's `ApplyAttentionLayer`'s two calls) raises
  TypeError before anything is chosen, as the built-in's does.
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


class LayersView(types.ModuleType):
  """`trax.layers` as one module of trax.models sees it: the names of the
  sites that module builds are their dispatchers, every other name is
  looked up in `trax.layers` when it is used."""

  def __init__(self, module_name):
    super().__init__('trax.layers')
    self.routed_from = module_name
    self.sites = {
      site.trax_name: DISPATCHERS[site.name]
      for site in SITES.values()
      if module_name in site.modules
    }

  def __getattr__(self, name):
    if name in self.sites:
      return self.sites[name]
    return getattr(trax.layers, name)


class BoundDefault:
  """A site's dispatcher in place of the layer Trax bound as a default
  argument (e.g. `ConfigurableTransformerLM(attention_type=...)`).

  Called, it dispatches as the site's gin dispatcher does, and where
  nothing is chosen builds `builtin`, the layer Trax had bound there, so a
  model built with nothing chosen is the one Trax would build.
  """

  def __init__(self, site, builtin):
    self.site, self.builtin = site, builtin

  def __call__(self, *args, **kwargs):
    token = _builtin_of_this_call.set((self.site, self.builtin))
    try:
      return DISPATCHERS[self.site](*args, **kwargs)
    finally:
      _builtin_of_this_call.reset(token)

  def __repr__(self):
    return (
      f'<trax_qkv.{SITES[self.site].dispatcher}: trax.layers.'
      f'{SITES[self.site].trax_name} unless trax_qkv.use_attention or gin '
      'chooses another>'
    )
