"""Faster formulations of the same multi-head attention (pure functions).

Every function here computes what `attention_math.dot_product_attention`
computes -- same inputs, same float32 output, same -1e9 masking, and the same
softmax as exp(x - logsumexp(x)), whose float32 rounding makes a fully masked
query row weigh every key by 1 in trax -- within float32 rounding, but not
bit for bit. The layers use them when asked for through `implementation`:

  'reference'  attention_math: bit-identical to trax 1.4.1.
  'fused'      a loop over cache-sized tiles of (batch entries, heads,
               queries), sliced out of the (batch, L, d) arrays as they are
               (no head transposes); mask, softmax and the V product done
               per tile while its logits are in cache, and a hand-written
               backward pass that recomputes the weights from the saved
               logsumexp: memory for one tile's logits, not all of them.
               Dropout masks are drawn per tile (same rate, other bits).
               Fastest on CPUs; a GPU runs the loop's steps one after
               another, so there 'auto' runs 'reference' (or cuDNN).
  'chunked'    keys in blocks with an online softmax, and a hand-written
               backward pass over the same blocks: memory O(Lq * block)
               instead of O(Lq * Lk), forward and backward.
               Dropout masks are drawn per block (same rate, other bits).
               In AttentionQKV the K and V projections run per key block
               too (layers.KeyBlockProjectedAttention).
  'cudnn'      jax.nn.dot_product_attention's cuDNN kernel: GPU, bf16/fp16,
               no attention dropout.
  'auto'       the best of these for the device, shapes, dtype and dropout.
"""

import functools

import jax
import jax.numpy as jnp

from trax_qkv import attention_math

IMPLEMENTATIONS = ('reference', 'fused', 'chunked', 'cudnn', 'auto')
MASK_FILL = attention_math.MASK_FILL
# Logit for key positions added to fill the last block: far below MASK_FILL,
# so they get zero weight even in a fully masked row.
_BLOCK_PAD_FILL = -1e30
# 'auto' runs 'chunked' (keys in blocks) for at most FEW_QUERIES queries
# over at least CHUNKED_MIN_KEYS keys, where the (Lq, Lk) logits and the
# projected K and V are what fills memory.
FEW_QUERIES = 64
CHUNKED_MIN_KEYS = 4096
DEFAULT_BLOCK_SIZE = 512
# Logits per loop step in 'fused': 2**19 floats (2 MB). AttentionQKV
# forward+backward measured 3-10 % faster than with 2**20 at lengths 1024 and
# 4096, and its temporary memory stays under 32 MB, which malloc reuses
# instead of mapping (and page-faulting) it afresh on every call. (Unrolling
# the loops by 2 sped the attention math alone up by 2-6 %, but took the
# layer's forward+backward temporaries to 32.1 MB at (4, 1024, 256, 8):
# 8,200 page faults per call instead of ~2,400, and 4-8 % slower.)
DEFAULT_STEP_ELEMENTS = 2 ** 19
# 'auto' runs the reference when all (batch, heads, Lq, Lk) logits fit in
# this many floats (4 MB): nothing to tile, and its backward, which keeps
# the weights instead of recomputing them, is the cheaper one there.
REFERENCE_MAX_LOGITS = 2 ** 20


