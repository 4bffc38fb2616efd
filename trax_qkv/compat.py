"""The first release's names and API, kept as thin aliases until REMOVED_IN.

trax_qkv 0.1 selected cross-attention only, with its own vocabulary; today
every site is selected the same way (`trax_qkv.use_attention`,
`register_attention`, per-site gin dispatchers, `model.json`'s `attention`
entry). Each alias here warns with `QkvDeprecationWarning` (a
DeprecationWarning) saying what to use instead; nothing else in trax_qkv
uses them.
"""

import warnings

import gin
import trax.models

from trax_qkv.models import registry

# Announced for 0.4.0 by 0.3.0; moved to 0.5.0 by 0.4.0 (CHANGELOG.md).
REMOVED_IN = '0.5.0'
# The first release's implementation names -> today's. Fixed: kernels added
# since never had an old name.
DEPRECATED_NAMES = {
  'trax_qkv': 'reference',
  'trax_qkv_fused': 'fused',
  'trax_qkv_chunked': 'chunked',
  'trax_qkv_cudnn': 'cudnn',
  'trax_qkv_auto': 'auto',
}


class QkvDeprecationWarning(DeprecationWarning):
  """A name or function of trax_qkv that REMOVED_IN removes."""


def _deprecated(old, new):
  warnings.warn(
    f'trax_qkv: {old} is deprecated and will be removed in trax_qkv '
    f'{REMOVED_IN}; use {new}.',
    QkvDeprecationWarning,
    stacklevel=4,
  )


def _warn_renamed(old, new):
  _deprecated(f'the attention name {old!r}', repr(new))


for _old, _new in DEPRECATED_NAMES.items():
  registry.rename(_old, _new, _warn_renamed)


def register_cross_attention(name, factory):
  """Deprecated: `register_attention('cross_attention', name, factory)`."""
  _deprecated(
    'register_cross_attention', "register_attention('cross_attention', ...)"
  )
  registry.register_attention('cross_attention', name, factory)


def cross_attention_implementations():
  """Deprecated: `attention_implementations('cross_attention')`."""
  _deprecated(
    'cross_attention_implementations',
    "attention_implementations('cross_attention')",
  )
  return registry.attention_implementations('cross_attention')


def resolve_cross_attention(implementation):
  """Deprecated: `resolve_attention('cross_attention', implementation)`."""
  _deprecated(
    'resolve_cross_attention', "resolve_attention('cross_attention', ...)"
  )
  return registry.resolve_attention('cross_attention', implementation)


def use_cross_attention(implementation):
  """Deprecated: `use_attention(cross_attention=implementation)`."""
  _deprecated('use_cross_attention', 'use_attention(cross_attention=...)')
  return registry.use_attention(cross_attention=implementation)


@gin.configurable(module='trax_qkv', denylist=['mode'])
def CrossAttentionTransformer(
  input_vocab_size, cross_attention='reference', **transformer
):
  """Deprecated: `trax.models.Transformer(input_vocab_size, **transformer)`
  built inside `use_attention(cross_attention=cross_attention)`."""
  _deprecated(
    'CrossAttentionTransformer',
    'trax.models.Transformer inside trax_qkv.use_attention('
    'cross_attention=...)',
  )
  with registry.use_attention(cross_attention=cross_attention):
    return trax.models.Transformer(input_vocab_size, **transformer)
