"""trax_qkv layers against trax.layers on the same seed: bit-identical."""

import os
import tempfile

from helpers import assert_trees_equal
from helpers import qkv_inputs
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes

import trax_qkv

RNG = jax.random.PRNGKey(42)
FORWARD_RNG = jax.random.PRNGKey(7)

CASES = {
  'padding': dict(),
  'one_head': dict(n_heads=1),
  'batch1': dict(batch=1, pad_from=None),
  'lq_gt_lk': dict(lq=9, lk=3, pad_from=2),
  'partial_rows': dict(mask_shape='partial_rows'),
  'many_heads': dict(n_heads=16, d=32),
  'kv_features_differ': dict(d_k=12, d_v=20),
}


def _case(name):
  kw = dict(batch=2, lq=5, lk=7, d=16, pad_from=4, n_heads=4)
  kw.update(CASES[name])
  n_heads = kw.pop('n_heads')
  return n_heads, kw['d'], qkv_inputs(**kw)


def _pair(d, n_heads, **kw):
  return (
    tl.AttentionQKV(d, n_heads=n_heads, **kw),
    trax_qkv.AttentionQKV(d, n_heads=n_heads, **kw),
  )


def _init(layer, x):
  return layer.init(shapes.signature(x), rng=RNG)


@pytest.mark.parametrize('case', sorted(CASES))
def test_init_weights_identical(case):
  n_heads, d, x = _case(case)
  builtin, plugin = _pair(d, n_heads)
  w_builtin, s_builtin = _init(builtin, x)
  w_plugin, s_plugin = _init(plugin, x)
  assert len(jax.tree_util.tree_leaves(w_plugin)) == 8  # Wq,bq,...,Wo,bo
  assert_trees_equal(w_builtin, w_plugin)
  assert_trees_equal(s_builtin, s_plugin)


@pytest.mark.parametrize('case', sorted(CASES))
@pytest.mark.parametrize(
  'mode,dropout',
  [
    ('eval', 0.0),
    ('train', 0.0),
    ('train', 0.1),
    ('train', 0.3),
    ('predict', 0.0),
    ('viz', 0.0),
    ('viz', 0.2),
  ],
)
def test_forward_and_state_identical(case, mode, dropout):
  n_heads, d, x = _case(case)
  builtin, plugin = _pair(d, n_heads, dropout=dropout, mode=mode)
  w, s = _init(builtin, x)
  y_builtin, s_builtin = builtin.pure_fn(x, w, s, FORWARD_RNG)
  y_plugin, s_plugin = plugin.pure_fn(x, w, s, FORWARD_RNG)
  assert_trees_equal(y_builtin, y_plugin)
  assert_trees_equal(s_builtin, s_plugin)
  if mode == 'viz':  # the attention weights are the layer's state
    weights = jax.tree_util.tree_leaves(s_plugin)
    assert len(weights) == 1 and weights[0].shape[1] == n_heads


def test_dropout_masks_depend_on_rng_like_builtin():
  """Dropout is real: other keys change both layers' outputs identically."""
  n_heads, d, x = _case('padding')
  builtin, plugin = _pair(d, n_heads, dropout=0.3, mode='train')
  w, s = _init(builtin, x)
  outputs = {}
  for key in (1, 2):
    rng = jax.random.PRNGKey(key)
    outputs[key] = plugin.pure_fn(x, w, s, rng)[0][0]
    assert np.array_equal(outputs[key], builtin.pure_fn(x, w, s, rng)[0][0])
  assert not np.array_equal(outputs[1], outputs[2])


@pytest.mark.parametrize('case', ['padding', 'lq_gt_lk', 'many_heads'])
@pytest.mark.parametrize('dropout', [0.0, 0.1])
def test_gradients_identical(case, dropout):
  n_heads, d, x = _case(case)
  builtin, plugin = _pair(d, n_heads, dropout=dropout, mode='train')
  w, s = _init(builtin, x)
  q, k, v, mask = x

  def loss(layer):
    def f(weights, q, k, v):
      y, _ = layer.pure_fn((q, k, v, mask), weights, s, FORWARD_RNG)
      return jnp.sum(y[0] * jnp.arange(y[0].size).reshape(y[0].shape) / 100)

    return jax.grad(f, argnums=(0, 1, 2, 3))

  assert_trees_equal(loss(builtin)(w, q, k, v), loss(plugin)(w, q, k, v))


def test_pure_attention_identical_in_every_mode():
  x = qkv_inputs(pad_from=3)
  for mode, dropout in [('eval', 0.0), ('train', 0.25), ('viz', 0.0)]:
    builtin = tl.PureAttention(n_heads=4, dropout=dropout, mode=mode)
    plugin = trax_qkv.PureAttention(n_heads=4, dropout=dropout, mode=mode)
    w, s = builtin.init(shapes.signature(x), rng=RNG)
    assert_trees_equal((w, s), plugin.init(shapes.signature(x), rng=RNG))
    assert_trees_equal(
      builtin.pure_fn(x, w, s, FORWARD_RNG),
      plugin.pure_fn(x, w, s, FORWARD_RNG),
    )


