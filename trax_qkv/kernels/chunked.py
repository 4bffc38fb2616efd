"""'chunked': keys in blocks with an online softmax, and its own backward.

Memory O(Lq * block) instead of O(Lq * Lk), forward and backward: no
(Lq, Lk)-sized array is ever stored. With a K/V projection function the
projected K and V are computed block by block too (see
`trax_qkv.layers.attention.KeyBlockProjectedAttention`). Dropout masks are
drawn per block (same rate, other bits: `common.keep_mask`).
"""

import functools

import jax
import jax.numpy as jnp

from trax_qkv.kernels import common
from trax_qkv.kernels import reference
from trax_qkv.kernels.reference import MASK_FILL

DEFAULT_BLOCK_SIZE = 512  # keys per block


def _unprojected(k_block, v_block, params):
  del params
  return k_block, v_block


def chunked_attention(
  q,
  k,
  v,
  mask,
  n_heads,
  dropout_rate=0.0,
  dropout_rng=None,
  block_size=None,
  project_kv=None,
  kv_params=(),
):
  """Attention over key blocks with an online softmax; O(Lq*block) memory.

  A loop slices one block of keys and values out of K and V per step (one
  padded copy only when Lk is not a multiple of the block), and the
  backward pass recomputes each block's weights from the saved logsumexp,
  so no (Lq, Lk)-sized array is ever stored.

  Args:
    q: (b, Lq, d) projected queries.
    k: (b, Lk, d) keys; (b, Lk, d_in) inputs of `project_kv` if given.
    v: (b, Lk, d_v) values; likewise.
    mask: None, or broadcastable to (b, 1, Lq, Lk); nonzero = attend.
    n_heads: heads; divides d and d_v.
    dropout_rate: attention-weight dropout in [0, 1); masks drawn per
      block (`common.keep_mask`).
    dropout_rng: JAX PRNG key, needed when dropout_rate > 0.
    block_size: keys per block (default DEFAULT_BLOCK_SIZE).
    project_kv: None, or f(k_block, v_block, kv_params) -> (K_block,
      V_block): K and V are then projected block by block, in the backward
      pass too, so the projected (b, Lk, d) K and V and their gradients
      never exist whole (`layers.attention.KeyBlockProjectedAttention`);
      gradients reach `kv_params` through `jax.vjp` per block.
    kv_params: the pytree `project_kv` takes.

  Returns:
    float32 (b, Lq, d_v): what `reference.dot_product_attention` returns
    first, within float32 rounding.
  """
  project_kv = project_kv or _unprojected
  lk = k.shape[1]
  block = min(block_size or DEFAULT_BLOCK_SIZE, lk)
  pad = common.padding(lk, block)
  sources = (k, v)
  qh = reference.split_heads(q, n_heads)
  qh = qh * common.scale(qh.shape[-1], qh.dtype)
  if mask is None:
    mask = jnp.ones((1, 1, 1, lk), bool)
  mask = jnp.broadcast_to(
    mask.astype(bool), mask.shape[:2] + (mask.shape[2], lk)
  )
  if pad:  # the last block runs past Lk: pad, and mark the padding invalid
    sources = tuple(jnp.pad(x, ((0, 0), (0, pad), (0, 0))) for x in sources)
    mask = jnp.pad(mask, ((0, 0), (0, 0), (0, 0), (0, pad)))
  config = _ChunkConfig(project_kv, n_heads, block, lk, float(dropout_rate))
  out = _chunked_core(
    config,
    qh,
    sources,
    kv_params,
    mask,
    common.dropout_rng_or_unused(dropout_rng),
  )
  return reference.merge_heads(out).astype(jnp.float32)


class _ChunkConfig:
  """The static part of a 'chunked' call, and what every step computes."""

  def __init__(self, project_kv, n_heads, block, lk, rate):
    self.project_kv = project_kv
    self.n_heads = n_heads
    self.block = block
    self.lk = lk  # keys before padding
    self.rate = rate

  def source_blocks(self, sources, index):
    """Block `index` of the K and V sources (the inputs of `project_kv`)."""
    return tuple(
      common.read_tile(x, (0, index * self.block), (x.shape[0], self.block))
      for x in sources
    )

  def logits(self, qh, k_block, mask, index):
    """(batch, heads, Lq, block) logits, masked, padding far below that."""
    start = index * self.block
    logits = jnp.einsum(
      'bhqd,bkhd->bhqk', qh, common.heads_last(k_block, self.n_heads)
    )
    logits = logits.astype(jnp.promote_types(qh.dtype, jnp.float32))
    mask = common.read_tile(
      mask, (0, 0, 0, start), mask.shape[:3] + (self.block,)
    )
    logits = jnp.where(mask, logits, MASK_FILL)
    valid = start + jnp.arange(self.block) < self.lk
    return jnp.where(valid, logits, common.NEG_INF)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunked_core(config, qh, sources, kv_params, mask, rng):
  return _chunked_forward(config, qh, sources, kv_params, mask, rng)[0]


