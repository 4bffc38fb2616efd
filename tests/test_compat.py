"""trax_qkv.compat: the first release's names and API still work, each with
a QkvDeprecationWarning that names what to use and the removal version."""

import re

import gin
from helpers import TINY_TRANSFORMER
import pytest
import trax
from trax import layers as tl

import trax_qkv
from trax_qkv import compat
from trax_qkv import kernels
from trax_qkv.models import registry

VOCAB = 40
CONFIG = dict(TINY_TRANSFORMER, mode='eval')


def _layer_types(model):
  found = [type(model)]
  for sub in model.sublayers:
    found += _layer_types(sub)
  return found


def _deprecated(match):
  """Expects a QkvDeprecationWarning matching `match` that names the
  removal version."""
  removed = re.escape(f'removed in trax_qkv {compat.REMOVED_IN}')
  return pytest.warns(
    compat.QkvDeprecationWarning, match=f'(?=.*{removed}).*{match}'
  )


def test_the_deprecated_names_are_a_fixed_list():
  assert compat.DEPRECATED_NAMES == {
    'trax_qkv': 'reference',
    'trax_qkv_fused': 'fused',
    'trax_qkv_chunked': 'chunked',
    'trax_qkv_cudnn': 'cudnn',
    'trax_qkv_auto': 'auto',
  }
  assert set(compat.DEPRECATED_NAMES.values()) <= set(kernels.names())


@pytest.mark.parametrize('old,new', sorted(compat.DEPRECATED_NAMES.items()))
def test_first_release_names_build_todays_layers(old, new):
  with _deprecated(f'{old!r} is deprecated'):
    factory = registry.resolve_attention('cross_attention', old)
  assert factory.keywords == {'implementation': new}
  if kernels.KERNELS.get(new) and kernels.KERNELS[new].unsupported_reason(
    None, 0.0
  ):
    return  # 'cudnn' without a GPU: the layer itself refuses to be built
  with _deprecated(f'the attention name {old!r} is deprecated.*use {new!r}'):
    with trax_qkv.use_attention(cross_attention=old):
      old_model = trax.models.Transformer(VOCAB, **CONFIG)
  with trax_qkv.use_attention(cross_attention=new):
    new_model = trax.models.Transformer(VOCAB, **CONFIG)
  assert _layer_types(old_model) == _layer_types(new_model)


def test_first_release_names_in_gin():
  with gin.unlock_config():
    gin.bind_parameter(
      'trax_qkv.EncoderDecoderAttention.implementation', 'trax_qkv_auto'
    )
  with _deprecated("'trax_qkv_auto' is deprecated"):
    model = trax.models.Transformer(VOCAB, **CONFIG)
  assert trax_qkv.PureAttention in _layer_types(model)


def test_first_release_api():
  with _deprecated('CrossAttentionTransformer'):
    old = trax_qkv.CrossAttentionTransformer(
      VOCAB, cross_attention='fused', **CONFIG
    )
  with trax_qkv.use_attention(cross_attention='fused'):
    new = trax.models.Transformer(VOCAB, **CONFIG)
  assert _layer_types(old) == _layer_types(new)
  with _deprecated('use_cross_attention'):
    with trax_qkv.use_cross_attention('fused'):
      inside = trax.models.Transformer(VOCAB, **CONFIG)
  assert _layer_types(inside) == _layer_types(new)
  with _deprecated('register_cross_attention'):
    trax_qkv.register_cross_attention('old_api', tl.AttentionQKV)
  with _deprecated('cross_attention_implementations'):
    assert 'old_api' in trax_qkv.cross_attention_implementations()
  with _deprecated('resolve_cross_attention'):
    assert compat.resolve_cross_attention('old_api') is tl.AttentionQKV
