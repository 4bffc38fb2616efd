"""gin registration of the layers, and clear errors for bad input."""

import importlib
import pkgutil

import gin
from helpers import qkv_inputs
import jax.numpy as jnp
import pytest
import trax
from trax import shapes

import trax_qkv


@gin.configurable
def layer_holder(layer=gin.REQUIRED):
  return layer


def test_gin_config_builds_plugin_layer():
  gin.parse_config("""
      import trax_qkv
      layer_holder.layer = @trax_qkv.QkvAttentionQKV
      trax_qkv.QkvAttentionQKV.d_feature = 16
      trax_qkv.QkvAttentionQKV.n_heads = 4
      trax_qkv.QkvAttentionQKV.dropout = 0.1
  """)
  layer = layer_holder()(mode='train')
  assert layer.sublayers[1].sublayers[1]._dropout == 0.1
  x = qkv_inputs()
  layer.init(shapes.signature(x))
  y, _ = layer(x)
  assert y.shape == (2, 5, 16)


def test_mode_is_denylisted_like_trax():
  with pytest.raises(ValueError, match="denylisted kwarg 'mode'"):
    gin.parse_config('trax_qkv.QkvAttentionQKV.mode = "train"')


def _import_all(package):
  """Imports every module of `package` that imports (not its tests), so that
  every gin configurable it registers is registered."""
  for module in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):
    if not module.name.endswith('_test'):
      try:
        importlib.import_module(module.name)
      except ImportError:  # modules of Trax's that no longer import
        pass


def _short_names():
  """{short name: [complete selectors]} of every registered configurable."""
  names = {}
  for selector in gin.config._REGISTRY._selector_map:
    names.setdefault(selector.split('.')[-1], []).append(selector)
  return names


def test_no_configurable_of_ours_shares_a_short_name_with_trax():
  # gin resolves an unqualified selector by its last name: a configurable
  # of ours named like one of Trax's would make the Trax config ambiguous.
  _import_all(trax)
  _import_all(trax_qkv)
  ours = [
    s for s in gin.config._REGISTRY._selector_map if s.startswith('trax_qkv.')
  ]
  assert 'trax_qkv.QkvCausalAttention' in ours
  shared = {
    short: selectors
    for short, selectors in _short_names().items()
    if len(selectors) > 1 and any(s.startswith('trax_qkv.') for s in selectors)
  }
  assert not shared


def test_trax_configs_keep_parsing_after_import():
  """Every unqualified name of a Trax configurable (that is not ambiguous
  without trax_qkv) still resolves, and the lines of Trax's configs that
  broke with 0.2.0 parse."""
  _import_all(trax)
  names = []
  for short, selectors in _short_names().items():
    theirs = [s for s in selectors if not s.startswith('trax_qkv.')]
    if len(theirs) == 1 and theirs[0].startswith('trax.'):
      names.append(short)
  assert {'Attention', 'CausalAttention', 'DotProductCausalAttention'} <= set(
    names
  )
  for short in names:
    gin.parse_config(f'layer_holder.layer = @{short}')
  # As in Trax's lm1b, c4 and reformer configs.
  gin.parse_config("""
      enc_attn_type = @Attention
      dec_attn_type = @CausalAttention
      DotProductCausalAttention.dropout = 0.1
      ReformerLM.attention_type = @CausalAttention
      Transformer.d_model = 32
      model = @trax.models.Transformer
  """)
  assert gin.query_parameter('DotProductCausalAttention.dropout') == 0.1
  reference = gin.query_parameter('ReformerLM.attention_type')
  assert reference.configurable.selector == 'trax.layers.CausalAttention'


# Bad input: one test each, each naming the parameter and expected form.


def test_d_feature_not_divisible_by_n_heads():
  with pytest.raises(
    ValueError, match=r'd_feature \(10\).*divisible.*n_heads \(4\)'
  ):
    trax_qkv.AttentionQKV(10, n_heads=4)


@pytest.mark.parametrize(
  'n_heads,error',
  [
    (0, ValueError),
    (-2, ValueError),
    (2.0, TypeError),
    ('4', TypeError),
    (True, TypeError),
  ],
)
def test_bad_n_heads(n_heads, error):
  with pytest.raises(error, match='n_heads must be a positive int'):
    trax_qkv.AttentionQKV(16, n_heads=n_heads)
  with pytest.raises(error, match='n_heads must be a positive int'):
    trax_qkv.PureAttention(n_heads=n_heads)


@pytest.mark.parametrize(
  'dropout,error',
  [
    (1.0, ValueError),
    (-0.1, ValueError),
    (1.5, ValueError),
    ('0.1', TypeError),
  ],
)
def test_bad_dropout(dropout, error):
  with pytest.raises(error, match=r'dropout must be .*\[0, 1\)'):
    trax_qkv.AttentionQKV(16, dropout=dropout)
  with pytest.raises(error, match=r'dropout must be .*\[0, 1\)'):
    trax_qkv.PureAttention(dropout=dropout)


def test_unknown_mode():
  with pytest.raises(
    ValueError, match="mode must be one of .*'predict'.*'tran'"
  ):
    trax_qkv.AttentionQKV(16, mode='tran')


@pytest.mark.parametrize('name', ['q_sparsity', 'result_sparsity'])
@pytest.mark.parametrize('value', ['dense', 3, 0])
def test_unknown_sparsity(name, value):
  with pytest.raises(ValueError, match=f"{name} must be None, 'noop'"):
    trax_qkv.AttentionQKV(16, **{name: value})


def _init_error(x, layer=None):
  layer = layer or trax_qkv.AttentionQKV(16, n_heads=4)
  layer.init(shapes.signature(x))


def test_batch_sizes_differ():
  q, k, v, mask = qkv_inputs()
  with pytest.raises(ValueError, match='same batch size.*2, 1, 2'):
    _init_error((q, k[:1], v, mask))


def test_key_and_value_lengths_differ():
  q, k, v, mask = qkv_inputs()
  with pytest.raises(ValueError, match='K and V must have the same length'):
    _init_error((q, k, v[:, :3], mask))


def test_feature_sizes_dont_match():
  q, k, v, mask = qkv_inputs()
  with pytest.raises(
    ValueError, match='Q and K must have the same feature size'
  ):
    _init_error((q, k[..., :8], v, mask), trax_qkv.PureAttention(n_heads=4))
  with pytest.raises(ValueError, match=r'V feature size \(6\).*n_heads \(4\)'):
    _init_error((q, k, v[..., :6], mask), trax_qkv.PureAttention(n_heads=4))


@pytest.mark.parametrize(
  'shape', [(2, 7), (2, 1, 1, 6), (2, 2, 1, 7), (3, 1, 1, 7), (2, 1, 4, 7)]
)
def test_mask_not_broadcastable(shape):
  q, k, v, _ = qkv_inputs()
  with pytest.raises(
    ValueError, match=r'mask must be broadcastable to \(batch, 1, Lq, Lk\)'
  ):
    _init_error((q, k, v, jnp.ones(shape, bool)))


def test_integer_inputs():
  q, k, v, mask = qkv_inputs()
  with pytest.raises(
    TypeError, match='Q must be a floating-point array.*int32'
  ):
    _init_error((q.astype(jnp.int32), k, v, mask))


def test_wrong_rank():
  q, k, v, mask = qkv_inputs()
  with pytest.raises(
    ValueError, match=r'K must have shape \(batch, length, features\)'
  ):
    _init_error((q, k[0], v, mask))
