"""'fused': attention one cache-sized tile at a time, flash-style backward.

A loop runs over tiles of (batch entries, heads, queries) sliced out of the
(batch, L, d) arrays as they are (no head transposes); each tile's logits
are masked, soft-maxed and multiplied with V while they are in cache,
instead of the several passes over the whole (batch, heads, Lq, Lk) array
that the reference makes. The hand-written backward pass recomputes the
weights from the saved logsumexp, so memory holds one tile's logits, not
all of them. Dropout masks are drawn per tile (same rate, other bits:
`common.keep_mask`). A GPU runs the loop's steps one after another, so
'auto' picks it on CPUs only (`dispatch`).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from trax_qkv.kernels import common
from trax_qkv.kernels.reference import MASK_FILL


class Tiles(NamedTuple):
  """The geometry of a 'fused' loop step."""

  batch_entries: int
  heads: int
  queries: int


def _step_tiles(batch, n_heads, lq, lk, target=common.STEP_ELEMENTS):
  """The `Tiles` of a 'fused' step: its logits fit `target` floats.

  Whole batch entries while one entry's (heads, Lq, Lk) logits fit, as many
  as the largest divisor of `batch` allows; else heads of one entry, the
  same way; else one head's queries in near-equal blocks (the last padded),
  so that no length -- a prime one included -- forces tiny steps.
  """

  def largest_divisor(n, size):
    return max(g for g in range(1, n + 1) if n % g == 0 and g * size <= target)

  if n_heads * lq * lk <= target:
    return Tiles(largest_divisor(batch, n_heads * lq * lk), n_heads, lq)
  if lq * lk <= target:
    return Tiles(1, largest_divisor(n_heads, lq * lk), lq)
  n_blocks = common.ceil_div(lq, max(1, target // lk))
  return Tiles(1, 1, common.ceil_div(lq, n_blocks))


def logits_computed(batch, n_heads, lq, lk, step_elements=common.STEP_ELEMENTS):
  """(query, key) logits `fused_attention` computes, per pass over them:
  every key of every query, the queries padded to whole blocks."""
  queries = _step_tiles(batch, n_heads, lq, lk, step_elements).queries
  return batch * n_heads * common.ceil_div(lq, queries) * queries * lk


class _Tiling:
  """Where step i of the 'fused' loop reads and writes.

  Arrays keep their (batch, L, heads * d_head) layout: a step slices its
  batch entries, queries and heads out of them, so no transposed copy of
  Q, K, V or their gradients is ever made.
  """

  def __init__(self, q, k, mask, tiles, n_heads):
    self.batch, self.lq, d = q.shape
    self.lk = k.shape[1]
    self.n_batch, self.n_heads_step, self.n_queries = (
      tiles.batch_entries,
      tiles.heads,
      tiles.queries,
    )
    self.n_heads = n_heads
    self.d_head = d // n_heads
    self.rows = self.n_batch * self.n_heads_step  # (batch, head) pairs
    # The forward scales q by it once; dq gets it too.
    self.scale = common.scale(self.d_head, q.dtype)
    self.mask = mask
    self.counts = (
      self.batch // self.n_batch,
      n_heads // self.n_heads_step,
      self.lq // self.n_queries,
    )
    self.n_steps = self.counts[0] * self.counts[1] * self.counts[2]

  def origin(self, step):
    """(first batch entry, first query, first feature) of a step."""
    _, n_h, n_q = self.counts
    return (
      step // (n_h * n_q) * self.n_batch,
      step % n_q * self.n_queries,
      step // n_q % n_h * self.n_heads_step * self.d_head,
    )

  def read(self, x, step, queries):
    """The step's (n_batch * n_heads_step, L, d_head) slice of a (batch, L,
    d) array: its queries only if `queries`, else the whole length."""
    b, q, f = self.origin(step)
    length = self.n_queries if queries else x.shape[1]
    x = common.read_tile(
      x,
      (b, q if queries else 0, f),
      (self.n_batch, length, self.n_heads_step * self.d_head),
    )
    # (n_batch, L, heads, d_head) -> (n_batch * heads, L, d_head); moves no
    # data when the step has one head.
    x = x.reshape((self.n_batch, length, self.n_heads_step, self.d_head))
    return jnp.swapaxes(x, 1, 2).reshape((-1, length, self.d_head))

  def write(self, x, rows, step, queries):
    """x with the step's (n_batch * n_heads_step, L, d_head) rows written."""
    b, q, f = self.origin(step)
    rows = rows.reshape((self.n_batch, self.n_heads_step) + rows.shape[1:])
    rows = jnp.swapaxes(rows, 1, 2).reshape((self.n_batch, rows.shape[2], -1))
    return common.write_tile(x, rows, (b, q if queries else 0, f))

  def step_mask(self, step):
    """The step's mask, broadcastable to its (rows, queries, Lk) logits."""
    b, q, _ = self.origin(step)
    mask = self.mask
    size = (
      self.n_batch if mask.shape[0] > 1 else 1,
      self.n_queries if mask.shape[1] > 1 else 1,
      self.lk,
    )
    mask = common.read_tile(
      mask,
      (b if mask.shape[0] > 1 else 0, q if mask.shape[1] > 1 else 0, 0),
      size,
    )
    if mask.shape[0] == 1:
      return mask
    return jnp.repeat(mask, self.n_heads_step, axis=0)  # batch-major rows

  def per_query_origin(self, step):
    """(first (batch * heads) row, first query) of a step in a
    (batch * heads, Lq) array: a step's rows are consecutive there."""
    b, q, f = self.origin(step)
    return b * self.n_heads + f // self.d_head, q

  def read_per_query(self, x, step):
    """The step's (rows, queries, 1) slice of a (batch * heads, Lq) array
    (the logsumexp, or rowsum(dO * O))."""
    return common.read_tile(
      x, self.per_query_origin(step), (self.rows, self.n_queries)
    )[..., None]

  def write_per_query(self, x, values, step):
    """x with the step's (rows, queries, 1) values written."""
    return common.write_tile(x, values[..., 0], self.per_query_origin(step))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _fused_core(q, k, v, mask, tiles, n_heads, rate, rng):
  return _fused_forward(q, k, v, mask, tiles, n_heads, rate, rng)[0]


