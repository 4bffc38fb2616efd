"""gin registration of the layers, and clear errors for bad input."""

import gin
import jax.numpy as jnp
import pytest
import trax  # pylint: disable=unused-import  (registers trax.models in gin)
from trax import shapes

import trax_qkv
from helpers import qkv_inputs



@gin.configurable
def layer_holder(layer=gin.REQUIRED):
  return layer


def test_gin_config_builds_plugin_layer():
  gin.parse_config("""
      import trax_qkv
      layer_holder.layer = @trax_qkv.AttentionQKV
      trax_qkv.AttentionQKV.d_feature = 16
      trax_qkv.AttentionQKV.n_heads = 4
      trax_qkv.AttentionQKV.dropout = 0.1
  """)
  layer = layer_holder()(mode='train')
  assert layer.sublayers[1].sublayers[1]._dropout == 0.1  # pylint: disable=protected-access
  x = qkv_inputs()
  layer.init(shapes.signature(x))
  y, _ = layer(x)
  assert y.shape == (2, 5, 16)


def test_mode_is_denylisted_like_trax():
  with pytest.raises(ValueError, match="denylisted kwarg 'mode'"):
    gin.parse_config('trax_qkv.AttentionQKV.mode = "train"')


def test_existing_trax_transformer_config_still_parses():
  # Unqualified names used by every Trax config must stay unambiguous.
  gin.parse_config("""
      Transformer.d_model = 32
      Transformer.n_heads = 2
      AttentionQKV.n_heads = 2
      PureAttention.dropout = 0.0
      model = @trax.models.Transformer
  """)
  assert gin.query_parameter('Transformer.d_model') == 32


# Bad input: one test each, each naming the parameter and expected form.

def test_d_feature_not_divisible_by_n_heads():
  with pytest.raises(ValueError, match=r'd_feature \(10\).*divisible.*n_heads \(4\)'):
    trax_qkv.AttentionQKV(10, n_heads=4)


@pytest.mark.parametrize('n_heads,error', [(0, ValueError), (-2, ValueError),
                                           (2.0, TypeError), ('4', TypeError),
                                           (True, TypeError)])
def test_bad_n_heads(n_heads, error):
  with pytest.raises(error, match='n_heads must be a positive int'):
    trax_qkv.AttentionQKV(16, n_heads=n_heads)
  with pytest.raises(error, match='n_heads must be a positive int'):
    trax_qkv.PureAttention(n_heads=n_heads)


@pytest.mark.parametrize('dropout,error', [(1.0, ValueError), (-0.1, ValueError),
                                           (1.5, ValueError), ('0.1', TypeError)])
def test_bad_dropout(dropout, error):
  with pytest.raises(error, match=r'dropout must be .*\[0, 1\)'):
    trax_qkv.AttentionQKV(16, dropout=dropout)
  with pytest.raises(error, match=r'dropout must be .*\[0, 1\)'):
    trax_qkv.PureAttention(dropout=dropout)


def test_unknown_mode():
  with pytest.raises(ValueError, match="mode must be one of .*'predict'.*'tran'"):
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
  with pytest.raises(ValueError, match='Q and K must have the same feature size'):
    _init_error((q, k[..., :8], v, mask), trax_qkv.PureAttention(n_heads=4))
  with pytest.raises(ValueError, match=r'V feature size \(6\).*n_heads \(4\)'):
    _init_error((q, k, v[..., :6], mask), trax_qkv.PureAttention(n_heads=4))


@pytest.mark.parametrize('shape', [(2, 7), (2, 1, 1, 6), (2, 2, 1, 7),
                                   (3, 1, 1, 7), (2, 1, 4, 7)])
def test_mask_not_broadcastable(shape):
  q, k, v, _ = qkv_inputs()
  with pytest.raises(ValueError, match=r'mask must be broadcastable to \(batch, 1, Lq, Lk\)'):
    _init_error((q, k, v, jnp.ones(shape, bool)))


def test_integer_inputs():
  q, k, v, mask = qkv_inputs()
  with pytest.raises(TypeError, match='Q must be a floating-point array.*int32'):
    _init_error((q.astype(jnp.int32), k, v, mask))


def test_wrong_rank():
  q, k, v, mask = qkv_inputs()
  with pytest.raises(ValueError, match=r'K must have shape \(batch, length, features\)'):
    _init_error((q, k[0], v, mask))
