"""Which attention trax.models builds in each of its three sites.

  site               tl name          dispatcher (gin)         used by
  'self_attention'   Attention        EncoderSelfAttention     encoders
  'causal_attention' CausalAttention  DecoderSelfAttention     decoders, LMs
  'cross_attention'  AttentionQKV     EncoderDecoderAttention  encoder-decoder

Patch 8 puts a `Dispatcher` wherever trax.models builds a site's layer:
Trax's layer, without a trace (no gin record, callers the model's lines),
until a name of `attention_implementations(site)` is chosen in gin (every
build), by `use_attention` (its thread's builds; wins over gin) or by
`with_attention`. The operative gin config (Trax's config.gin) names it.
"""

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import os
import sys
import types
import weakref

import gin
import trax.layers
from trax.layers import attention as trax_attention
from trax.layers import base as trax_base

from trax_qkv import kernels
from trax_qkv import layers

BUILTIN = 'trax'  # the name of Trax's own layer, in every site

_TRANSFORMER = 'trax.models.transformer'
_RNN = 'trax.models.rnn'
_REZERO = 'trax.models.research.rezero'
_CONFIGURABLE = 'trax.models.research.configurable_transformer'
_TRANSFORMER2 = 'trax.models.research.transformer2'
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Site:
  """One place where trax.models builds attention.

  Attributes:
    name: in `use_attention`, `register_attention`, model.json, `--sites`.
    trax_name: the `trax.layers` name Trax's models build there.
    ours: trax_qkv's drop-in, registered under every kernel name.
    dispatcher: the gin name (module `trax_qkv`) of the site's dispatcher.
    role: what the site is, in words.
    modules: the modules of trax.models that call `tl.<trax_name>`.
    part: the part of a Transformer it is in, as reports and tables name
      it ('encoder', 'decoder', 'cross').
  """

  name: str
  trax_name: str
  ours: object
  dispatcher: str
  role: str
  modules: tuple
  part: str

  @property
  def builtin(self):
    """Trax's layer as `trax.layers` holds it now, as trax.models calls it."""
    return getattr(trax.layers, self.trax_name)


# The sites' names: every other module spells them through these.
SELF_ATTENTION = 'self_attention'
CAUSAL_ATTENTION = 'causal_attention'
CROSS_ATTENTION = 'cross_attention'
# fmt: off
SITES = {site.name: site for site in (
  Site(SELF_ATTENTION, 'Attention', layers.Attention, 'EncoderSelfAttention',
       'encoder self-attention', (_TRANSFORMER, _REZERO), 'encoder'),
  Site(CAUSAL_ATTENTION, 'CausalAttention', layers.CausalAttention,
       'DecoderSelfAttention', 'decoder causal self-attention',
       (_TRANSFORMER, _REZERO), 'decoder'),
  Site(CROSS_ATTENTION, 'AttentionQKV', layers.AttentionQKV,
       'EncoderDecoderAttention', 'encoder-decoder (cross-) attention',
       (_TRANSFORMER, _RNN, _REZERO, _CONFIGURABLE), 'cross'),
)}
# fmt: on
# The trax.models functions with parameters whose defaults are Trax's
# layer of a site, bound when Trax is imported (six `*attention_type`).
DEFAULT_HOLDERS = (
  (_CONFIGURABLE, 'ConfigurableTransformerEncoder'),
  (_CONFIGURABLE, 'ConfigurableTransformerLM'),
  (_CONFIGURABLE, 'ConfigurableTransformer'),
  (_TRANSFORMER2, 'Transformer2'),
)
_REGISTRY = {site: {} for site in SITES}


def trax_site(value):
  """The site whose Trax layer `value` is (or says it wraps: gin,
  `functools.wraps`), else None."""
  for site in SITES.values():
    trax_layer = inspect.unwrap(getattr(trax_attention, site.trax_name))
    if callable(value) and inspect.unwrap(value) is trax_layer:
      return site.name
  return None


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
    factory: called with what a model passes to the site's built-in:
        `d_feature`, then keywords (`n_heads`, `mode`, ...); some models add
        their own (`q_sparsity`): take `**kwargs`, refuse what you cannot
        honour. Returns a layer with the built-in's inputs and outputs.
  """
  check_site(site)
  if not isinstance(name, str) or not name:
    raise TypeError(f'name must be a non-empty str; got {name!r}.')
  if name == BUILTIN:
    raise ValueError(f"name must not be 'trax' (Trax's layer); got {name!r}.")
  if not callable(factory):
    raise TypeError(f'factory for {name!r} must be callable; got {factory!r}.')
  _REGISTRY[site][name] = factory


def attention_implementations(site):
  """Names that `site` accepts: 'trax', the kernels, registered ones."""
  check_site(site)
  return tuple(sorted({BUILTIN, *_REGISTRY[site], *kernels.names()}))


def rename(old, new, warn):
  """`old` resolves as `new`, calling `warn(old, new)` (`trax_qkv.compat`)."""
  _RENAMED[old] = (new, warn)


def canonical_name(implementation):
  """Today's name for `implementation`; anything else as it is."""
  if isinstance(implementation, str) and implementation in _RENAMED:
    new, warn = _RENAMED[implementation]
    warn(implementation, new)
    return new
  return implementation


