"""One record per kernel: a toy kernel added as a module (toy_kernel.py) and
one `kernels.register` call works everywhere a kernel name is taken --
`resolve`, 'auto''s rule, the layers of all three sites, gin,
`use_attention` in every site, and the benchmarks' lists -- with nothing
else edited."""

import dataclasses

from helpers import TINY_TRANSFORMER
from helpers import qkv_inputs
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import toy_kernel
import trax
from trax import shapes

import trax_qkv
from trax_qkv import kernels
from trax_qkv.benchmarks import kernels as kernel_bench
from trax_qkv.benchmarks import layers as layer_bench
from trax_qkv.models import registry

RTOL = 1e-5
VOCAB = 40
TRANSFORMER = dict(TINY_TRANSFORMER, dropout=0.0)


@pytest.fixture
def toy():
  kernels.register(toy_kernel.RECORD)
  toy_kernel.CALLS.clear()
  yield toy_kernel.CALLS
  kernels.unregister('toy')


def _close(a, b):
  for x, y in zip(
    jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True
  ):
    np.testing.assert_allclose(x, y, rtol=RTOL, atol=1e-6)


def test_resolve_and_auto_take_the_record(toy):
  assert 'toy' in kernels.names()
  q, k, _, _ = qkv_inputs(lk=7)
  seven = kernels.Call(q.shape, k.shape, q.dtype, 2)
  assert kernels.resolve('toy', seven).name == 'toy'
  assert kernels.choose(seven) == 'toy'  # its rule, asked first
  eight = kernels.Call(q.shape, (2, 8, 16), q.dtype, 2)
  assert kernels.choose(eight) != 'toy'
  for site in registry.SITES:
    assert 'toy' in trax_qkv.attention_implementations(site)
  kernels.unregister('toy')
  with pytest.raises(ValueError, match='implementation must be one of'):
    kernels.resolve('toy', seven)


@pytest.mark.slow
@pytest.mark.parametrize('implementation', ['toy', 'auto'])
def test_every_layer_runs_it(toy, implementation):
  x = qkv_inputs(lk=7)
  rng = jax.random.PRNGKey(0)
  ours = trax_qkv.AttentionQKV(16, n_heads=2, implementation=implementation)
  theirs = trax.layers.AttentionQKV(16, n_heads=2)
  weights, state = theirs.init(shapes.signature(x), rng=rng)
  ours.init(shapes.signature(x), rng=rng)
  _close(
    ours.pure_fn(x, weights, state, rng)[0],
    theirs.pure_fn(x, weights, state, rng)[0],
  )
  assert toy['attend'] >= 1

  self_x = (x[1], x[3])  # K's 7 positions
  ours = trax_qkv.Attention(16, n_heads=2, implementation=implementation)
  theirs = trax.layers.Attention(16, n_heads=2)
  weights, state = theirs.init(shapes.signature(self_x), rng=rng)
  ours.init(shapes.signature(self_x), rng=rng)
  _close(
    ours.pure_fn(self_x, weights, state, rng)[0],
    theirs.pure_fn(self_x, weights, state, rng)[0],
  )

  if implementation == 'toy':  # causal: 'auto''s rule sees L = Lk = 7
    for mode, entry in (('train', 'causal'), ('predict', 'cached')):
      ours = trax_qkv.CausalAttention(
        16, n_heads=2, mode=mode, implementation='toy'
      )
      theirs = trax.layers.CausalAttention(16, n_heads=2, mode=mode)
      seq = x[0][:, :1] if mode == 'predict' else x[0]
      weights, state = theirs.init(shapes.signature(seq), rng=rng)
      ours.init(shapes.signature(seq), rng=rng)
      _close(
        ours.pure_fn(seq, weights, state, rng)[0],
        theirs.pure_fn(seq, weights, state, rng)[0],
      )
      assert toy[entry] >= 1


def _transformer_outputs(mode='eval'):
  src = jnp.asarray(
    np.random.RandomState(0).randint(2, VOCAB, (2, 7)), jnp.int32
  )
  model = trax.models.Transformer(VOCAB, mode=mode, **TRANSFORMER)
  model.init(shapes.signature((src, src)), rng=jax.random.PRNGKey(0))
  return model((src, src))


@pytest.mark.slow
def test_use_attention_runs_it_in_every_site(toy):
  expected = _transformer_outputs()
  with trax_qkv.use_attention(**dict.fromkeys(registry.SITES, 'toy')):
    got = _transformer_outputs()
  _close(got, expected)
  assert toy['attend'] >= 2 and toy['causal'] >= 1  # self, cross; causal


def test_gin_selects_it_in_every_site(toy):
  import gin

  gin.parse_config(
    [
      f"trax_qkv.{site.dispatcher}.implementation = 'toy'"
      for site in registry.SITES.values()
    ]
  )
  got = _transformer_outputs()
  gin.clear_config()
  _close(got, _transformer_outputs())
  assert toy['attend'] >= 2 and toy['causal'] >= 1


def test_the_benchmarks_list_it(toy):
  assert 'toy' in kernel_bench.implementations_for(jnp.float32)
  assert 'toy' in layer_bench.contenders()


def _projection_types(layer):
  found = set()
  for sublayer in layer.sublayers:
    if type(sublayer).__name__ in ('Dense', 'RowsDense'):
      found.add(type(sublayer).__name__)
    found |= _projection_types(sublayer)
  return found


def test_the_records_traits_choose_the_projection(toy):
  exact = dataclasses.replace(toy_kernel.RECORD, name='toy_exact', exact=True)
  kernels.register(exact)
  try:
    for implementation, projection in (
      ('toy', 'RowsDense'),
      ('auto', 'RowsDense'),
      ('toy_exact', 'Dense'),
      ('reference', 'Dense'),
    ):
      for layer in (
        trax_qkv.AttentionQKV(16, n_heads=2, implementation=implementation),
        trax_qkv.CausalAttention(16, n_heads=2, implementation=implementation),
      ):
        assert _projection_types(layer) == {projection}, implementation
  finally:
    kernels.unregister('toy_exact')
  # A kernel that does not count its logits gets no roof ceiling.
  assert toy_kernel.RECORD.logits_computed is None
  assert [k.name for k in kernels.KERNELS.values() if k.exact] == ['reference']