def _chunked_forward(config, qh, sources, kv_params, mask, rng):
  """(batch, heads, Lq, d_head) output of scaled `qh` over the key blocks of
  `sources`, and the residuals of the backward pass."""
  acc_dtype = jnp.promote_types(qh.dtype, jnp.float32)
  n_blocks = sources[0].shape[1] // config.block

  def one_block(index, carry):
    k_block, v_block = config.project_kv(
      *config.source_blocks(sources, index), kv_params
    )
    vh = common.heads_last(v_block, config.n_heads)
    drop = None
    if config.rate > 0.0:  # the mask's shape is the weights', known inside
      drop = lambda p: common.dropped(
        p, common.keep_mask(rng, index, config.rate, p.shape), config.rate
      )
    return common.online_softmax_update(
      carry,
      config.logits(qh, k_block, mask, index),
      lambda p: jnp.einsum(
        'bhqk,bkhd->bhqd', p.astype(v_block.dtype), vh
      ).astype(acc_dtype),
      drop,
    )

  stats_shape = qh.shape[:3] + (1,)
  d_head_v = (
    jax.eval_shape(
      config.project_kv, *config.source_blocks(sources, 0), kv_params
    )[1].shape[-1]
    // config.n_heads
  )
  init = (
    jnp.full(stats_shape, common.NEG_INF, acc_dtype),
    jnp.zeros(stats_shape, acc_dtype),
    jnp.zeros(qh.shape[:3] + (d_head_v,), acc_dtype),
  )
  row_max, denominator, numerator = jax.lax.fori_loop(
    0, n_blocks, one_block, init
  )
  lse = row_max + jnp.log(denominator)
  # Normalise as exp(max - logsumexp), rounded as the reference rounds it: in
  # a fully masked row logsumexp = -1e9 + log(Lk) rounds to -1e9, so the
  # reference weighs every key by 1 (a sum, not a mean); so do we.
  out = numerator * jnp.exp(row_max - lse)
  return out, (qh, sources, kv_params, mask, rng, out, lse)


def _chunked_backward(config, residuals, d_out):
  """Per key block: K and V projected again, the weights recomputed from the
  logsumexp (as in 'fused'), and the block's dK and dV pulled back through
  the projection into the gradients of its inputs and of `kv_params`."""
  qh, sources, kv_params, mask, rng, out, lse = residuals
  n_blocks = sources[0].shape[1] // config.block
  row_sums = jnp.sum(d_out * out, axis=-1, keepdims=True)
  d_out = d_out.astype(out.dtype)

  def one_block(index, carry):
    d_q, d_sources, d_params = carry
    # Only the block is pulled back through the projection, not the whole
    # sources: differentiating the slice would add Lk-sized zeros each step.
    (k_block, v_block), pull_back = jax.vjp(
      lambda blocks, params: config.project_kv(*blocks, params),
      config.source_blocks(sources, index),
      kv_params,
    )
    kh = common.heads_last(k_block, config.n_heads)
    weights = jnp.exp(config.logits(qh, k_block, mask, index) - lse)
    d_weights = jnp.einsum(
      'bhqd,bkhd->bhqk', d_out, common.heads_last(v_block, config.n_heads)
    )
    keep = common.keep_mask(rng, index, config.rate, weights.shape)
    kept, d_logits = common.softmax_backward(
      weights, d_weights, row_sums, lse, config.rate, keep
    )
    d_q = d_q + jnp.einsum('bhqk,bkhd->bhqd', d_logits, kh)
    d_k = jnp.einsum('bhqk,bhqd->bkhd', d_logits, qh.astype(out.dtype))
    d_v = jnp.einsum('bhqk,bhqd->bkhd', kept, d_out)
    d_blocks, d_params_block = pull_back(
      (
        d_k.reshape(k_block.shape).astype(k_block.dtype),
        d_v.reshape(v_block.shape).astype(v_block.dtype),
      )
    )
    d_sources = tuple(
      common.write_tile(d, d_block, (0, index * config.block))
      for d, d_block in zip(d_sources, d_blocks)
    )
    d_params = jax.tree_util.tree_map(jnp.add, d_params, d_params_block)
    return d_q, d_sources, d_params

  zeros = lambda tree: jax.tree_util.tree_map(jnp.zeros_like, tree)
  d_q, d_sources, d_params = jax.lax.fori_loop(
    0,
    n_blocks,
    one_block,
    (jnp.zeros(qh.shape, out.dtype), zeros(sources), zeros(kv_params)),
  )
  return d_q.astype(qh.dtype), d_sources, d_params, None, None


_chunked_core.defvjp(_chunked_forward, _chunked_backward)