def _heads(x, n_heads):
  """(batch, L, d) -> (batch, L, heads, d_head): a reshape, no copy."""
  batch, length, d = x.shape
  return x.reshape((batch, length, n_heads, d // n_heads))


def _mask_bhqk(mask):
  """A (batch|1, 1, Lq|1, Lk) mask as booleans, broadcastable to bhqk."""
  return None if mask is None else mask.astype(bool)


def _step_tiles(batch, n_heads, lq, lk, target=DEFAULT_STEP_ELEMENTS):
  """(batch entries, heads, queries) per 'fused' step: the step's logits
  fit `target` floats.

  Whole batch entries while one entry's (heads, Lq, Lk) logits fit, as many
  as the largest divisor of `batch` allows; else heads of one entry, the
  same way; else one head's queries in near-equal blocks (the last padded),
  so that no length -- a prime one included -- forces tiny steps.
  """
  def largest_divisor(n, size):
    return max(g for g in range(1, n + 1) if n % g == 0 and g * size <= target)
  if n_heads * lq * lk <= target:
    return largest_divisor(batch, n_heads * lq * lk), n_heads, lq
  if lq * lk <= target:
    return 1, largest_divisor(n_heads, lq * lk), lq
  n_blocks = -(-lq // max(1, target // lk))
  return 1, 1, -(-lq // n_blocks)


def _keep_mask(rng, index, rate, shape):
  return jax.random.bernoulli(jax.random.fold_in(rng, index), 1.0 - rate,
                              shape)


def _dropped(x, keep, rate):
  """x with the entries dropped by `keep` zeroed and the kept ones scaled by
  1 / (1 - rate), so that the expectation is unchanged."""
  return jnp.where(keep, x / (1.0 - rate), 0.0)


def _softmax_backward(weights, d_weights, row_sums, lse, rate, keep):
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
    kept = _dropped(weights, keep, rate)
    d_weights = _dropped(d_weights, keep, rate)
  row_has_keys = (lse > MASK_FILL / 2).astype(weights.dtype)
  return kept, weights * ((d_weights - row_sums) * row_has_keys)


class _Tiling:
  """Where step i of the 'fused' loop reads and writes.

  Arrays keep their (batch, L, heads * d_head) layout: a step slices its
  batch entries, queries and heads out of them, so no transposed copy of
  Q, K, V or their gradients is ever made.
  """

  def __init__(self, q, k, mask, tiles, n_heads):
    self.batch, self.lq, d = q.shape
    self.lk = k.shape[1]
    self.n_batch, self.n_heads_step, self.n_queries = tiles
    self.n_heads = n_heads
    self.d_head = d // n_heads
    self.rows = self.n_batch * self.n_heads_step  # (batch, head) pairs
    # 1/sqrt(d_head): the forward scales q by it once; dq gets it too.
    self.scale = jnp.asarray(1.0 / self.d_head ** 0.5, q.dtype)
    self.mask = mask
    self.counts = (self.batch // self.n_batch, n_heads // self.n_heads_step,
                   self.lq // self.n_queries)
    self.n_steps = self.counts[0] * self.counts[1] * self.counts[2]

  def origin(self, step):
    """(first batch entry, first query, first feature) of a step."""
    _, n_h, n_q = self.counts
    return (step // (n_h * n_q) * self.n_batch,
            step % n_q * self.n_queries,
            step // n_q % n_h * self.n_heads_step * self.d_head)

  def read(self, x, step, queries):
    """The step's (n_batch * n_heads_step, L, d_head) slice of a (batch, L,
    d) array: its queries only if `queries`, else the whole length."""
    b, q, f = self.origin(step)
    length = self.n_queries if queries else x.shape[1]
    x = jax.lax.dynamic_slice(
        x, (b, q if queries else 0, f),
        (self.n_batch, length, self.n_heads_step * self.d_head))
    # (n_batch, L, heads, d_head) -> (n_batch * heads, L, d_head); moves no
    # data when the step has one head.
    x = x.reshape((self.n_batch, length, self.n_heads_step, self.d_head))
    return jnp.swapaxes(x, 1, 2).reshape((-1, length, self.d_head))

  def write(self, x, rows, step, queries):
    """x with the step's (n_batch * n_heads_step, L, d_head) rows written."""
    b, q, f = self.origin(step)
    rows = rows.reshape((self.n_batch, self.n_heads_step) + rows.shape[1:])
    rows = jnp.swapaxes(rows, 1, 2).reshape(
        (self.n_batch, rows.shape[2], -1)).astype(x.dtype)
    return jax.lax.dynamic_update_slice(x, rows, (b, q if queries else 0, f))

  def step_mask(self, step):
    """The step's mask, broadcastable to its (rows, queries, Lk) logits."""
    b, q, _ = self.origin(step)
    mask = self.mask
    size = (self.n_batch if mask.shape[0] > 1 else 1,
            self.n_queries if mask.shape[1] > 1 else 1, self.lk)
    mask = jax.lax.dynamic_slice(
        mask, (b if mask.shape[0] > 1 else 0, q if mask.shape[1] > 1 else 0,
               0), size)
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
    return jax.lax.dynamic_slice(x, self.per_query_origin(step),
                                 (self.rows, self.n_queries))[..., None]

  def write_per_query(self, x, values, step):
    """x with the step's (rows, queries, 1) values written."""
    return jax.lax.dynamic_update_slice(x, values[..., 0].astype(x.dtype),
                                        self.per_query_origin(step))


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
        jnp.einsum('gqd,gkd->gqk', tiling.read(q, step, True),
                   tiling.read(k, step, False)), MASK_FILL)
    # Two passes over the logits, not three: V is weighted by
    # exp(logits - max) and the row sums are divided out of the small
    # (queries, d_head) result.
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    unnormalised = jnp.exp(logits - row_max)
    step_lse = row_max + jnp.log(jnp.sum(unnormalised, axis=-1,
                                         keepdims=True))
    if rate > 0.0:
      unnormalised = _dropped(
          unnormalised, _keep_mask(rng, step, rate, unnormalised.shape), rate)
    # exp(max - lse) rounds as the reference's exp(logits - lse) does: in a
    # fully masked row lse rounds to -1e9 and every key weighs 1.
    rows = (jnp.einsum('gqk,gkd->gqd', unnormalised,
                       tiling.read(v, step, False))
            * jnp.exp(row_max - step_lse))
    return (tiling.write(out, rows, step, True),
            tiling.write_per_query(lse, step_lse, step))

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
  all_row_sums = jnp.sum((d_out * out).reshape(
      (batch, lq, n_heads, tiling.d_head)), axis=-1)
  all_row_sums = jnp.swapaxes(all_row_sums, 1, 2).reshape((-1, lq))

  def one_block(step, k_step, v_step, carry):
    d_q, d_k_t, d_v_t = carry
    q_step = tiling.read(q, step, True)
    d_out_step = tiling.read(d_out, step, True)
    step_lse = tiling.read_per_query(lse, step)
    logits = jnp.where(tiling.step_mask(step),
                       jnp.einsum('gqd,gkd->gqk', q_step, k_step), MASK_FILL)
    weights = jnp.exp(logits - step_lse)
    d_weights = jnp.einsum('gqd,gkd->gqk', d_out_step, v_step)
    keep = (_keep_mask(rng, step, rate, weights.shape) if rate > 0.0
            else None)
    kept, d_logits = _softmax_backward(
        weights, d_weights, tiling.read_per_query(all_row_sums, step),
        step_lse, rate, keep)
    d_q_step = jnp.einsum('gqk,gkd->gqd', d_logits, k_step) * tiling.scale
    # dK and dV as (d_head, Lk): XLA:CPU runs 'gqd,gqk->gdk' about 3x faster
    # than 'gqk,gqd->gkd' at these shapes.
    return (tiling.write(d_q, d_q_step, step, True),
            d_k_t + jnp.einsum('gqd,gqk->gdk', q_step, d_logits),
            d_v_t + jnp.einsum('gqd,gqk->gdk', d_out_step, kept))

  def one_tile(tile, carry):
    d_q, d_k, d_v = carry
    first = tile * n_blocks
    # The tile's K and V, read once for all of its query blocks.
    k_step, v_step = tiling.read(k, first, False), tiling.read(v, first, False)
    zeros = jnp.zeros((tiling.rows, tiling.d_head, tiling.lk), jnp.float32)
    d_q, d_k_t, d_v_t = jax.lax.fori_loop(
        0, n_blocks,
        lambda block, c: one_block(first + block, k_step, v_step, c),
        (d_q, zeros, zeros))
    return (d_q, tiling.write(d_k, jnp.swapaxes(d_k_t, 1, 2), first, False),
            tiling.write(d_v, jnp.swapaxes(d_v_t, 1, 2), first, False))

  zeros = tuple(jnp.zeros(x.shape, x.dtype) for x in (q, k, v))
  d_q, d_k, d_v = jax.lax.fori_loop(0, tiling.n_steps // n_blocks, one_tile,
                                    zeros)
  return d_q, d_k, d_v, None, None


_fused_core.defvjp(_fused_forward, _fused_backward)


def fused_attention(q, k, v, mask, n_heads, dropout_rate=0.0,
                    dropout_rng=None, step_elements=DEFAULT_STEP_ELEMENTS):
  """Attention one cache-sized step at a time; flash-style backward.

  A loop runs over tiles of (batch entries, heads, queries) whose logits
  take at most `step_elements` floats, so that each step's logits are
  masked, soft-maxed and multiplied with V while they are in cache, instead
  of the several passes over the whole (batch, heads, Lq, Lk) array that
  the reference makes. Steps slice their heads out of the (batch, L, d)
  arrays as they are (no head transposes); q is scaled by 1/sqrt(d_head)
  once, before the loop. The backward pass recomputes each step's weights
  from the saved logsumexp rather than storing them, so memory holds one
  step's logits, not all of them. Dropout masks are drawn per step (same
  rate, other bits).
  """
  batch, lq, _ = q.shape
  tiles = _step_tiles(batch, n_heads, lq, k.shape[1], step_elements)
  pad = -lq % tiles[2]  # queries added to fill the last block: discarded
  if mask is None:
    mask = jnp.ones((1, 1, k.shape[1]), bool)
  else:
    mask = mask.astype(bool)[:, 0]
  if pad:
    q = jnp.pad(q, ((0, 0), (0, pad), (0, 0)))
    if mask.shape[1] > 1:
      mask = jnp.pad(mask, ((0, 0), (0, pad), (0, 0)), constant_values=True)
  if dropout_rng is None:
    dropout_rng = jax.random.PRNGKey(0)  # unused when dropout_rate == 0
  out = _fused_core(q, k, v, mask, tiles, n_heads, float(dropout_rate),
                    dropout_rng)
  return out[:, :lq].astype(jnp.float32)


def _unprojected(k_block, v_block, params):
  del params
  return k_block, v_block


def chunked_attention(q, k, v, mask, n_heads, dropout_rate=0.0,
                      dropout_rng=None, block_size=None, project_kv=None,
                      kv_params=()):
  """Attention over key blocks with an online softmax; O(Lq*block) memory.

  A loop slices one block of keys and values out of K and V per step (no
  stacked copies; one padded copy only when Lk is not a multiple of the
  block), and a hand-written backward pass recomputes each block's weights
  from the saved logsumexp, so no (Lq, Lk)-sized array is ever stored.

  With `project_kv` -- a function (k_block, v_block, kv_params) -> (K_block,
  V_block) -- `k` and `v` are the unprojected inputs and are projected block
  by block, in the backward pass too, so the projected (batch, Lk, d) K and
  V and their gradients never exist whole either (see
  `layers.KeyBlockProjectedAttention`). Gradients reach `kv_params` through
  `jax.vjp` of `project_kv` per block.
  """
  project_kv = project_kv or _unprojected
  lk = k.shape[1]
  block = min(block_size or DEFAULT_BLOCK_SIZE, lk)
  n_blocks = -(-lk // block)
  pad = n_blocks * block - lk
  sources = (k, v)
  qh = attention_math.split_heads(q, n_heads)
  qh = qh * jnp.asarray(1.0 / jnp.sqrt(qh.shape[-1]), qh.dtype)
  if mask is None:
    mask = jnp.ones((1, 1, 1, lk), bool)
  mask = jnp.broadcast_to(mask.astype(bool),
                          mask.shape[:2] + (mask.shape[2], lk))
  if pad:  # the last block runs past Lk: pad, and mark the padding invalid
    sources = tuple(jnp.pad(x, ((0, 0), (0, pad), (0, 0))) for x in sources)
    mask = jnp.pad(mask, ((0, 0), (0, 0), (0, 0), (0, pad)))
  if dropout_rng is None:
    dropout_rng = jax.random.PRNGKey(0)  # unused when dropout_rate == 0
  config = _ChunkConfig(project_kv, n_heads, block, lk, float(dropout_rate))
  out = _chunked_core(config, qh, sources, kv_params, mask, dropout_rng)
  return attention_math.merge_heads(out).astype(jnp.float32)


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
        jax.lax.dynamic_slice_in_dim(x, index * self.block, self.block, 1)
        for x in sources)

  def logits(self, qh, k_block, mask, index):
    """(batch, heads, Lq, block) logits, masked, padding far below that."""
    start = index * self.block
    logits = jnp.einsum('bhqd,bkhd->bhqk', qh, _heads(k_block, self.n_heads))
    logits = logits.astype(jnp.promote_types(qh.dtype, jnp.float32))
    logits = jnp.where(
        jax.lax.dynamic_slice_in_dim(mask, start, self.block, 3), logits,
        MASK_FILL)
    valid = start + jnp.arange(self.block) < self.lk
    return jnp.where(valid, logits, _BLOCK_PAD_FILL)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunked_core(config, qh, sources, kv_params, mask, rng):
  return _chunked_forward(config, qh, sources, kv_params, mask, rng)[0]


def _chunked_forward(config, qh, sources, kv_params, mask, rng):
  """(batch, heads, Lq, d_head) output of scaled `qh` over the key blocks of
  `sources`, and the residuals of the backward pass."""
  acc_dtype = jnp.promote_types(qh.dtype, jnp.float32)
  n_blocks = sources[0].shape[1] // config.block

  def one_block(index, carry):
    running_max, denominator, numerator = carry
    k_block, v_block = config.project_kv(
        *config.source_blocks(sources, index), kv_params)
    logits = config.logits(qh, k_block, mask, index)
    new_max = jnp.maximum(running_max, logits.max(axis=-1))
    correction = jnp.exp(running_max - new_max)
    p = jnp.exp(logits - new_max[..., None])
    denominator = denominator * correction + p.sum(axis=-1)
    if config.rate > 0.0:
      p = _dropped(p, _keep_mask(rng, index, config.rate, p.shape),
                   config.rate)
    numerator = numerator * correction[..., None] + jnp.einsum(
        'bhqk,bkhd->bhqd', p.astype(v_block.dtype),
        _heads(v_block, config.n_heads)).astype(acc_dtype)
    return new_max, denominator, numerator

  stats_shape = qh.shape[:3]
  d_head_v = jax.eval_shape(
      config.project_kv, *config.source_blocks(sources, 0),
      kv_params)[1].shape[-1] // config.n_heads
  init = (jnp.full(stats_shape, _BLOCK_PAD_FILL, acc_dtype),
          jnp.zeros(stats_shape, acc_dtype),
          jnp.zeros(stats_shape + (d_head_v,), acc_dtype))
  row_max, denominator, numerator = jax.lax.fori_loop(
      0, n_blocks, one_block, init)
  lse = row_max + jnp.log(denominator)
  # Normalise as exp(max - logsumexp), rounded as the reference rounds it: in
  # a fully masked row logsumexp = -1e9 + log(Lk) rounds to -1e9, so the
  # reference weighs every key by 1 (a sum, not a mean); so do we.
  out = numerator * jnp.exp(row_max - lse)[..., None]
  return out, (qh, sources, kv_params, mask, rng, out, lse[..., None])


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
        config.source_blocks(sources, index), kv_params)
    kh = _heads(k_block, config.n_heads)
    weights = jnp.exp(config.logits(qh, k_block, mask, index) - lse)
    d_weights = jnp.einsum('bhqd,bkhd->bhqk', d_out,
                           _heads(v_block, config.n_heads))
    keep = (_keep_mask(rng, index, config.rate, weights.shape)
            if config.rate > 0.0 else None)
    kept, d_logits = _softmax_backward(weights, d_weights, row_sums, lse,
                                       config.rate, keep)
    d_q = d_q + jnp.einsum('bhqk,bkhd->bhqd', d_logits, kh)
    d_k = jnp.einsum('bhqk,bhqd->bkhd', d_logits, qh.astype(out.dtype))
    d_v = jnp.einsum('bhqk,bhqd->bkhd', kept, d_out)
    d_blocks, d_params_block = pull_back(
        (d_k.reshape(k_block.shape).astype(k_block.dtype),
         d_v.reshape(v_block.shape).astype(v_block.dtype)))
    d_sources = tuple(
        jax.lax.dynamic_update_slice_in_dim(
            d, d_block.astype(d.dtype), index * config.block, 1)
        for d, d_block in zip(d_sources, d_blocks))
    d_params = jax.tree_util.tree_map(jnp.add, d_params, d_params_block)
    return d_q, d_sources, d_params

  zeros = lambda tree: jax.tree_util.tree_map(jnp.zeros_like, tree)
  d_q, d_sources, d_params = jax.lax.fori_loop(
      0, n_blocks, one_block,
      (jnp.zeros(qh.shape, out.dtype), zeros(sources), zeros(kv_params)))
  return d_q.astype(qh.dtype), d_sources, d_params, None, None


_chunked_core.defvjp(_chunked_forward, _chunked_backward)


def cudnn_attention(q, k, v, mask, n_heads, dropout_rate=0.0,
                    dropout_rng=None):
  """jax.nn.dot_product_attention with implementation='cudnn' (GPU only)."""
  del dropout_rng
  if dropout_rate > 0.0:
    raise ValueError("implementation='cudnn' has no attention dropout; use "
                     "'auto' (falls back) or dropout=0.")
  qh, kh, vh = (_heads(x, n_heads) for x in (q, k, v))
  if mask is not None:
    mask = jnp.broadcast_to(_mask_bhqk(mask),
                            (q.shape[0], 1, q.shape[1], k.shape[1]))
  out = jax.nn.dot_product_attention(qh, kh, vh, mask=mask,
                                     implementation='cudnn')
  return out.reshape(q.shape[:2] + (v.shape[-1],)).astype(jnp.float32)


def cudnn_supported(q, dropout_rate):
  return (jax.default_backend() == 'gpu' and dropout_rate == 0.0
          and q.dtype in (jnp.bfloat16, jnp.float16))


def choose_implementation(q, k, n_heads, dropout_rate):
  """What 'auto' runs for these inputs (see scripts/bench*.py for why)."""
  if cudnn_supported(q, dropout_rate):
    return 'cudnn'
  if q.shape[1] <= FEW_QUERIES and k.shape[1] >= CHUNKED_MIN_KEYS:
    return 'chunked'  # memory: O(Lq * block) instead of O(Lq * Lk)
  # On a GPU the loop steps of 'fused' run one after another and lose to
  # XLA's own fusions of the reference (kernel_bench on an H200: 0.4-0.7x).
  if jax.default_backend() == 'gpu':
    return 'reference'
  # Small: the attention math at batch 32, length 64 measured 6.9 ms
  # forward+backward as the reference, 7.8 ms as 'fused'.
  if q.shape[0] * n_heads * q.shape[1] * k.shape[1] <= REFERENCE_MAX_LOGITS:
    return 'reference'
  return 'fused'


_FUNCTIONS = {
    'reference': lambda *a, **kw: attention_math.dot_product_attention(
        *a, **kw)[0],
    'fused': fused_attention,
    'chunked': chunked_attention,
    'cudnn': cudnn_attention,
}


def resolve_implementation(implementation, q, k, n_heads, dropout_rate):
  """The implementation that runs: 'auto' picks for these inputs, and
  'cudnn' falls back to what 'auto' would run where the kernel cannot
  (no GPU, float32, or dropout): the result is the same attention."""
  if implementation == 'auto' or (
      implementation == 'cudnn' and not cudnn_supported(q, dropout_rate)):
    return choose_implementation(q, k, n_heads, dropout_rate)
  return implementation


def attend(q, k, v, mask, n_heads, dropout_rate=0.0, dropout_rng=None,
           implementation='reference'):
  """Multi-head attention activations, float32 (batch, Lq, d_v).

  `implementation` is one of IMPLEMENTATIONS (see `resolve_implementation`).
  """
  implementation = resolve_implementation(implementation, q, k, n_heads,
                                          dropout_rate)
  return _FUNCTIONS[implementation](q, k, v, mask, n_heads,
                                    dropout_rate=dropout_rate,
                                    dropout_rng=dropout_rng)