def resolve_attention(site, implementation):
  """The layer factory that `implementation` (a name of
  `attention_implementations(site)`, or a factory, returned as it is)
  stands for in `site`; ValueError for an unknown site or name."""
  check_site(site)
  if callable(implementation):
    return implementation
  implementation = canonical_name(implementation)
  if implementation == BUILTIN:
    return SITES[site].builtin
  if implementation in _REGISTRY[site]:
    return _REGISTRY[site][implementation]
  if isinstance(implementation, str) and implementation in kernels.names():
    return functools.partial(SITES[site].ours, implementation=implementation)
  names = attention_implementations(site)
  raise ValueError(
    f'{site} implementation must be one of {names} or a layer factory; '
    f'got {implementation!r}.'
  )


def check_attention(attention):
  """Raises TypeError unless `attention` is None or a dict, ValueError
  unless it maps sites to names (or factories) they accept."""
  if attention is None:
    return
  if not isinstance(attention, dict):
    raise TypeError(
      f'attention must be a dict {{site: implementation}}; got {attention!r}.'
    )
  for site, name in attention.items():
    resolve_attention(site, name)


def _chosen(implementations):
  """{site: today's name or factory}, None left out, every one checked."""
  chosen = {
    site: canonical_name(name)
    for site, name in implementations.items()
    if name is not None
  }
  check_attention(chosen)
  return chosen


def walk(layer):
  """`layer` and every layer under it, parents before their sublayers, in
  the tree's order."""
  yield layer
  for sublayer in layer.sublayers:
    yield from walk(sublayer)


# Every layer a site built (`_build`), Trax's own included, and its site:
# how code that reads a built model tells which site an attention layer
# is, whatever the model, the implementation or the layer's structure.
_BUILT = weakref.WeakKeyDictionary()


def site_of(layer):
  """The site that built `layer` (trax.models' call through a dispatcher,
  or `build`), else None."""
  return _BUILT.get(layer)


def attention_sites(model):
  """[(site, layer)] of every layer of `model` that a site built, in the
  tree's order: for trax.models' Transformers, the order they run in (the
  encoder's self-attention, then each decoder layer's causal and cross
  attention)."""
  return [(_BUILT[layer], layer) for layer in walk(model) if layer in _BUILT]


def build(site, implementation, *args, **kwargs):
  """The layer `site` builds with `implementation` (a name, a factory or
  None for Trax's), from the built-in's arguments; `site_of` knows it. For
  models of one's own, as trax.models' calls build theirs."""
  check_site(site)
  return _build(site, implementation, None, args, kwargs)


@contextlib.contextmanager
def use_attention(**implementations):
  """Within the block, this thread (and asyncio task) builds trax.models'
  attention with `implementations`: site -> a name or a factory; None
  leaves a site as it is. Every one is checked before anything is built."""
  chosen = _chosen(implementations).items()
  tokens = [(site, _overrides[site].set(name)) for site, name in chosen]
  try:
    yield
  finally:
    for site, token in reversed(tokens):
      _overrides[site].reset(token)


def with_attention(model, **implementations):
  """`model` (e.g. `trax.models.Transformer`) building every call inside
  `use_attention(**implementations)`, for builds later or elsewhere
  (`trainer_lib`'s train and eval models). Gin: `train.model =
  @trax_qkv.with_attention()`, `with_attention.model = ...`."""
  if not callable(model):
    raise TypeError(f'model must be a model function; got {model!r}.')
  chosen = _chosen(implementations)

  @functools.wraps(model)
  def model_fn(*args, **kwargs):
    with use_attention(**chosen):
      return model(*args, **kwargs)

  return model_fn


gin.external_configurable(with_attention, module='trax_qkv')


def _model_frame():
  """The caller Trax names: the first frame out of here (`_find_frame`)."""
  frame = sys._getframe(1)
  while (
    frame.f_code.co_filename == __file__
    or trax_base._find_frame(frame) is not frame
  ):
    frame = frame.f_back
  return frame


