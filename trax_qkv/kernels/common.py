"""Pieces shared by the blockwise kernels ('fused' and 'chunked').

Both compute a block of logits at a time, keep the logsumexp of every
query row, and in the backward pass recompute a block's weights from it
(as flash attention does). What one block does with dropout and with the
softmax gradient is the same in both, and written once here.
"""

import math

import jax
import jax.numpy as jnp

from trax_qkv.kernels.reference import MASK_FILL


def heads(x, n_heads):
  """(batch, L, d) -> (batch, L, heads, d_head): a reshape, no copy."""
  batch, length, d = x.shape
  return x.reshape((batch, length, n_heads, d // n_heads))


def _mix(x):
  """A 32-bit integer hash (Wellons' lowbias32): a bijection on uint32
  whose output bits each depend on every input bit."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def keep_mask(rng, index, rate, shape):
  """Dropout keep-mask of loop step `index`: True with probability 1 - rate.

  Each element's bits are a keyed hash of its position in the step,
  mix(mix(position ^ k0) + k1), with (k0, k1) the step's JAX key
  `fold_in(rng, index)`. jax.random's threefry costs about 10 ns per
  element on a CPU, as much as the rest of a blockwise step with dropout
  (docs/benchmarks.md); the hash costs a few integer operations. Masks of
  different steps and keys are independent for dropout's purpose (tested:
  rate, and correlation between steps and neighbours), not for
  cryptography.
  """
  k0, k1 = (jax.random.fold_in(rng, index).astype(jnp.uint32)
            .reshape(-1)[:2])
  position = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
  bits = _mix(_mix(position ^ k0) + k1)
  threshold = min(round((1.0 - rate) * 2.0 ** 32), 2 ** 32 - 1)
  return bits < jnp.uint32(threshold)


def dropped(x, keep, rate):
  """x with the entries dropped by `keep` zeroed and the kept ones scaled by
  1 / (1 - rate), so that the expectation is unchanged."""
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
  kept = weights
  if keep is not None:
    kept = dropped(weights, keep, rate)
    d_weights = dropped(d_weights, keep, rate)
  row_has_keys = (lse > MASK_FILL / 2).astype(weights.dtype)
  return kept, weights * ((d_weights - row_sums) * row_has_keys)
