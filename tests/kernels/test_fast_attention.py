"""Every attention implementation against the reference (float32, 1e-5)."""

import functools

from helpers import jitted_forward_and_gradients
from helpers import qkv_inputs
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import shapes
from trax.layers import core

import trax_qkv
from trax_qkv import kernels
from trax_qkv.kernels import chunked
from trax_qkv.kernels import cudnn
from trax_qkv.kernels import fused
from trax_qkv.kernels import reference as reference_math
from trax_qkv.layers import attention as attention_layers

RTOL = 1e-5
# 'cudnn' runs on a GPU only (bf16/fp16); elsewhere asking for it raises.
ON_CUDNN = cudnn.unsupported_reason(jnp.bfloat16) is None
FAST = ('fused', 'chunked', 'auto')
# The math tests also run 'fused' with steps of query blocks.
FAST_MATH = FAST + ('fused:query_blocks',)
CASES = {
  'padding': dict(lq=5, lk=7, pad_from=4),
  'lq_ne_lk': dict(lq=11, lk=23, pad_from=9),
  'partial_rows': dict(lq=6, lk=10, mask_shape='partial_rows'),
  'one_head': dict(lq=5, lk=7, pad_from=2, n_heads=1),
  'many_heads': dict(lq=5, lk=7, d=64, n_heads=16),
  'batch1': dict(batch=1, lq=3, lk=13),
}


def _case(name, fully_masked_row=True):
  kw = dict(batch=2, d=16, n_heads=4)
  kw.update(CASES[name])
  n_heads = kw.pop('n_heads')
  q, k, v, mask = qkv_inputs(**kw)
  if fully_masked_row and q.shape[0] > 1:
    mask = mask.at[0].set(False)  # every key of example 0 masked
  return n_heads, (q, k, v, mask)


def _implementation(name):
  if name == 'chunked':  # small blocks, so several blocks and a ragged last
    return functools.partial(chunked.chunked_attention, block_size=4)
  if name == 'fused':  # one query of one (batch, head) pair per step
    return functools.partial(fused.fused_attention, step_elements=1)
  if name == 'fused:query_blocks':  # 2 queries per step, odd Lq padded
    return lambda q, k, v, *rest: fused.fused_attention(
      q, k, v, *rest, step_elements=2 * k.shape[1]
    )
  return functools.partial(kernels.attend, implementation=name)


def _relative_error(x, reference):
  return float(
    jnp.max(jnp.abs(x - reference))
    / jnp.maximum(jnp.max(jnp.abs(reference)), 1e-30)
  )


def _assert_gradients_close(got, expected):
  """Leaf by leaf within RTOL of the largest expected gradient: bk's true
  gradient is 0 (softmax ignores a constant added to a row of logits), so
  both sides are rounding noise there and a per-leaf ratio means nothing."""
  assert len(got) == len(expected)
  scale = max(float(jnp.max(jnp.abs(g))) for g in expected)
  for g_got, g_expected in zip(got, expected):
    assert float(jnp.max(jnp.abs(g_got - g_expected))) / scale < RTOL


def _layer_gradients(layer, weights, state, inputs, rng):
  """Leaves of d sum(sin(output)) / d (weights, q, k, v) of an AttentionQKV."""
  mask = inputs[3]
  loss = lambda w, q, k, v: jnp.sum(
    jnp.sin(layer.pure_fn((q, k, v, mask), w, state, rng)[0][0])
  )
  return jax.tree_util.tree_leaves(
    jax.grad(loss, argnums=(0, 1, 2, 3))(weights, *inputs[:3])
  )


@pytest.mark.parametrize('case', sorted(CASES))
@pytest.mark.parametrize('name', FAST_MATH)
def test_forward_and_gradients_match_reference(case, name):
  n_heads, (q, k, v, mask) = _case(case)
  fast = _implementation(name)

  def reference(q, k, v):
    return reference_math.dot_product_attention(q, k, v, mask, n_heads)[0]

  def candidate(q, k, v):
    return fast(q, k, v, mask, n_heads)

  cotangent = jax.random.normal(jax.random.PRNGKey(3), q.shape)
  forward, grads = jitted_forward_and_gradients(candidate, cotangent, q, k, v)
  expected_forward, expected_grads = jitted_forward_and_gradients(
    reference, cotangent, q, k, v
  )
  assert _relative_error(forward, expected_forward) < RTOL
  for g_candidate, g_reference in zip(grads, expected_grads):
    assert _relative_error(g_candidate, g_reference) < RTOL


