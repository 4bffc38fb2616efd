"""Pieces shared by the blockwise kernels ('fused' and 'chunked').

Both compute a block of logits at a time, keep the logsumexp of every
query row, and in the backward pass recompute a block's weights from it
(as flash attention does). What one block does with dropout and with the
softmax gradient is the same in both, and written once here.
"""

import jax
import jax.numpy as jnp

from trax_qkv.kernels.reference import MASK_FILL


def heads(x, n_heads):
  """(batch, L, d) -> (batch, L, heads, d_head): a reshape, no copy."""
  batch, length, d = x.shape
  return x.reshape((batch, length, n_heads, d // n_heads))


def keep_mask(rng, index, rate, shape):
  return jax.random.bernoulli(jax.random.fold_in(rng, index), 1.0 - rate,
                              shape)


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
