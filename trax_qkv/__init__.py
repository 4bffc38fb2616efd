"""trax_qkv: drop-in, gin-configurable attention layers for Trax.

    import trax_qkv
    layer = trax_qkv.AttentionQKV(d_feature=256, n_heads=8, mode='train')

Layout: `kernels` (the attention math, pure JAX), `layers` (Trax layers over
it), `models` (which attention trax.models' Transformers use) and `patches`
(every change to Trax) are the core; `data`, `supervised` (training with
exact resume, decoding, scoring) and `validation` are the translation
pipeline; `benchmarks` times them; `cli` holds the console commands;
`compat` the first release's names.

Importing the package registers its gin configurables under the module
`trax_qkv`, the layers with a `Qkv` prefix (`@trax_qkv.QkvAttentionQKV`,
`@trax_qkv.QkvCausalAttention`, ...): gin resolves an unqualified selector
by its last name, so a configurable named `CausalAttention` would make
every Trax config that writes `@CausalAttention` ambiguous. It also makes
the attention of every model of trax.models selectable per site
(`use_attention`, `with_attention`, gin); until you choose, the models,
their gin record and their error messages are Trax's own. Without Trax
installed only `trax_qkv.kernels` (and `trax_qkv.benchmarks.kernels`) can
be used.
"""

import importlib.util
import warnings

from trax_qkv import import_patches as _import_patches

__version__ = '0.4.0'

_import_patches.install()  # before Trax is imported: patches 6 and 9
try:
  import trax as _trax
except ImportError as _error:  # JAX alone: the kernels still work
  _import_patches.uninstall()
  if isinstance(_error, ModuleNotFoundError) and _error.name == 'trax':
    _TRAX_IMPORT_ERROR = "Trax is not installed (pip install 'trax==1.4.1')"
  else:
    _TRAX_IMPORT_ERROR = _import_patches.import_failure(_error)
    warnings.warn(f'trax_qkv: {_TRAX_IMPORT_ERROR}', stacklevel=2)
else:
  _TRAX_IMPORT_ERROR = None
  del _trax
  from trax_qkv import compat
  from trax_qkv import patches
  from trax_qkv.compat import CrossAttentionTransformer
  from trax_qkv.compat import cross_attention_implementations
  from trax_qkv.compat import register_cross_attention
  from trax_qkv.compat import use_cross_attention
  from trax_qkv.layers import Attention
  from trax_qkv.layers import AttentionQKV
  from trax_qkv.layers import CausalAttention
  from trax_qkv.layers import DotProductCausalAttention
  from trax_qkv.layers import PureAttention
  from trax_qkv.models import variants as _variants
  from trax_qkv.models.registry import DecoderSelfAttention
  from trax_qkv.models.registry import EncoderDecoderAttention
  from trax_qkv.models.registry import EncoderSelfAttention
  from trax_qkv.models.registry import attention_implementations
  from trax_qkv.models.registry import register_attention
  from trax_qkv.models.registry import use_attention
  from trax_qkv.models.registry import with_attention

  patches.apply()
  _variants.register()


def __getattr__(name):
  # Submodules stay importable without Trax (`from trax_qkv import kernels`).
  if (
    _TRAX_IMPORT_ERROR is not None
    and not name.startswith('_')
    and importlib.util.find_spec(f'{__name__}.{name}') is None
  ):
    raise ImportError(f'trax_qkv.{name} needs Trax: {_TRAX_IMPORT_ERROR}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