def test_fully_masked_rows_match_trax():
  """Trax weighs every key by 1 in a fully masked row; all paths agree."""
  n_heads, (q, k, v, mask) = _case('padding')
  ref = reference_math.dot_product_attention(q, k, v, mask, n_heads)[0]
  v_heads = reference_math.split_heads(v[:1], n_heads)
  expected = reference_math.merge_heads(
    jnp.broadcast_to(
      v_heads.sum(axis=2, keepdims=True),
      (1, n_heads, q.shape[1], v_heads.shape[-1]),
    )
  )
  np.testing.assert_allclose(ref[:1], expected, rtol=1e-5, atol=1e-5)
  for name in FAST_MATH:
    out = _implementation(name)(q, k, v, mask, n_heads)
    assert _relative_error(out, ref) < RTOL


@pytest.mark.parametrize('name', ['fused', 'chunked'])
def test_blockwise_dropout_keeps_expectation(name):
  """Per-block masks: other bits than the reference, same rate, unbiased."""
  n_heads, (q, k, v, mask) = _case('lq_ne_lk', fully_masked_row=False)
  attend = {
    'fused': functools.partial(fused.fused_attention, step_elements=1),
    'chunked': functools.partial(chunked.chunked_attention, block_size=8),
  }[name]
  no_dropout = attend(q, k, v, mask, n_heads)
  samples = jax.jit(
    jax.vmap(lambda rng: attend(q, k, v, mask, n_heads, 0.2, rng))
  )(jax.random.split(jax.random.PRNGKey(0), 300))
  assert not np.allclose(samples[0], no_dropout)
  # Unbiased: the mean of 300 draws within 5 standard errors of each value.
  standard_error = samples.std(0) / np.sqrt(len(samples))
  assert np.all(
    np.abs(samples.mean(0) - no_dropout) <= 5 * standard_error + 1e-6
  )


@pytest.mark.parametrize('mask_rows', ['keys', 'full'])
@pytest.mark.parametrize('layout', ['batch_entries', 'heads', 'query_blocks'])
def test_fused_dropout_gradient_matches_autodiff(mask_rows, layout):
  """The hand-written backward agrees with JAX differentiating the forward,
  with dropout, for steps of whole batch entries, of some heads, and of
  query blocks (whose dK and dV add up across steps)."""
  n_heads, (q, k, v, mask) = _case(
    'lq_ne_lk' if mask_rows == 'keys' else 'partial_rows'
  )
  lq = q.shape[1]
  tiles = fused.Tiles(
    *{
      'batch_entries': (2, n_heads, lq),
      'heads': (1, 2, lq),
      'query_blocks': (1, 1, 2 if lq % 2 == 0 else 1),
    }[layout]
  )
  rest = (mask.astype(bool)[:, 0], tiles, n_heads, 0.3, jax.random.PRNGKey(4))
  cotangent = jax.random.normal(jax.random.PRNGKey(5), q.shape)
  grads = [
    jax.grad(
      lambda q, k, v, f=f: jnp.sum(f(q, k, v) * cotangent), argnums=(0, 1, 2)
    )(q, k, v)
    for f in (
      lambda q, k, v: fused._fused_core(q, k, v, *rest),
      lambda q, k, v: fused._fused_forward(q, k, v, *rest)[0],
    )
  ]
  for custom, autodiff in zip(*grads):
    assert _relative_error(custom, autodiff) < RTOL


def test_fused_step_tiles():
  def step_tiles(*shape, target=2**20):
    return fused._step_tiles(*shape, target=target)

  assert step_tiles(32, 8, 64, 64) == (32, 8, 64)  # small: one step
  assert step_tiles(8, 8, 256, 256) == (2, 8, 256)  # whole batch entries
  assert step_tiles(4, 8, 1024, 1024) == (1, 1, 1024)  # one head per step
  assert step_tiles(3, 6, 128, 256, target=2**17) == (1, 3, 128)  # heads
  assert step_tiles(1, 8, 4096, 4096) == (1, 1, 256)  # query blocks
  assert step_tiles(1, 8, 4099, 4096) == (1, 1, 242)  # 17 blocks, 15 padded
  assert step_tiles(1, 1, 8, 8, target=30) == (1, 1, 3)
  assert fused._step_tiles(4, 8, 1024, 1024) == (1, 1, 512)