def _fused_forward(q, k, v, mask, tiles, n_heads, rate, rng):
  """Attention over (batch, Lq, d) q and (batch, Lk, d) k, v, step by step.

  `mask` is bool (batch|1, Lq|1, Lk), `tiles` what `_step_tiles` returns
  (Lq a multiple of its queries). Returns the float32 output and the
  residuals of the backward pass.
  """
  tiling = _Tiling(q, k, mask, tiles, n_heads)
  q = q * tiling.scale  # once, not per step; the backward reads it too

  def one_step(step, carry):
    out, lse = carry
    logits = jnp.where(
      tiling.step_mask(step),
      jnp.einsum(
        'gqd,gkd->gqk', tiling.read(q, step, True), tiling.read(k, step, False)
      ),
      MASK_FILL,
    )
    # Two passes over the logits, not three: V is weighted by
    # exp(logits - max) and the row sums are divided out of the small
    # (queries, d_head) result.
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    unnormalised = jnp.exp(logits - row_max)
    step_lse = row_max + jnp.log(jnp.sum(unnormalised, axis=-1, keepdims=True))
    keep = common.keep_mask(rng, step, rate, unnormalised.shape)
    unnormalised = common.dropped(unnormalised, keep, rate)
    # exp(max - lse) rounds as the reference's exp(logits - lse) does: in a
    # fully masked row lse rounds to -1e9 and every key weighs 1.
    rows = jnp.einsum(
      'gqk,gkd->gqd', unnormalised, tiling.read(v, step, False)
    ) * jnp.exp(row_max - step_lse)
    return (
      tiling.write(out, rows, step, True),
      tiling.write_per_query(lse, step_lse, step),
    )

  out = jnp.zeros(q.shape[:2] + (v.shape[-1],), jnp.float32)
  lse = jnp.zeros((q.shape[0] * n_heads, q.shape[1]), jnp.float32)
  out, lse = jax.lax.fori_loop(0, tiling.n_steps, one_step, (out, lse))
  return out, (q, k, v, mask, rng, out, lse)


