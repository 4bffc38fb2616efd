"""The causal kernels (kernels/causal.py) against the reference with a
lower-triangular mask: float32, 1e-5, forward and gradients."""

import functools

from helpers import jitted_forward_and_gradients
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trax_qkv import kernels
from trax_qkv.kernels import causal

RTOL = 1e-5


def _relative_error(got, expected):
  """Max |difference| relative to the largest expected value, or absolute
  below 1 (a gradient that is 0 in exact arithmetic, one key, say)."""
  return float(
    jnp.abs(got - expected).max() / jnp.maximum(jnp.abs(expected).max(), 1.0)
  )


def _qkv(rows, length, d, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  return tuple(jax.random.normal(key, (rows, length, d)) for key in keys)


def _reference(q, k, v):
  return kernels.KERNELS['reference'].causal(q, k, v)


@pytest.mark.slow
@pytest.mark.stack
@hypothesis.settings(max_examples=15, deadline=None)
@hypothesis.given(
  rows=st.integers(1, 5),
  length=st.integers(1, 70),
  d=st.sampled_from([4, 8]),
  block=st.sampled_from([8, 16, 128]),
  step_elements=st.sampled_from([64, 2**19]),
  split=st.sampled_from([1, 2, 4]),
)
def test_forward_and_gradients_match_reference(
  rows, length, d, block, step_elements, split
):
  q, k, v, cotangent = _qkv(rows, length, d, seed=length)
  attend = functools.partial(
    causal.causal_attention,
    block_size=block,
    step_elements=step_elements,
    diagonal_split=split,
  )

  # Compiling is most of this test's time: one program per function.
  forward, got = jitted_forward_and_gradients(attend, cotangent, q, k, v)
  expected_forward, expected = jitted_forward_and_gradients(
    _reference, cotangent, q, k, v
  )
  assert _relative_error(forward, expected_forward) < RTOL
  for g, e in zip(got, expected):
    assert _relative_error(g, e) < RTOL


def test_tiles_take_whole_rows_while_the_logits_fit():
  tiles = causal._tiles
  assert tiles(16, 2048, 128, 2**19, 2) == (16, 128, 2)  # all rows per step
  assert tiles(1024, 64, 128, 2**19, 2) == (128, 64, 2)  # short: whole length
  assert tiles(6, 5, 128, 2**19, 2) == (6, 8, 2)  # 8-aligned block
  assert tiles(7, 300, 128, 100, 2) == (1, 128, 2)  # at least one row
  assert tiles(7, 300, 128, 100, 3) == (1, 128, 1)  # split must divide


@pytest.mark.slow
@pytest.mark.stack
@pytest.mark.parametrize('block, split', [(8, 1), (8, 2), (128, 2)])
def test_dropout_gradient_matches_forward_mode_derivative(block, split):
  """With dropout the hand-written backward agrees with JAX's forward-mode
  derivative of the same forward pass (same masks), in random directions."""
  q, k, v, cotangent = _qkv(3, 37, 8, seed=1)
  rng = jax.random.PRNGKey(4)
  tiles = causal._tiles(3, 37, block, 2**19, split)
  pad = -37 % tiles.block
  q, k, v, cotangent = (
    jnp.pad(x, ((0, 0), (0, pad), (0, 0))) for x in (q, k, v, cotangent)
  )

  def forward(q, k, v):
    return causal._causal_forward(q, k, v, tiles, 0.3, rng)[0]

  grads = jax.grad(
    lambda q, k, v: jnp.sum(
      causal._causal_core(q, k, v, tiles, 0.3, rng) * cotangent
    ),
    argnums=(0, 1, 2),
  )(q, k, v)
  for seed in range(3):
    directions = _qkv(3, q.shape[1], 8, seed=10 + seed)[:3]
    _, tangent = jax.jvp(forward, (q, k, v), directions)
    expected = jnp.sum(tangent * cotangent)
    got = sum(jnp.sum(g * t) for g, t in zip(grads, directions))
    assert _relative_error(got, expected) < RTOL


def test_dropout_keeps_expectation():
  q, k, v, _ = _qkv(2, 24, 8)
  no_dropout = causal.causal_attention(q, k, v, block_size=8)
  samples = jax.jit(
    jax.vmap(
      lambda rng: causal.causal_attention(q, k, v, 0.2, rng, block_size=8)
    )
  )(jax.random.split(jax.random.PRNGKey(0), 300))
  assert not np.allclose(samples[0], no_dropout)
  np.testing.assert_allclose(samples.mean(0), no_dropout, atol=0.15)


@pytest.mark.parametrize(
  'index,new', [(0, 1), (0, 5), (13, 1), (30, 3), (39, 1)]
)
def test_cached_attention_reads_the_filled_part_only(index, new):
  q, k, v, _ = _qkv(4, 40, 8, seed=index)
  expected = _reference(q, k, v)[:, index : index + new]
  filled = (jnp.arange(40) < index + new)[None, :, None]
  # Large values past the filled part: they must get no weight.
  ks, vs = (jnp.where(filled, x, 1e4) for x in (k, v))
  got = jax.jit(causal.cached_attention, static_argnames='block_size')(
    q[:, index : index + new], ks, vs, jnp.array(index), block_size=16
  )
  assert _relative_error(got, expected) < RTOL


def test_auto_in_predict_mode_reads_the_filled_part_off_the_gpu():
  """Off the GPU, a cache longer than one block is read block by block; a
  cache of one block (as long as the decoded output, say) whole."""
  gpu = jax.default_backend() == 'gpu'
  q = jnp.zeros((2, 1, 8))
  for length, expected in (
    (2048, 'reference' if gpu else 'fused'),
    (causal.CACHE_BLOCK_SIZE + 1, 'reference' if gpu else 'fused'),
    (causal.CACHE_BLOCK_SIZE, 'reference'),
    (40, 'reference'),
  ):
    call = kernels.Call(
      q.shape, (2, length, 8), q.dtype, causal=True, predict=True
    )
    assert kernels.choose(call) == expected, length


def test_keep_masks_have_the_rate_and_are_uncorrelated():
  from trax_qkv.kernels import common

  rng = jax.random.PRNGKey(3)
  shape = (16, 128, 128)
  masks = [
    np.asarray(common.keep_mask(rng, i, 0.1, shape), float).ravel()
    for i in range(3)
  ]
  masks.append(
    np.asarray(
      common.keep_mask(jax.random.PRNGKey(4), 0, 0.1, shape), float
    ).ravel()
  )
  tolerance = 4 / np.sqrt(masks[0].size)  # 4 standard errors
  for mask in masks:
    assert abs(mask.mean() - 0.9) < tolerance
  # Other steps, another key, the next element: no correlation.
  for other in masks[1:]:
    assert abs(np.corrcoef(masks[0], other)[0, 1]) < tolerance
  assert abs(np.corrcoef(masks[0][:-1], masks[0][1:])[0, 1]) < tolerance
  assert np.array_equal(
    masks[0], np.asarray(common.keep_mask(rng, 0, 0.1, shape), float).ravel()
  )  # deterministic