def test_auto_chooses_by_shape_and_device():
  long = jnp.zeros((1, 8192, 256))

  def choose(q, k, n_heads, dropout_rate):
    return kernels.choose(
      kernels.Call(q.shape, k.shape, q.dtype, n_heads, dropout_rate)
    )

  assert choose(long[:, :64], long, 8, 0.0) == 'chunked'  # long memory
  on_gpu = jax.default_backend() == 'gpu'
  default = 'reference' if on_gpu else 'fused'
  assert choose(long, long, 8, 0.0) == default
  # All logits in one 'fused' step (here 8 * 64 * 64): nothing to tile.
  assert choose(long[:, :64], long[:, :64], 8, 0.0) == 'reference'
  assert choose(long.astype(jnp.bfloat16), long, 8, 0.0) == (
    'cudnn' if on_gpu else 'fused'
  )


@pytest.mark.parametrize('name', FAST)
@pytest.mark.parametrize('mode', ['eval', 'train', 'viz'])
def test_layer_uses_same_weights_and_matches(name, mode):
  """Without dropout every mode computes the reference's math; train mode
  with dropout is tested for its statistics below."""
  n_heads, x = _case('padding', fully_masked_row=False)
  reference = trax_qkv.AttentionQKV(16, n_heads=n_heads, mode=mode)
  fast = trax_qkv.AttentionQKV(
    16, n_heads=n_heads, mode=mode, implementation=name
  )
  rng = jax.random.PRNGKey(0)
  w, s = reference.init(shapes.signature(x), rng=rng)
  w_fast, s_fast = fast.init(shapes.signature(x), rng=rng)
  for a, b in zip(
    jax.tree_util.tree_leaves((w, s)),
    jax.tree_util.tree_leaves((w_fast, s_fast)),
  ):
    assert np.array_equal(a, b)
  y_ref, s_ref = reference.pure_fn(x, w, s, rng)
  y_fast, s_fast = fast.pure_fn(x, w, s, rng)
  assert _relative_error(y_fast[0], y_ref[0]) < RTOL
  if mode == 'viz':  # viz runs the reference: weights are the state
    for a, b in zip(
      jax.tree_util.tree_leaves(s_ref), jax.tree_util.tree_leaves(s_fast)
    ):
      assert np.array_equal(a, b)


@pytest.mark.parametrize('name', FAST)
def test_train_mode_dropout_keeps_rate_and_expectation(name):
  """PureAttention in train mode with dropout 0.25, over 400 keys: with V
  the identity, the output is the weights after dropout, so the share of
  dropped weights is the rate, the kept ones are the eval weights / 0.75,
  and the mean over keys is the eval output (the reference's, whose
  masks have other bits)."""
  rate, n_keys = 0.25, 400
  q = jax.random.normal(jax.random.PRNGKey(1), (2, 6, 8))
  k = jax.random.normal(jax.random.PRNGKey(2), (2, 8, 8))
  v = jnp.broadcast_to(jnp.eye(8), (2, 8, 8))
  x = (q, k, v, jnp.ones((2, 1, 1, 8), bool))
  weights = trax_qkv.PureAttention(n_heads=1, mode='eval')(x)[0]
  train = trax_qkv.PureAttention(
    n_heads=1, dropout=rate, mode='train', implementation=name
  )
  train.init(shapes.signature(x))
  run = jax.jit(jax.vmap(lambda rng: train.pure_fn(x, (), (), rng)[0][0]))
  samples = np.asarray(run(jax.random.split(jax.random.PRNGKey(0), n_keys)))
  dropped = samples == 0.0
  # 38,400 Bernoulli(0.25) draws: std of the share 0.0022.
  assert abs(dropped.mean() - rate) < 0.01
  kept = np.broadcast_to(weights / (1 - rate), samples.shape)[~dropped]
  np.testing.assert_allclose(samples[~dropped], kept, rtol=1e-5, atol=1e-7)
  # Each mean over 400 keys: std <= 0.58 * w / sqrt(400) < 0.03 * w.
  np.testing.assert_allclose(samples.mean(0), weights, rtol=0.15, atol=0.01)
  # Masks differ between keys, as the reference's do.
  assert not np.array_equal(samples[0], samples[1])