def _record(site, implementation):
  """Writes a block's choice where gin records what each call used, as if
  gin had bound it: Trax saves that record as config.gin. (Gin has no
  public way to add to it; trax_qkv requires gin-config 0.5.0.)"""
  key = (gin.current_scope_str(), f'trax_qkv.{SITES[site].dispatcher}')
  with gin.config._OPERATIVE_CONFIG_LOCK:
    gin.config._OPERATIVE_CONFIG.setdefault(key, {}).update(
      implementation=implementation
    )


def _check_call(factory, site, implementation, args, kwargs, frame):
  """TypeError, naming the model, if `factory` cannot take its arguments."""
  try:
    inspect.signature(factory).bind(*args, **kwargs)
  except ValueError:  # no signature to check: the call will tell
    return
  except TypeError as error:
    raise TypeError(
      f'{site} implementation {implementation!r} cannot be built where '
      f'{frame.f_globals.get("__name__")}.{frame.f_code.co_name} (line '
      f'{frame.f_lineno}) builds trax.layers.{SITES[site].trax_name}'
      f"{args} {kwargs}: {error}. A factory takes the built-in's arguments"
      ' and **kwargs for the ones some models add.'
    ) from None


def _build(site, implementation, builtin, args, kwargs):
  """The layer `site` builds: a block's choice, else `implementation`,
  else (None) `builtin` or `trax.layers`' layer."""
  chosen = _overrides[site].get()
  if chosen is not None:
    if isinstance(chosen, str) and chosen != BUILTIN:
      _record(site, chosen)
  else:
    chosen = canonical_name(implementation)
  frame = _model_frame()
  if chosen is None or chosen == BUILTIN:
    layer = (builtin or SITES[site].builtin)(*args, **kwargs)
  else:
    factory = resolve_attention(site, chosen)
    _check_call(factory, site, chosen, args, kwargs, frame)
    layer = factory(*args, **kwargs)
  # What trax_qkv built names the model's line, as Trax's layers do
  # without trax_qkv; a user's factory keeps its own lines.
  model_line = {'filename': frame.f_code.co_filename, 'lineno': frame.f_lineno}
  for part in walk(layer):
    if part._caller['filename'].startswith(_PACKAGE_DIR + os.sep):
      part._caller = dict(model_line)
  _BUILT[layer] = site
  return layer


def _gin_dispatcher(site):
  """The site's gin configurable, `trax_qkv.<dispatcher>`."""

  def dispatcher(*args, implementation=None, **kwargs):
    return _build(site.name, implementation, None, args, kwargs)

  dispatcher.__name__ = dispatcher.__qualname__ = site.dispatcher
  dispatcher.__doc__ = f"""The {site.role}: `tl.{site.trax_name}(*args,
  **kwargs)` unless `implementation` or a block chooses another."""
  return gin.configurable(site.dispatcher, module='trax_qkv')(dispatcher)


DISPATCHERS = {name: _gin_dispatcher(site) for name, site in SITES.items()}
EncoderSelfAttention = DISPATCHERS['self_attention']
DecoderSelfAttention = DISPATCHERS['causal_attention']
EncoderDecoderAttention = DISPATCHERS['cross_attention']


class Dispatcher:
  """What patch 8 puts where trax.models builds a site's layer: unless a
  block or a gin binding chooses (only then does gin see the call), it
  builds `builtin` (a default Trax bound) or `trax.layers`' layer now."""

  def __init__(self, site, builtin=None):
    self.site, self.builtin = site, builtin

  def __call__(self, *args, **kwargs):
    if _overrides[self.site].get() is None and gin.get_bindings(
      f'trax_qkv.{SITES[self.site].dispatcher}', resolve_references=False
    ):
      return DISPATCHERS[self.site](*args, **kwargs)
    return _build(self.site, None, self.builtin, args, kwargs)

  def __repr__(self):
    s = SITES[self.site]
    return f'<trax_qkv.{s.dispatcher}: tl.{s.trax_name} until chosen>'


class LayersView(types.ModuleType):
  """`trax.layers` as one module of trax.models sees it: a `Dispatcher`
  for each site that module builds, every other name `trax.layers`'s,
  looked up when it is used."""

  def __init__(self, module_name):
    super().__init__('trax.layers')
    for site in SITES.values():
      if module_name in site.modules:
        setattr(self, site.trax_name, Dispatcher(site.name))

  def __getattr__(self, name):  # a name __init__ did not set
    return getattr(trax.layers, name)

  def __repr__(self):
    names = [k for k, v in vars(self).items() if isinstance(v, Dispatcher)]
    return f'<trax.layers, {", ".join(names)} dispatched by trax_qkv>'
