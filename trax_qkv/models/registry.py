"""Which attention trax.models builds in each of its three sites.

  site               tl name          dispatcher (gin)         used by
  'self_attention'   Attention        EncoderSelfAttention     encoders
  'causal_attention' CausalAttention  DecoderSelfAttention     decoders, LMs
  'cross_attention'  AttentionQKV     EncoderDecoderAttention  encoder-decoder

Patch 8 (`trax_qkv.patches`) puts a `Dispatcher` wherever a `Site` record
says trax.models builds the site's layer. Until a choice is made it builds
Trax's layer and leaves no trace: no gin record, and each layer names the
model's line as its caller, as without trax_qkv. A choice is a name of
`attention_implementations(site)` ('trax', a kernel: 'reference' --
bit-identical --, 'fused', 'chunked', 'cudnn', 'auto', or a registered
name), made in gin (`trax_qkv.EncoderDecoderAttention.implementation =
'auto'`, every build), in a `use_attention(...)` block (the builds of its
thread and asyncio task while it is open; wins over gin), or by
`with_attention(model_fn, ...)`, which opens that block around every call
(`trainer_lib`'s train, eval and predict builds). Gin's operative config,
which Trax saves as config.gin, then names the choice, so that file builds
the same model where trax_qkv is imported; a factory passed as itself, not
by a registered name, cannot be written there.
"""

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import os
import sys
import types

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
  """One place where trax.models builds attention; everything per site
  derives from these records.

  Attributes:
    name: the site's name in `use_attention`, `register_attention`,
      model.json and `--sites`.
    trax_name: the `trax.layers` name Trax's models build there.
    ours: trax_qkv's drop-in, registered under every kernel name.
    dispatcher: the gin name (module `trax_qkv`) of the site's dispatcher.
    role: what the site is, in words.
    modules: the modules of trax.models that call `tl.<trax_name>` while
      building a model.
    defaults: (module, function) of the trax.models functions with a
      parameter that defaults to the layer, bound when Trax is imported.
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

  def is_trax_layer(self, value):
    """Whether `value` is the function Trax defines for this site, or a
    wrapper of it that says so (`functools.wraps`, gin)."""
    defined = inspect.unwrap(getattr(trax_attention, self.trax_name))
    return callable(value) and inspect.unwrap(value) is defined


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
        (_CONFIGURABLE, 'ConfigurableTransformerEncoder'),
        (_CONFIGURABLE, 'ConfigurableTransformer'),
        (_TRANSFORMER2, 'Transformer2'),
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
        (_CONFIGURABLE, 'ConfigurableTransformerLM'),
        (_CONFIGURABLE, 'ConfigurableTransformer'),
        (_TRANSFORMER2, 'Transformer2'),
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
    factory: called with exactly what a model passes to the site's
        built-in (`tl.Attention`, `tl.CausalAttention`, `tl.AttentionQKV`):
        `d_feature`, then mostly keywords (`n_heads`, `dropout`, `mode`,
        `max_inference_length`, `cache_KV_in_predict`, ...), and some
        models pass their own (ConfigurableTransformer: `q_sparsity`,
        `result_sparsity`), so take `**kwargs` and refuse what you cannot
        honour. Returns a layer with the built-in's inputs and outputs.
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
    return SITES[site].builtin
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


def _chosen(implementations):
  """{site: today's name or factory}, None left out, every one checked."""
  chosen = {
    site: canonical_name(name)
    for site, name in implementations.items()
    if name is not None
  }
  check_attention(chosen)
  return chosen


@contextlib.contextmanager
def use_attention(**implementations):
  """Within the block, this thread builds trax.models' attention with these.

  Args:
    **implementations: site name (`self_attention`, `causal_attention`,
      `cross_attention`: `SITES`) -> a registered name ('trax',
      'reference', 'auto', ...) or a layer factory; None leaves the site as
      it is (the gin binding, or an enclosing block). Every site and name is
      checked before anything is built.
  """
  tokens = [
    (site, _overrides[site].set(name))
    for site, name in _chosen(implementations).items()
  ]
  try:
    yield
  finally:
    for site, token in reversed(tokens):
      _overrides[site].reset(token)


def with_attention(model, **implementations):
  """`model` (a model function, e.g. `trax.models.Transformer`) whose
  every call builds inside `use_attention(**implementations)`: for code
  that builds later, elsewhere, or several times (`trainer_lib.train(
  model=...)`'s train, eval and predict models). In gin: `train.model =
  @trax_qkv.with_attention()`, `with_attention.model =
  @trax.models.Transformer`, `with_attention.cross_attention = 'auto'`."""
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
  """The frame Trax would name as the caller of a layer built here: the
  first outside this file, trax/layers and gin (`base._find_frame`)."""
  frame = sys._getframe(1)
  while (
    frame.f_code.co_filename == __file__
    or trax_base._find_frame(frame) is not frame
  ):
    frame = frame.f_back
  return frame


def _walk(layer):
  yield layer
  for sublayer in layer.sublayers:
    yield from _walk(sublayer)


def _record(site, implementation):
  """Writes a block's choice where gin records what each call used, as if
  gin had bound it: Trax saves that record as config.gin. (Gin has no
  public way to add to it; trax_qkv requires gin-config 0.5.0.)"""
  key = (gin.current_scope_str(), f'trax_qkv.{SITES[site].dispatcher}')
  with gin.config._OPERATIVE_CONFIG_LOCK:
    gin.config._OPERATIVE_CONFIG.setdefault(key, {})['implementation'] = (
      implementation
    )


def _check_call(factory, site, implementation, args, kwargs, frame):
  """TypeError, naming the model and the arguments, where `factory`
  cannot take what the model passes (checked before it runs, so that
  configurable_transformer's fall-back on TypeError still works)."""
  try:
    inspect.signature(factory).bind(*args, **kwargs)
  except ValueError:  # no signature to check: the call will tell
    return
  except TypeError as error:
    where = f'{frame.f_globals.get("__name__")}.{frame.f_code.co_name}'
    raise TypeError(
      f'{site} implementation {implementation!r} cannot be built where '
      f'{where} (line {frame.f_lineno}) builds trax.layers.'
      f'{SITES[site].trax_name} with {args} {kwargs}: {error}. A factory '
      "takes the built-in's arguments and **kwargs for the ones some "
      'models add.'
    ) from None


def _build(site, implementation, builtin, args, kwargs):
  """The layer `site` builds for `implementation` (None: nothing chosen,
  `builtin`, else `trax.layers`' layer). A block's choice wins."""
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
  # Layers built by this module or by trax_qkv's own layers name the
  # model's line, as the built-in's do without trax_qkv; a user's factory
  # keeps its own lines.
  model_line = {'filename': frame.f_code.co_filename, 'lineno': frame.f_lineno}
  for part in _walk(layer):
    if part._caller['filename'].startswith(_PACKAGE_DIR + os.sep):
      part._caller = dict(model_line)
  return layer


def _gin_dispatcher(site):
  """The site's gin configurable: `@trax_qkv.<dispatcher>` in a config, or
  its `implementation` bound there."""

  def dispatcher(*args, implementation=None, **kwargs):
    return _build(site.name, implementation, None, args, kwargs)

  dispatcher.__name__ = dispatcher.__qualname__ = site.dispatcher
  dispatcher.__doc__ = f"""The {site.role}: `trax.layers.{site.trax_name}`
  (its arguments, passed on as given) unless `implementation` (a name of
  `attention_implementations({site.name!r})` or a factory) or a
  `use_attention` block, which wins, chooses another."""
  return gin.configurable(site.dispatcher, module='trax_qkv')(dispatcher)


DISPATCHERS = {name: _gin_dispatcher(site) for name, site in SITES.items()}
EncoderSelfAttention = DISPATCHERS['self_attention']
DecoderSelfAttention = DISPATCHERS['causal_attention']
EncoderDecoderAttention = DISPATCHERS['cross_attention']


class Dispatcher:
  """What patch 8 puts where trax.models builds a site's layer.

  Called, it builds `builtin` (a default argument Trax bound), or where
  that is None `trax.layers`' layer as it is now, unless a block or a gin
  binding of the site's dispatcher chooses; only then does gin see it.
  """

  def __init__(self, site, builtin=None):
    self.site, self.builtin = site, builtin

  def __call__(self, *args, **kwargs):
    if _overrides[self.site].get() is None and gin.get_bindings(
      f'trax_qkv.{SITES[self.site].dispatcher}', resolve_references=False
    ):
      return DISPATCHERS[self.site](*args, **kwargs)
    return _build(self.site, None, self.builtin, args, kwargs)

  def __repr__(self):
    site = SITES[self.site]
    return (
      f'<trax_qkv.{site.dispatcher}: trax.layers.{site.trax_name} unless '
      'trax_qkv.use_attention or gin chooses another>'
    )


class LayersView(types.ModuleType):
  """`trax.layers` as one module of trax.models sees it: a `Dispatcher`
  for each site that module builds, every other name looked up in
  `trax.layers` when it is used."""

  def __init__(self, module_name):
    super().__init__('trax.layers')
    self.routed_from = module_name
    self.sites = {
      site.trax_name: Dispatcher(site.name)
      for site in SITES.values()
      if module_name in site.modules
    }

  def __getattr__(self, name):
    if name in self.sites:
      return self.sites[name]
    return getattr(trax.layers, name)

  def __repr__(self):
    return (
      f'<trax.layers as {self.routed_from} sees it: '
      f'{", ".join(self.sites)} through trax_qkv>'
    )