def test_cudnn_that_cannot_run_raises_and_says_why():
  """Asked for explicitly, 'cudnn' raises where it cannot run (as
  jax.nn.dot_product_attention does); only 'auto' falls back."""
  n_heads, (q, k, v, mask) = _case('padding', fully_masked_row=False)
  if not ON_CUDNN:  # this machine: no GPU
    backend = jax.default_backend()
    for make in (
      lambda: trax_qkv.AttentionQKV(16, implementation='cudnn'),
      lambda: trax_qkv.PureAttention(implementation='cudnn'),
      lambda: kernels.attend(q, k, v, mask, n_heads, implementation='cudnn'),
    ):
      with pytest.raises(
        ValueError,
        match=(
          f"implementation='cudnn' cannot run here: it needs a GPU and "
          f"JAX's default backend is '{backend}'"
        ),
      ):
        make()
  else:
    with pytest.raises(ValueError, match='it has no attention dropout'):
      trax_qkv.AttentionQKV(
        16, dropout=0.1, mode='train', implementation='cudnn'
      )
    layer = trax_qkv.PureAttention(n_heads=n_heads, implementation='cudnn')
    with pytest.raises(
      ValueError, match='takes bfloat16 or float16 inputs; got float32'
    ):
      layer.init(shapes.signature((q, k, v, mask)))
  # Where it cannot run, 'auto' chooses another implementation.
  assert (
    kernels.resolve(
      'auto', kernels.Call(q.shape, k.shape, q.dtype, n_heads, 0.1)
    ).name
    != 'cudnn'
  )


@pytest.mark.skipif(not ON_CUDNN, reason='cuDNN attention needs a GPU')
def test_cudnn_matches_reference_in_bfloat16():
  n_heads, (q, k, v, mask) = _case('lq_ne_lk', fully_masked_row=False)
  q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
  expected = reference_math.dot_product_attention(
    *(x.astype(jnp.float32) for x in (q, k, v)), mask, n_heads
  )[0]
  got = kernels.attend(q, k, v, mask, n_heads, implementation='cudnn')
  assert _relative_error(got, expected) < 2e-2  # bfloat16 rounding


@pytest.mark.parametrize('name', FAST)
def test_layer_gradients_match_reference(name):
  """Gradients of the weights and inputs, through the projections the fast
  paths run as RowsDense (the reference keeps core.Dense)."""
  n_heads, x = _case('lq_ne_lk')
  reference = trax_qkv.AttentionQKV(16, n_heads=n_heads, mode='eval')
  fast = trax_qkv.AttentionQKV(
    16, n_heads=n_heads, mode='eval', implementation=name
  )
  assert type(reference.sublayers[1].sublayers[0].sublayers[0]) is core.Dense
  assert isinstance(
    fast.sublayers[1].sublayers[0].sublayers[0], attention_layers.RowsDense
  )
  rng = jax.random.PRNGKey(0)
  weights, state = reference.init(shapes.signature(x), rng=rng)
  _assert_gradients_close(
    _layer_gradients(fast, weights, state, x, rng),
    _layer_gradients(reference, weights, state, x, rng),
  )


@pytest.mark.parametrize('name', FAST)
def test_predict_with_kv_cache(name):
  n_heads, (q, k, v, mask) = _case('padding', fully_masked_row=False)
  eval_layer = trax_qkv.AttentionQKV(
    16, n_heads=n_heads, mode='eval', implementation=name
  )
  eval_layer.init(shapes.signature((q, k, v, mask)))
  full, _ = eval_layer((q, k, v, mask))
  layer = trax_qkv.AttentionQKV(
    16,
    n_heads=n_heads,
    mode='predict',
    cache_KV_in_predict=True,
    implementation=name,
  )
  _, state = layer.init(shapes.signature((q[:, :1], k, v, mask)))
  weights = jax.tree_util.tree_unflatten(
    jax.tree_util.tree_structure(layer.weights),
    jax.tree_util.tree_leaves(eval_layer.weights),
  )
  for i in range(q.shape[1]):
    y, state = layer.pure_fn(
      (q[:, i : i + 1], k, v, mask), weights, state, jax.random.PRNGKey(0)
    )
    assert _relative_error(y[0][:, 0], full[:, i]) < RTOL


@pytest.mark.parametrize('name', ('reference',) + FAST)
@pytest.mark.parametrize(
  'dtype,scale', [(jnp.float32, 1e4), (jnp.bfloat16, 1.0)]
)
def test_large_and_bf16_inputs_stay_finite(name, dtype, scale):
  n_heads, (q, k, v, mask) = _case('padding')
  q, k, v = (x.astype(dtype) * scale for x in (q, k, v))
  f = (
    (lambda *a: reference_math.dot_product_attention(*a, mask, n_heads)[0])
    if name == 'reference'
    else (lambda *a: _implementation(name)(*a, mask, n_heads))
  )
  out = f(q, k, v)
  grads = jax.grad(
    lambda *a: jnp.sum(f(*a).astype(jnp.float32)), argnums=(0, 1, 2)
  )(q, k, v)
  assert np.all(np.isfinite(np.asarray(out, np.float32)))
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g, np.float32)))


