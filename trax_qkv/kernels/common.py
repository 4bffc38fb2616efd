"""Pieces shared by the blockwise kernels ('fused', 'chunked', causal).

Each computes a block of logits at a time, keeps the logsumexp of every
query row, and in the backward pass recomputes a block's weights from it
(as flash attention does). What a block does with the scale, the online
softmax, dropout and the softmax gradient is the same in all of them, and
written once here.
"""

import math

import jax
import jax.numpy as jnp

from trax_qkv.kernels.reference import MASK_FILL

# Logits per loop step of 'fused' and causal attention: 2**19 floats (2 MB).
# A step's temporaries then stay under the size malloc reuses instead of
# mapping afresh on every call (docs/kernels.md: "Step size").
STEP_ELEMENTS = 2**19
# Initial running max of an online softmax, and the logit of padding keys:
# far below any logit, MASK_FILL included, so they get zero weight even in
# a fully masked row.
NEG_INF = -1e30


def ceil_div(n, d):
  """The number of blocks of `d` that cover `n`."""
  return -(-n // d)


def padding(n, d):
  """How many positions fill `n` up to whole blocks of `d`."""
  return -n % d


def dropout_rng_or_unused(rng):
  """The dropout key a kernel passes down: `rng`, or a fixed key that the
  loop never reads (dropout rate 0) when the caller gave none."""
  return jax.random.PRNGKey(0) if rng is None else rng


def heads_last(x, n_heads):
  """(b, L, h * d_head) -> (b, L, h, d_head): a reshape, no copy."""
  batch, length, d = x.shape
  return x.reshape((batch, length, n_heads, d // n_heads))


def read_tile(x, start, size):
  """The tile of `x` at `start` of `size`, over x's leading axes (the other
  axes whole): what a loop step of a blockwise kernel reads.

  Args:
    x: an array.
    start: first index per leading axis (ints or traced scalars).
    size: tile length per leading axis (ints).
  """
  rest = x.ndim - len(start)
  return jax.lax.dynamic_slice(
    x, tuple(start) + (0,) * rest, tuple(size) + x.shape[len(size) :]
  )


def write_tile(x, tile, start):
  """x with `tile` (cast to x's dtype) written at `start` over its leading
  axes: what a loop step writes."""
  rest = x.ndim - len(start)
  return jax.lax.dynamic_update_slice(
    x, tile.astype(x.dtype), tuple(start) + (0,) * rest
  )


def scale(d_head, dtype):
  """1 / sqrt(d_head) in `dtype`: what q is multiplied by, once."""
  return jnp.asarray(1.0 / d_head**0.5, dtype)


def online_softmax_update(carry, logits, weigh_values, drop=None):
  """One key block of an online softmax.

  Args:
    carry: (running max, denominator, numerator); the first two with a
      trailing axis of 1, all float32.
    logits: (..., queries, keys) of the block, masked.
    weigh_values: f(weights) -> (..., queries, d_v): the weights times the
      block's values.
    drop: if given, f(weights) -> weights after dropout, applied after the
      denominator has counted them.

  Returns:
    The carry with the block added: the output is numerator / denominator,
    the logsumexp running max + log(denominator).
  """
  running_max, denominator, numerator = carry
  new_max = jnp.maximum(running_max, logits.max(axis=-1, keepdims=True))
  correction = jnp.exp(running_max - new_max)
  p = jnp.exp(logits - new_max)
  denominator = denominator * correction + p.sum(axis=-1, keepdims=True)
  if drop is not None:
    p = drop(p)
  return new_max, denominator, numerator * correction + weigh_values(p)


def _mix(x):
  """A 32-bit integer hash (Wellons' lowbias32): a bijection on uint32
  whose output bits each depend on every input bit."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def keep_mask(rng, index, rate, shape):
  """Dropout keep-mask of loop step `index`: True with probability 1 - rate;
  None when rate is 0 (no dropout: `dropped` then keeps its input).

  Each element's bits are a keyed hash of its position in the step,
  mix(mix(position ^ k0) + k1), with (k0, k1) the step's JAX key
  `fold_in(rng, index)`: a few integer operations per element, where
  jax.random's threefry would cost as much as the rest of the step
  (docs/kernels.md: "Dropout masks"). Masks of
  different steps and keys are independent for dropout's purpose (tested:
  rate, and correlation between steps and neighbours), not for
  cryptography.
  """
  if rate == 0.0:
    return None
  k0, k1 = jax.random.fold_in(rng, index).astype(jnp.uint32).reshape(-1)[:2]
  position = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
  bits = _mix(_mix(position ^ k0) + k1)
  threshold = min(round((1.0 - rate) * 2.0**32), 2**32 - 1)
  return bits < jnp.uint32(threshold)


def dropped(x, keep, rate):
  """x with the entries dropped by `keep` zeroed and the kept ones scaled by
  1 / (1 - rate), so that the expectation is unchanged; x itself when
  `keep` is None."""
  if keep is None:
    return x
  return jnp.where(keep, x / (1.0 - rate), 0.0)


def softmax_backward(weights, d_weights, row_sums, lse, rate, keep):
  """(weights after dropout, d_logits) of a step of recomputed `weights`.

  `d_weights` is dO . V for the weights after dropout, `row_sums` is
  rowsum(dO * O), which equals rowsum(dW * W) also with dropout, and `keep`
  the step's dropout mask (None when rate == 0). Masked logits were
  constants (-1e9), so they get no gradient. Their weights are exactly 0
  already (exp(-1e9 - lse) underflows), except in a fully masked row, where
  lse rounds to -1e9 and every weight is 1: those rows are zeroed by a
  per-row factor, not a pass over the mask.
  """
  kept = dropped(weights, keep, rate)
  d_weights = dropped(d_weights, keep, rate)
  row_has_keys = (lse > MASK_FILL / 2).astype(weights.dtype)
  return kept, weights * ((d_weights - row_sums) * row_has_keys)
