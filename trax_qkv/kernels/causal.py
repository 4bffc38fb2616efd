"""Causal attention in blocks: the tiles above the diagonal are never computed.

Causal self-attention lets query i see keys 0..i, so half of the (L, L)
logits that the reference computes -- and then masks -- are wasted. Here
queries and keys are cut into blocks of `block_size` positions; query block i
visits key blocks 0..i-1 with an online softmax (as flash attention does),
unmasked, and then its diagonal block, masked, in query sub-blocks that
each skip the keys after their own. The hand-written backward
pass visits the same blocks, recomputing each block's weights from the
saved logsumexp, so memory holds one step's logits, not (L, L) of them.

Inputs carry the heads in the batch axis, (batch * heads, L, d_head), as
`trax.layers.DotProductCausalAttention` receives them. A loop step takes
several of those rows at once (`_tiles`), so short sequences still run in
few, cache-sized steps. Dropout masks are drawn per step (same rate, other
bits than the reference's).

`cached_attention` is the predict-mode counterpart: new queries over a
key/value cache of which only the first `index + new` positions are filled;
it visits those blocks only.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from trax_qkv.kernels import common
from trax_qkv.kernels.reference import MASK_FILL

# Positions per query and key block. XLA:CPU runs a (2, 512, 64) batched
# matmul near the matmul rate and a (16, 128, 64) one at half of it, which
# outweighs the masked half of the diagonal blocks that larger blocks
# compute (docs/kernels.md: "Causal block size").
DEFAULT_BLOCK_SIZE = 512
# Query sub-blocks per diagonal block: sub-block s reads key sub-blocks
# 0..s only, so two of them compute 3/4 of a diagonal block's logits, not
# all. The smaller matmuls take back much of the saving on XLA:CPU
# (docs/benchmarks.md: "Attention against the matmul rate").
DIAGONAL_SPLIT = 2
# Cache positions per step of predict mode: an early token reads few.
CACHE_BLOCK_SIZE = 128


class Tiles(NamedTuple):
  """The geometry of a causal loop step."""

  rows: int  # (batch entry, head) rows per step
  block: int  # positions per query and key block
  split: int  # query sub-blocks per diagonal block


def _tiles(rows, length, block_size, target, diagonal_split=DIAGONAL_SPLIT):
  """The `Tiles` of (rows, length): the block is `block_size`, or the
  whole (8-aligned) length when shorter; rows are the largest divisor of
  `rows` whose logits fit `target` floats (at least one); the diagonal
  blocks split in `diagonal_split` if it divides them, else not at all."""
  block = min(block_size, common.ceil_div(length, 8) * 8)
  fitting = [
    g
    for g in range(1, rows + 1)
    if rows % g == 0 and g * block * block <= target
  ]
  split = diagonal_split if block % diagonal_split == 0 else 1
  return Tiles(max(fitting) if fitting else 1, block, split)


def logits_computed(
  rows,
  length,
  block_size=DEFAULT_BLOCK_SIZE,
  step_elements=common.STEP_ELEMENTS,
  diagonal_split=DIAGONAL_SPLIT,
):
  """(query, key) logits `causal_attention` computes, per pass over them:
  the blocks below the diagonal whole, and of each diagonal block its
  sub-blocks, query sub-block s over key sub-blocks 0..s (a masked
  triangle included), of the padded length."""
  tiles = _tiles(rows, length, block_size, step_elements, diagonal_split)
  block, split = tiles.block, tiles.split
  n_blocks = common.ceil_div(length, block)
  sub = block // split
  below = n_blocks * (n_blocks - 1) // 2 * block * block
  diagonal = n_blocks * split * (split + 1) // 2 * sub * sub
  return rows * (below + diagonal)


class _Blocks:
  """Where step (tile, query block i, key block j) reads and writes."""

  def __init__(self, q, tiles):
    self.rows, self.length, self.d_head = q.shape
    self.tile_rows, self.block = tiles.rows, tiles.block
    self.sub = self.block // tiles.split
    self.n_blocks = self.length // self.block
    self.n_steps = (self.rows // self.tile_rows) * self.n_blocks
    self.scale = common.scale(self.d_head, q.dtype)
    self.diagonal = jnp.tril(jnp.ones((self.block, self.block), bool))

  def origin(self, step):
    """(first row, query block) of an outer step."""
    return step // self.n_blocks * self.tile_rows, step % self.n_blocks

  def read(self, x, row, block):
    return common.read_tile(
      x, (row, block * self.block), (self.tile_rows, self.block)
    )

  def write(self, x, values, row, block):
    return common.write_tile(x, values, (row, block * self.block))

  def read_t(self, x, row, block):
    """The (rows, d, block) tile of a transposed (rows, d, L) array."""
    return jax.lax.dynamic_slice(
      x, (row, 0, block * self.block), (self.tile_rows, x.shape[1], self.block)
    )

  def write_t(self, x, values, row, block):
    return jax.lax.dynamic_update_slice(x, values, (row, 0, block * self.block))

  def logits(self, q_block, k_block, on_diagonal=None):
    """Masked only on the diagonal: every key of an earlier block is
    before every query of block i, so the blocks before it skip the pass
    over the mask. `on_diagonal`: the query sub-block's slice of a diagonal
    block (its keys the block's first ones)."""
    logits = jnp.einsum(
      'gqd,gkd->gqk', q_block, k_block, preferred_element_type=jnp.float32
    )
    if on_diagonal is None:
      return logits
    return jnp.where(
      self.diagonal[on_diagonal, : logits.shape[-1]], logits, MASK_FILL
    )

  def sub_blocks(self):
    """(queries, keys) slices of a diagonal block's sub-blocks: query
    sub-block s sees the block's keys up to its own last one."""
    return [
      (slice(s, s + self.sub), slice(0, s + self.sub))
      for s in range(0, self.block, self.sub)
    ]

  def keep(self, rng, rate, step, j):
    """The dropout mask of key block j in outer step `step`, whole (the
    diagonal's sub-blocks take their slices of it)."""
    shape = (self.tile_rows, self.block, self.block)
    return common.keep_mask(rng, step * self.n_blocks + j, rate, shape)

  @staticmethod
  def sub_keep(keep, queries, keys):
    """A diagonal sub-block's slice of its block's mask (None: no dropout)."""
    return None if keep is None else keep[:, queries, keys]


def _weigh(v_block):
  """The online softmax's weights-times-values of a (g, k, d_v) block."""
  return lambda p: jnp.einsum(
    'gqk,gkd->gqd', p, v_block, preferred_element_type=jnp.float32
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _causal_core(q, k, v, tiles, rate, rng):
  return _causal_forward(q, k, v, tiles, rate, rng)[0]


def _causal_forward(q, k, v, tiles, rate, rng):
  blocks = _Blocks(q, tiles)
  q = q * blocks.scale  # once; the backward reads the scaled q

  def drop(keep):
    return None if keep is None else lambda p: common.dropped(p, keep, rate)

  def one_step(step, carry):
    out, lse = carry
    row, i = blocks.origin(step)
    q_block = blocks.read(q, row, i)

    def update(inner, k_block, v_block, keep, queries=None):
      """`inner` with the keys of `k_block` added, for the queries (all,
      or a diagonal sub-block's)."""
      at = slice(None) if queries is None else queries
      return common.online_softmax_update(
        inner,
        blocks.logits(q_block[:, at], k_block, queries),
        _weigh(v_block),
        drop(keep),
      )

    def one_key_block(j, inner):
      k_block, v_block = blocks.read(k, row, j), blocks.read(v, row, j)
      return update(inner, k_block, v_block, blocks.keep(rng, rate, step, j))

    shape = (blocks.tile_rows, blocks.block, 1)
    inner = jax.lax.fori_loop(
      0,
      i,
      one_key_block,
      (
        jnp.full(shape, common.NEG_INF, jnp.float32),
        jnp.zeros(shape, jnp.float32),
        jnp.zeros(shape[:2] + (v.shape[-1],), jnp.float32),
      ),
    )
    k_block, v_block = blocks.read(k, row, i), blocks.read(v, row, i)
    keep = blocks.keep(rng, rate, step, i)
    parts = [
      update(
        tuple(x[:, queries] for x in inner),
        k_block[:, keys],
        v_block[:, keys],
        blocks.sub_keep(keep, queries, keys),
        queries,
      )
      for queries, keys in blocks.sub_blocks()
    ]
    running_max, denominator, numerator = (
      jnp.concatenate(x, axis=1) for x in zip(*parts)
    )
    step_lse = running_max + jnp.log(denominator)
    return (
      blocks.write(out, numerator / denominator, row, i),
      blocks.write(lse, step_lse, row, i),
    )

  out = jnp.zeros(q.shape[:2] + (v.shape[-1],), jnp.float32)
  lse = jnp.zeros(q.shape[:2] + (1,), jnp.float32)
  out, lse = jax.lax.fori_loop(0, blocks.n_steps, one_step, (out, lse))
  return out, (q, k, v, rng, out, lse)


def _causal_backward(tiles, rate, residuals, d_out):
  """Flash-attention's backward over the same blocks: per query block, the
  weights of key blocks 0..i are recomputed from the saved logsumexp; dQ
  gathers in the step, dK and dV are added into their key block.

  dK and dV are accumulated transposed, (rows, d, L): XLA:CPU runs
  'gqd,gqk->gdk' faster than 'gqk,gqd->gkd' at these shapes
  (docs/kernels.md: "Causal block size"). Q and dO are transposed once
  up front, so that dK and dV are plain (d, q) @ (q, k) products: XLA:CPU
  then runs them through the same (YNNPACK) path as the step's other
  matmuls, side by side with dQ, where 'gqd,gqk->gdk' went to a slower dot
  one after another (docs/kernels.md: "Einsum order in the backward
  pass")."""
  q, k, v, rng, out, lse = residuals
  blocks = _Blocks(q, tiles)
  row_sums_all = jnp.sum(d_out * out, axis=-1, keepdims=True)
  q_t, d_out_t = jnp.swapaxes(q, 1, 2), jnp.swapaxes(d_out, 1, 2)

  def one_step(step, carry):
    d_q, d_k_t, d_v_t = carry
    row, i = blocks.origin(step)
    q_block = blocks.read(q, row, i)
    d_out_block = blocks.read(d_out, row, i)
    lse_block = blocks.read(lse, row, i)
    row_sums = blocks.read(row_sums_all, row, i)
    q_block_t = blocks.read_t(q_t, row, i)
    d_out_block_t = blocks.read_t(d_out_t, row, i)

    def gradients(k_block, v_block, keep, queries=None):
      """(dQ, dK^T, dV^T) of the queries (all, or a diagonal sub-block's)
      over `k_block`, `v_block`."""
      at = slice(None) if queries is None else queries
      logits = blocks.logits(q_block[:, at], k_block, queries)
      weights = jnp.exp(logits - lse_block[:, at])
      d_weights = jnp.einsum('gqd,gkd->gqk', d_out_block[:, at], v_block)
      kept, d_logits = common.softmax_backward(
        weights, d_weights, row_sums[:, at], lse_block[:, at], rate, keep
      )
      return (
        jnp.einsum('gqk,gkd->gqd', d_logits, k_block),
        jnp.einsum('gdq,gqk->gdk', q_block_t[:, :, at], d_logits),
        jnp.einsum('gdq,gqk->gdk', d_out_block_t[:, :, at], kept),
      )

    def one_key_block(j, inner):
      d_q_block, d_k_t, d_v_t = inner
      k_block, v_block = blocks.read(k, row, j), blocks.read(v, row, j)
      keep = blocks.keep(rng, rate, step, j)
      d_q_part, d_k_part, d_v_part = gradients(k_block, v_block, keep)
      return (
        d_q_block + d_q_part,
        blocks.write_t(d_k_t, blocks.read_t(d_k_t, row, j) + d_k_part, row, j),
        blocks.write_t(d_v_t, blocks.read_t(d_v_t, row, j) + d_v_part, row, j),
      )

    d_q_block, d_k_t, d_v_t = jax.lax.fori_loop(
      0,
      i,
      one_key_block,
      (jnp.zeros(q_block.shape, jnp.float32), d_k_t, d_v_t),
    )
    k_block, v_block = blocks.read(k, row, i), blocks.read(v, row, i)
    keep = blocks.keep(rng, rate, step, i)
    d_k_tile, d_v_tile = (
      blocks.read_t(d_k_t, row, i),
      blocks.read_t(d_v_t, row, i),
    )
    d_q_parts = []
    for queries, keys in blocks.sub_blocks():
      d_q_part, d_k_part, d_v_part = gradients(
        k_block[:, keys],
        v_block[:, keys],
        blocks.sub_keep(keep, queries, keys),
        queries,
      )
      d_q_parts.append(d_q_part)
      d_k_tile = d_k_tile.at[:, :, keys].add(d_k_part)
      d_v_tile = d_v_tile.at[:, :, keys].add(d_v_part)
    d_q_block = d_q_block + jnp.concatenate(d_q_parts, axis=1)
    return (
      blocks.write(d_q, d_q_block * blocks.scale, row, i),
      blocks.write_t(d_k_t, d_k_tile, row, i),
      blocks.write_t(d_v_t, d_v_tile, row, i),
    )

  transposed = lambda x: jnp.zeros(
    (x.shape[0], x.shape[2], x.shape[1]), jnp.float32
  )
  d_q, d_k_t, d_v_t = jax.lax.fori_loop(
    0,
    blocks.n_steps,
    one_step,
    (jnp.zeros(q.shape, jnp.float32), transposed(k), transposed(v)),
  )
  d_k, d_v = jnp.swapaxes(d_k_t, 1, 2), jnp.swapaxes(d_v_t, 1, 2)
  return (d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype), None)


_causal_core.defvjp(_causal_forward, _causal_backward)


def causal_attention(
  q,
  k,
  v,
  dropout_rate=0.0,
  dropout_rng=None,
  block_size=DEFAULT_BLOCK_SIZE,
  step_elements=common.STEP_ELEMENTS,
  diagonal_split=DIAGONAL_SPLIT,
):
  """Causal attention, visiting only the blocks on or below the diagonal.

  Args:
    q, k: (g, L, d_head) per-head queries and keys; g = batch * heads.
    v: (g, L, d_v) per-head values.
    dropout_rate: attention-weight dropout in [0, 1); masks drawn per step
      (`common.keep_mask`).
    dropout_rng: JAX PRNG key, needed when dropout_rate > 0.
    block_size: positions per query and key block.
    step_elements: the most logits one loop step holds.
    diagonal_split: query sub-blocks per diagonal block (1 if it does not
      divide the block): each skips the keys after its own.

  Returns:
    float32 (g, L, d_v): what `reference.per_head_attention` computes with
    a lower-triangular mask, within float32 rounding, forward and backward.
  """
  rows, length, _ = q.shape
  tiles = _tiles(rows, length, block_size, step_elements, diagonal_split)
  pad = common.padding(length, tiles.block)
  if pad:  # padded keys come after every real query, so causality hides them
    q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0))) for x in (q, k, v))
  out = _causal_core(
    q,
    k,
    v,
    tiles,
    float(dropout_rate),
    common.dropout_rng_or_unused(dropout_rng),
  )
  return out[:, :length]