def _fused_backward(tiles, n_heads, rate, residuals, d_out):
  """Per step, the weights are recomputed from the saved logsumexp (as flash
  attention does) and the softmax backward uses rowsum(dO * O), which equals
  rowsum(dW * W) also with dropout and is (queries, d_head), not (queries,
  Lk). An inner loop runs a tile's query blocks and sums their dK and dV.
  The residual q is already scaled by 1/sqrt(d_head)."""
  q, k, v, mask, rng, out, lse = residuals
  tiling = _Tiling(q, k, mask, tiles, n_heads)
  n_blocks = tiling.counts[2]
  # rowsum(dO * O) of every (batch * head, query), in one pass up front.
  batch, lq, _ = out.shape
  all_row_sums = jnp.sum(
    (d_out * out).reshape((batch, lq, n_heads, tiling.d_head)), axis=-1
  )
  all_row_sums = jnp.swapaxes(all_row_sums, 1, 2).reshape((-1, lq))

  def one_block(step, k_step, v_step, carry):
    d_q, d_k_t, d_v_t = carry
    q_step = tiling.read(q, step, True)
    d_out_step = tiling.read(d_out, step, True)
    step_lse = tiling.read_per_query(lse, step)
    logits = jnp.where(
      tiling.step_mask(step),
      jnp.einsum('gqd,gkd->gqk', q_step, k_step),
      MASK_FILL,
    )
    weights = jnp.exp(logits - step_lse)
    d_weights = jnp.einsum('gqd,gkd->gqk', d_out_step, v_step)
    keep = common.keep_mask(rng, step, rate, weights.shape)
    kept, d_logits = common.softmax_backward(
      weights,
      d_weights,
      tiling.read_per_query(all_row_sums, step),
      step_lse,
      rate,
      keep,
    )
    d_q_step = jnp.einsum('gqk,gkd->gqd', d_logits, k_step) * tiling.scale
    # dK and dV as (d_head, Lk): XLA:CPU runs 'gqd,gqk->gdk' faster than
    # 'gqk,gqd->gkd' (docs/kernels.md: "Einsum order in the backward
    # pass").
    return (
      tiling.write(d_q, d_q_step, step, True),
      d_k_t + jnp.einsum('gqd,gqk->gdk', q_step, d_logits),
      d_v_t + jnp.einsum('gqd,gqk->gdk', d_out_step, kept),
    )

  def one_tile(tile, carry):
    d_q, d_k, d_v = carry
    first = tile * n_blocks
    # The tile's K and V, read once for all of its query blocks.
    k_step, v_step = tiling.read(k, first, False), tiling.read(v, first, False)
    zeros = jnp.zeros((tiling.rows, tiling.d_head, tiling.lk), jnp.float32)
    d_q, d_k_t, d_v_t = jax.lax.fori_loop(
      0,
      n_blocks,
      lambda block, c: one_block(first + block, k_step, v_step, c),
      (d_q, zeros, zeros),
    )
    return (
      d_q,
      tiling.write(d_k, jnp.swapaxes(d_k_t, 1, 2), first, False),
      tiling.write(d_v, jnp.swapaxes(d_v_t, 1, 2), first, False),
    )

  zeros = tuple(jnp.zeros(x.shape, x.dtype) for x in (q, k, v))
  d_q, d_k, d_v = jax.lax.fori_loop(
    0, tiling.n_steps // n_blocks, one_tile, zeros
  )
  return d_q, d_k, d_v, None, None


_fused_core.defvjp(_fused_forward, _fused_backward)


def fused_attention(
  q,
  k,
  v,
  mask,
  n_heads,
  dropout_rate=0.0,
  dropout_rng=None,
  step_elements=common.STEP_ELEMENTS,
):
  """Attention one cache-sized step at a time; flash-style backward.

  Tiles of (batch entries, heads, queries) whose logits take at most
  `step_elements` floats are masked, soft-maxed and multiplied with V while
  they are in cache; the backward pass recomputes each tile's weights from
  the saved logsumexp, so memory holds one tile's logits, not all of them.

  Args:
    q: (b, Lq, d) projected queries.
    k: (b, Lk, d) projected keys.
    v: (b, Lk, d_v) projected values.
    mask: None, or broadcastable to (b, 1, Lq, Lk); nonzero = attend.
    n_heads: heads; divides d and d_v.
    dropout_rate: attention-weight dropout in [0, 1); masks are drawn per
      tile (`common.keep_mask`), not as the reference draws them.
    dropout_rng: JAX PRNG key, needed when dropout_rate > 0.
    step_elements: the most logits one loop step holds.

  Returns:
    float32 (b, Lq, d_v): what `reference.dot_product_attention` returns
    first, within float32 rounding.
  """
  batch, lq, _ = q.shape
  tiles = _step_tiles(batch, n_heads, lq, k.shape[1], step_elements)
  # Queries added to fill the last block: discarded.
  pad = common.padding(lq, tiles.queries)
  if mask is None:
    mask = jnp.ones((1, 1, k.shape[1]), bool)
  else:
    mask = mask.astype(bool)[:, 0]
  if pad:
    q = jnp.pad(q, ((0, 0), (0, pad), (0, 0)))
    if mask.shape[1] > 1:
      mask = jnp.pad(mask, ((0, 0), (0, pad), (0, 0)), constant_values=True)
  out = _fused_core(
    q,
    k,
    v,
    mask,
    tiles,
    n_heads,
    float(dropout_rate),
    common.dropout_rng_or_unused(dropout_rng),
  )
  return out[:, :lq].astype(jnp.float32)
