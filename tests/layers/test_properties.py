"""Property-based parity with trax.layers.AttentionQKV (hypothesis)."""

from helpers import assert_trees_equal
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes

import trax_qkv


@st.composite
def attention_problems(draw):
  n_heads = draw(st.sampled_from([1, 2, 4]))
  d_feature = n_heads * draw(st.integers(1, 6))
  batch = draw(st.integers(1, 3))
  lq, lk = draw(st.integers(1, 6)), draw(st.integers(1, 6))
  seed = draw(st.integers(0, 2**16))
  rs = np.random.RandomState(seed)
  q = rs.randn(batch, lq, d_feature).astype(np.float32)
  k = rs.randn(batch, lk, draw(st.integers(1, 8))).astype(np.float32)
  v = rs.randn(batch, lk, draw(st.integers(1, 8))).astype(np.float32)
  rows = draw(st.sampled_from([1, lq]))
  mask = rs.rand(batch, 1, rows, lk) > draw(st.sampled_from([0.0, 0.3, 0.7]))
  dropout = draw(st.sampled_from([0.0, 0.2]))
  mode = draw(st.sampled_from(['train', 'eval', 'viz']))
  return n_heads, d_feature, dropout, mode, seed, (q, k, v, mask)


@pytest.mark.slow
@pytest.mark.stack
@settings(max_examples=20, deadline=None)
@given(attention_problems())
def test_plugin_equals_builtin(problem):
  n_heads, d_feature, dropout, mode, seed, x = problem
  kw = dict(n_heads=n_heads, dropout=dropout, mode=mode)
  builtin = tl.AttentionQKV(d_feature, **kw)
  plugin = trax_qkv.AttentionQKV(d_feature, **kw)
  rng = jax.random.PRNGKey(seed)
  w, s = builtin.init(shapes.signature(x), rng=rng)
  assert_trees_equal((w, s), plugin.init(shapes.signature(x), rng=rng))
  assert_trees_equal(
    builtin.pure_fn(x, w, s, rng), plugin.pure_fn(x, w, s, rng)
  )


@pytest.mark.slow
@pytest.mark.stack
@settings(max_examples=20, deadline=None)
@given(attention_problems(), st.sampled_from(['fused', 'chunked', 'auto']))
def test_fast_paths_match_builtin(problem, implementation):
  n_heads, d_feature, _, _, seed, x = problem
  builtin = tl.AttentionQKV(d_feature, n_heads=n_heads, mode='eval')
  fast = trax_qkv.AttentionQKV(
    d_feature, n_heads=n_heads, mode='eval', implementation=implementation
  )
  rng = jax.random.PRNGKey(seed)
  w, s = builtin.init(shapes.signature(x), rng=rng)
  # Jitted, as in training (a tolerance, not bit-identity, is claimed here).
  expected = jax.jit(builtin.pure_fn)(x, w, s, rng)[0][0]
  got = jax.jit(fast.pure_fn)(x, w, s, rng)[0][0]
  # README: within 1e-5 of the output's scale (its largest |value|, >= 1).
  np.testing.assert_allclose(
    got, expected, rtol=0, atol=1e-5 * max(1.0, float(np.abs(expected).max()))
  )