def cached_attention(q, ks, vs, index, block_size=CACHE_BLOCK_SIZE):
  """Predict mode: new queries over the filled part of a key/value cache.

  Args:
    q: (rows, new, d_head) queries of positions index .. index + new - 1.
    ks, vs: (rows, max_length, d) caches, the new keys and values written.
    index: the position of the first new query (a traced scalar).
    block_size: cache positions per loop step.

  Returns:
    float32 (rows, new, d_v): what the reference computes over the whole
    cache with the causal mask, from ceil((index + new) / block) blocks.
  """
  rows, new, d_head = q.shape
  max_length = ks.shape[1]
  block = min(block_size, max_length)
  pad = -max_length % block
  if pad:
    ks, vs = (jnp.pad(x, ((0, 0), (0, pad), (0, 0))) for x in (ks, vs))
  q = q * common.scale(d_head, q.dtype)
  positions = index + jnp.arange(new)[:, None]  # (new, 1)

  def one_block(j, carry):
    k_block, v_block = (
      common.read_tile(x, (0, j * block), (rows, block)) for x in (ks, vs)
    )
    logits = jnp.einsum(
      'gqd,gkd->gqk', q, k_block, preferred_element_type=jnp.float32
    )
    visible = j * block + jnp.arange(block)[None, :] <= positions
    return common.online_softmax_update(
      carry, jnp.where(visible, logits, MASK_FILL), _weigh(v_block)
    )

  shape = (rows, new, 1)
  n_blocks = (index + new + block - 1) // block
  _, denominator, numerator = jax.lax.fori_loop(
    0,
    n_blocks,
    one_block,
    (
      jnp.full(shape, common.NEG_INF, jnp.float32),
      jnp.zeros(shape, jnp.float32),
      jnp.zeros((rows, new, vs.shape[-1]), jnp.float32),
    ),
  )
  return numerator / denominator