def test_unknown_implementation():
  with pytest.raises(
    ValueError, match=r"implementation must be one of .*'chunked'.*got 'flash'"
  ):
    trax_qkv.AttentionQKV(16, implementation='flash')


@pytest.mark.parametrize('case', sorted(CASES))
def test_key_block_projection_matches_reference(case, monkeypatch):
  """'chunked' AttentionQKV projects K and V inside the key blocks."""
  monkeypatch.setattr(chunked, 'DEFAULT_BLOCK_SIZE', 4)  # ragged too
  n_heads, (q, k, v, mask) = _case(case)
  k, v = k[..., :12], v[..., :12]  # K/V inputs of another width than Q
  reference = trax_qkv.AttentionQKV(16, n_heads=n_heads, mode='eval')
  fast = trax_qkv.AttentionQKV(
    16, n_heads=n_heads, mode='eval', implementation='chunked'
  )
  assert isinstance(
    fast.sublayers[1], attention_layers.KeyBlockProjectedAttention
  )
  rng = jax.random.PRNGKey(0)
  x = (q, k, v, mask)
  weights, state = reference.init(shapes.signature(x), rng=rng)

  def forward_and_grads(layer):  # one program each, as training runs them
    return jax.jit(
      lambda w: (
        layer.pure_fn(x, w, state, rng)[0][0],
        _layer_gradients(layer, w, state, x, rng),
      )
    )(weights)

  y_fast, grads_fast = forward_and_grads(fast)
  y_ref, grads_ref = forward_and_grads(reference)
  assert _relative_error(y_fast, y_ref) < RTOL
  _assert_gradients_close(grads_fast, grads_ref)


def test_auto_projects_key_blocks_only_for_long_keys():
  layer = trax_qkv.AttentionQKV(
    16, n_heads=4, mode='eval', implementation='auto'
  )
  attention = layer.sublayers[1].sublayers[1]
  q = jnp.zeros((1, 8, 16))
  assert attention.implementation_for(q, jnp.zeros((1, 4096, 16))) == 'chunked'
  assert attention.implementation_for(q, jnp.zeros((1, 64, 16))) == (
    'reference'
  )  # small: all logits in one 'fused' step
  assert (
    attention.implementation_for(
      jnp.zeros((1, 1024, 16)), jnp.zeros((1, 1024, 16))
    )
    == 'fused'
  )
  for mode, kwargs in (
    ('eval', dict(q_sparsity='noop')),
    ('predict', dict(cache_KV_in_predict=True)),
  ):
    plain = trax_qkv.AttentionQKV(
      16, n_heads=4, mode=mode, implementation='chunked', **kwargs
    )
    assert type(plain.sublayers[1]).__name__ == 'Serial'


@pytest.mark.parametrize('projected', [False, True])
def test_chunked_dropout_gradient_matches_autodiff(projected, monkeypatch):
  """The hand-written backward of 'chunked' agrees with JAX differentiating
  its forward loop, with dropout, ragged key blocks, and (as in
  AttentionQKV) K and V projected per block with gradients for the
  projection weights."""
  n_heads, (q, k, v, mask) = _case('lq_ne_lk')
  keys = jax.random.split(jax.random.PRNGKey(6), 4)
  kv_params = (
    tuple(
      (
        jax.random.normal(keys[i], (16, 16)) * 0.3,
        jax.random.normal(keys[i + 2], (16,)),
      )
      for i in range(2)
    )
    if projected
    else ()
  )
  project_kv = attention_layers.dense_kv_projection if projected else None
  cotangent = jax.random.normal(jax.random.PRNGKey(5), q.shape)

  def gradients():
    def loss(q, k, v, kv_params):
      out = chunked.chunked_attention(
        q,
        k,
        v,
        mask,
        n_heads,
        0.3,
        jax.random.PRNGKey(4),
        block_size=4,
        project_kv=project_kv,
        kv_params=kv_params,
      )
      return jnp.sum(out * cotangent)

    return jax.tree_util.tree_leaves(
      jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, kv_params)
    )

  custom = gradients()
  monkeypatch.setattr(
    chunked, '_chunked_core', lambda *args: chunked._chunked_forward(*args)[0]
  )
  autodiff = gradients()
  assert len(custom) == (7 if projected else 3)
  _assert_gradients_close(custom, autodiff)