@pytest.mark.parametrize(
  'q_sparsity,result_sparsity', [('noop', None), (None, 'noop'), (4, 4)]
)
def test_sparsity_options_identical(q_sparsity, result_sparsity):
  n_heads, d, x = _case('padding')
  builtin, plugin = _pair(
    d,
    n_heads,
    q_sparsity=q_sparsity,
    result_sparsity=result_sparsity,
    mode='eval',
  )
  w, s = _init(builtin, x)
  assert_trees_equal((w, s), _init(plugin, x))
  assert_trees_equal(
    builtin.pure_fn(x, w, s, FORWARD_RNG), plugin.pure_fn(x, w, s, FORWARD_RNG)
  )


@pytest.mark.parametrize('implementation', ['reference', 'auto'])
def test_predict_with_kv_cache_matches_eval_and_reuses_cache(implementation):
  n_heads, d, x = _case('padding')
  q, k, v, mask = x
  layer = trax_qkv.AttentionQKV(
    d,
    n_heads=n_heads,
    mode='predict',
    cache_KV_in_predict=True,
    implementation=implementation,
  )
  builtin = tl.AttentionQKV(
    d, n_heads=n_heads, mode='predict', cache_KV_in_predict=True
  )
  step_sig = shapes.signature((q[:, :1], k, v, mask))
  w, state = layer.init(step_sig, rng=RNG)
  w_builtin, builtin_state = builtin.init(step_sig, rng=RNG)
  assert_trees_equal((w_builtin, builtin_state), (w, state))

  # Cache() nests the K/V Dense weights one level deeper; same leaves.
  eval_layer = trax_qkv.AttentionQKV(d, n_heads=n_heads, mode='eval')
  eval_layer.init(shapes.signature(x))
  eval_layer.weights = jax.tree_util.tree_unflatten(
    jax.tree_util.tree_structure(eval_layer.weights),
    jax.tree_util.tree_leaves(w),
  )
  full, _ = eval_layer(x)
  for position in range(q.shape[1]):
    # After the first step K and V come from the cache: feeding garbage
    # instead must not change the result.
    k_in, v_in = (k, v) if position == 0 else (k * 0 + 1e3, v * 0 - 1e3)
    step = (q[:, position : position + 1], k_in, v_in, mask)
    y, state = layer.pure_fn(step, w, state, FORWARD_RNG)
    y_builtin, builtin_state = builtin.pure_fn(
      step, w, builtin_state, FORWARD_RNG
    )
    assert_trees_equal(y_builtin, y)
    np.testing.assert_allclose(
      y[0][:, 0], full[:, position], rtol=1e-5, atol=1e-6
    )
  if implementation == 'reference':  # Trax's state tree, leaf for leaf
    assert_trees_equal(builtin_state, state)
    return
  # Elsewhere the attention keeps the cached K and V split into heads, the
  # keys transposed (`CachedKVPureAttention`), beside the built-in's state.
  parallel, heads, output = state[1]
  assert_trees_equal(
    builtin_state, (state[0], (parallel, (), output), state[2])
  )
  (_, (k_cached, _), (v_cached, _)) = parallel
  reference = trax_qkv.kernels.reference
  assert_trees_equal(
    heads,
    (
      reference.keys_transposed(reference.split_heads(k_cached, n_heads)),
      reference.split_heads(v_cached, n_heads),
    ),
  )


def test_checkpoints_move_both_ways():
  n_heads, d, x = _case('padding')
  sig = shapes.signature(x)
  with tempfile.TemporaryDirectory() as tmp:
    for source, target in [
      (
        tl.AttentionQKV(d, n_heads=n_heads, mode='eval'),
        trax_qkv.AttentionQKV(d, n_heads=n_heads, mode='eval'),
      ),
      (
        trax_qkv.AttentionQKV(d, n_heads=n_heads, mode='eval'),
        tl.AttentionQKV(d, n_heads=n_heads, mode='eval'),
      ),
    ]:
      source.init(sig, rng=jax.random.PRNGKey(3))
      path = os.path.join(tmp, 'layer.pkl.gz')
      source.save_to_file(path, input_signature=sig)
      target.init_from_file(path)
      assert_trees_equal(source.weights, target.weights)
      assert_trees_equal(source(x), target(x))


def test_runs_under_jit_and_accelerate():
  n_heads, d, x = _case('padding')
  builtin, plugin = _pair(d, n_heads, mode='eval')
  w, s = _init(builtin, x)
  jitted = jax.jit(lambda x, w, s: plugin.pure_fn(x, w, s, FORWARD_RNG))
  assert_trees_equal(
    builtin.pure_fn(x, w, s, FORWARD_RNG)[0], jitted(x, w, s)[0]
  )
  # Accelerate jits the whole layer and splits the batch over devices.
  plugin.init(shapes.signature(x), rng=RNG)
  accelerated = tl.Accelerate(plugin)
  expected = builtin(x, weights=plugin.weights)
  assert_trees_equal(expected[0], accelerated(x)[0])
