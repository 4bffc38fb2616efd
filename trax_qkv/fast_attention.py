"""Faster formulations of the same multi-head attention (pure functions).

Every function here computes what `attention_math.dot_product_attention`
computes -- same inputs, same float32 output, same -1e9 masking, and the same
softmax as exp(x - logsumexp(x)), whose float32 rounding makes a fully masked
query row weigh every key by 1 in trax -- within float32 rounding, but not
bit for bit. The layers use them when asked for through `implementation`:

  'reference'  attention_math: bit-identical to trax 1.4.1.
  'fused'      a loop over groups of (batch, head) pairs, 1/sqrt(d_head)
               folded into Q; mask, softmax and the V product done per group
               while its logits are in cache, and a hand-written backward
               pass that recomputes the weights from the saved logsumexp:
               memory for one group's logits, not all of them. Dropout masks
               are drawn per group (same rate, other bits). Fastest on CPUs;
               a GPU runs the loop's steps one after another, so there
               'auto' runs 'reference' (or cuDNN) instead.
  'chunked'    keys in blocks with an online softmax (lax.scan): memory
               O(Lq * block) instead of O(Lq * Lk), forward and backward.
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
from jax.scipy.special import logsumexp

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
# Logits per loop step in 'fused': 2**20 floats (4 MB), measured best on CPU.
DEFAULT_STEP_ELEMENTS = 2 ** 20


def _heads(x, n_heads):
  """(batch, L, d) -> (batch, L, heads, d_head): a reshape, no copy."""
  batch, length, d = x.shape
  return x.reshape((batch, length, n_heads, d // n_heads))


def _mask_bhqk(mask):
  """A (batch|1, 1, Lq|1, Lk) mask as booleans, broadcastable to bhqk."""
  return None if mask is None else mask.astype(bool)


def _step_sizes(n_rows, lq, lk, target=DEFAULT_STEP_ELEMENTS):
  """(rows, queries) per 'fused' step, so that its logits fit `target`.

  Whole (batch * head) rows when one row's (Lq, Lk) logits fit, as many as
  the largest divisor of n_rows allows; otherwise one row per step and its
  queries in near-equal blocks (the last one padded), so that no length --
  a prime one included -- forces tiny steps.
  """
  if lq * lk <= target:
    return max(g for g in range(1, n_rows + 1)
               if n_rows % g == 0 and g * lq * lk <= target), lq
  n_blocks = -(-lq // max(1, target // lk))
  return 1, -(-lq // n_blocks)


def _keep_mask(rng, index, rate, shape):
  return jax.random.bernoulli(jax.random.fold_in(rng, index), 1.0 - rate,
                              shape)


def _block_mask(mask, row_group, block, group, n_queries, n_heads):
  """The (group, n_queries|1, Lk) mask of one step.

  `mask` is (batch|1, Lq|1, Lk); each batch entry's row serves the n_heads
  consecutive (batch * head) rows of that entry.
  """
  rows = row_group * group + jnp.arange(group)
  batch_index = rows // n_heads if mask.shape[0] > 1 else jnp.zeros_like(rows)
  mask = jnp.take(mask, batch_index, axis=0)
  if mask.shape[1] == 1:  # one mask row for every query
    return mask
  return jax.lax.dynamic_slice_in_dim(mask, block * n_queries, n_queries, 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _blocked_core(q, k, v, mask, n_heads, rate, rng):
  return _blocked_forward(q, k, v, mask, n_heads, rate, rng)[0]


def _blocked_forward(q, k, v, mask, n_heads, rate, rng):
  """Attention step by step over (row group, query block).

  Args:
    q: (row groups, query blocks, group, queries, d_head), already scaled.
    k, v: (row groups, group, Lk, d_head).
    mask: bool (batch|1, padded Lq|1, Lk).
    n_heads, rate, rng: heads per batch entry; dropout rate and key.

  Returns:
    The output, shaped like q, and the residuals of the backward pass.
  """
  n_blocks, group, n_queries = q.shape[1:4]

  def one_group(x):
    q_group, k_group, v_group, row_group = x

    def one_block(y):
      q_block, block = y
      logits = jnp.where(
          _block_mask(mask, row_group, block, group, n_queries, n_heads),
          jnp.einsum('gqd,gkd->gqk', q_block, k_group), MASK_FILL)
      # Two passes over the logits, not three: V is weighted by
      # exp(logits - max) and the row sums are divided out of the small
      # (queries, d_head) result.
      row_max = jnp.max(logits, axis=-1, keepdims=True)
      unnormalised = jnp.exp(logits - row_max)
      lse = row_max + jnp.log(jnp.sum(unnormalised, axis=-1, keepdims=True))
      if rate > 0.0:
        keep = _keep_mask(rng, row_group * n_blocks + block, rate,
                          unnormalised.shape)
        unnormalised = jnp.where(keep, unnormalised / (1.0 - rate), 0.0)
      # exp(max - lse) rounds as the reference's exp(logits - lse) does: in a
      # fully masked row lse rounds to -1e9 and every key weighs 1.
      return (jnp.einsum('gqk,gkd->gqd', unnormalised, v_group)
              * jnp.exp(row_max - lse)), lse

    return jax.lax.map(one_block, (q_group, jnp.arange(n_blocks)))

  out, lse = jax.lax.map(one_group, (q, k, v, jnp.arange(q.shape[0])))
  return out, (q, k, v, mask, rng, out, lse)


def _blocked_backward(n_heads, rate, residuals, d_out):
  """Per step, the weights are recomputed from the saved logsumexp (as flash
  attention does) and the softmax backward uses rowsum(dO * O), which equals
  rowsum(dW * W) also with dropout and is (queries, d_head), not (queries,
  Lk). dK and dV sum over a row group's query blocks in the loop carry."""
  q, k, v, mask, rng, out, lse = residuals
  n_blocks, group, n_queries = q.shape[1:4]

  def one_group(x):
    q_group, k_group, v_group, row_group, out_group, lse_group, d_out_group = x

    def one_block(d_kv_t, y):
      q_block, block, out_block, lse_block, d_out_block = y
      logits = jnp.where(
          _block_mask(mask, row_group, block, group, n_queries, n_heads),
          jnp.einsum('gqd,gkd->gqk', q_block, k_group), MASK_FILL)
      weights = jnp.exp(logits - lse_block)
      d_weights = jnp.einsum('gqd,gkd->gqk', d_out_block, v_group)
      kept = weights
      if rate > 0.0:
        keep = _keep_mask(rng, row_group * n_blocks + block, rate,
                          weights.shape)
        kept = jnp.where(keep, weights / (1.0 - rate), 0.0)
        d_weights = jnp.where(keep, d_weights / (1.0 - rate), 0.0)
      row_sums = jnp.sum(d_out_block * out_block, axis=-1, keepdims=True)
      # Masked logits were constants (-1e9), so they get no gradient. Their
      # weights are exactly 0 already (exp(-1e9 - lse) underflows), except in
      # a fully masked row, where lse rounds to -1e9 and every weight is 1:
      # those rows are zeroed by a per-row factor, not a pass over the mask.
      row_has_keys = (lse_block > MASK_FILL / 2).astype(weights.dtype)
      d_logits = weights * ((d_weights - row_sums) * row_has_keys)
      # dK and dV come out transposed, (d_head, Lk): XLA:CPU runs
      # 'gqd,gqk->gdk' 3-4x faster than 'gqk,gqd->gkd' at these shapes.
      d_k_t, d_v_t = d_kv_t
      d_kv_t = (d_k_t + jnp.einsum('gqd,gqk->gdk', q_block, d_logits),
                d_v_t + jnp.einsum('gqd,gqk->gdk', d_out_block, kept))
      return d_kv_t, jnp.einsum('gqk,gkd->gqd', d_logits, k_group)

    zeros = jnp.zeros(jnp.swapaxes(k_group, -1, -2).shape, k_group.dtype)
    (d_k_t, d_v_t), d_q = jax.lax.scan(
        one_block, (zeros, zeros),
        (q_group, jnp.arange(n_blocks), out_group, lse_group, d_out_group))
    return d_q, d_k_t, d_v_t

  d_q, d_k_t, d_v_t = jax.lax.map(
      one_group, (q, k, v, jnp.arange(q.shape[0]), out, lse, d_out))
  return (d_q, jnp.swapaxes(d_k_t, -1, -2), jnp.swapaxes(d_v_t, -1, -2),
          None, None)


_blocked_core.defvjp(_blocked_forward, _blocked_backward)


def fused_attention(q, k, v, mask, n_heads, dropout_rate=0.0,
                    dropout_rng=None, step_elements=DEFAULT_STEP_ELEMENTS):
  """Attention one cache-sized step at a time; flash-style backward.

  A loop runs over groups of (batch, head) pairs -- or, when one pair's
  (Lq, Lk) logits are larger than `step_elements` floats, over blocks of its
  queries -- so that each step's logits are masked, soft-maxed and
  multiplied with V while they are in cache, instead of the several passes
  over the whole (batch, heads, Lq, Lk) array that the reference makes.
  1/sqrt(d_head) is folded into Q. The backward pass recomputes each step's
  weights from the saved logsumexp rather than storing them, so memory holds
  one step's logits, not all of them. Dropout masks are drawn per step (same
  rate, other bits).
  """
  batch, lq, _ = q.shape
  lk = k.shape[1]
  n_rows = batch * n_heads
  group, n_queries = _step_sizes(n_rows, lq, lk, step_elements)
  n_blocks = -(-lq // n_queries)
  pad = n_blocks * n_queries - lq

  def rows(x):  # (batch, L, d) -> (batch * heads, L, d_head)
    x = attention_math.split_heads(x, n_heads)
    return x.reshape((n_rows,) + x.shape[2:])

  d_head = q.shape[-1] // n_heads
  qh = rows(q) * jnp.asarray(1.0 / jnp.sqrt(d_head), q.dtype)
  qh = jnp.pad(qh, ((0, 0), (0, pad), (0, 0)))  # padded queries: discarded
  # (row groups, query blocks, group, queries, d_head); group == 1 whenever
  # there is more than one query block, so the swap moves no data.
  qh = jnp.swapaxes(qh.reshape((-1, group, n_blocks, n_queries, d_head)), 1, 2)
  kh, vh = (rows(x).reshape((-1, group) + x.shape[1:2] + (d_head,))
            for x in (k, v))
  if mask is None:
    mask = jnp.ones((1, 1, 1, lk), bool)
  mask = mask.astype(bool)[:, 0]
  if mask.shape[1] > 1:
    mask = jnp.pad(mask, ((0, 0), (0, pad), (0, 0)), constant_values=True)
  if dropout_rng is None:
    dropout_rng = jax.random.PRNGKey(0)  # unused when dropout_rate == 0
  out = _blocked_core(qh, kh, vh, mask, n_heads, float(dropout_rate),
                      dropout_rng)
  out = jnp.swapaxes(out, 1, 2).reshape((batch, n_heads, -1, d_head))
  return attention_math.merge_heads(out[:, :, :lq]).astype(jnp.float32)


def chunked_attention(q, k, v, mask, n_heads, dropout_rate=0.0,
                      dropout_rng=None, block_size=None, project_k=None,
                      project_v=None):
  """Attention over key blocks with an online softmax; O(Lq*block) memory.

  Each step slices one block of keys and values out of K and V (no stacked
  copies; one padded copy only when Lk is not a multiple of the block), and
  `jax.checkpoint` recomputes its logits in the backward pass, so no
  (Lq, Lk)-sized array is ever stored. With `project_k` / `project_v`
  (functions (batch, block, d_in) -> (batch, block, d)), `k` and `v` are the
  unprojected inputs and are projected block by block, so the projected
  (batch, Lk, d) K and V never exist whole either (see
  `layers.AttentionQKV`).
  """
  project_k = project_k or (lambda x: x)
  project_v = project_v or (lambda x: x)
  batch, lq, _ = q.shape
  lk = k.shape[1]
  block = min(block_size or DEFAULT_BLOCK_SIZE, lk)
  n_blocks = -(-lk // block)
  pad = n_blocks * block - lk
  qh = _heads(q, n_heads)
  qh = qh * jnp.asarray(1.0 / jnp.sqrt(qh.shape[-1]), qh.dtype)
  if mask is None:
    mask = jnp.ones((1, 1, 1, lk), bool)
  mask = jnp.broadcast_to(mask.astype(bool),
                          mask.shape[:2] + (mask.shape[2], lk))
  if pad:  # the last block runs past Lk: pad, and mark the padding invalid
    k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0))) for x in (k, v))
    mask = jnp.pad(mask, ((0, 0), (0, 0), (0, 0), (0, pad)))
  valid = jnp.arange(n_blocks * block) < lk
  acc_dtype = jnp.promote_types(q.dtype, jnp.float32)

  @jax.checkpoint  # recompute block logits in backward: memory stays small
  def step(carry, index):
    running_max, denominator, numerator = carry
    start = index * block

    def key_block(x, axis):
      return jax.lax.dynamic_slice_in_dim(x, start, block, axis=axis)
    k_blk = _heads(project_k(key_block(k, 1)), n_heads)
    v_blk = _heads(project_v(key_block(v, 1)), n_heads)
    logits = jnp.einsum('bqhd,bkhd->bhqk', qh, k_blk).astype(acc_dtype)
    logits = jnp.where(key_block(mask, 3), logits, MASK_FILL)
    logits = jnp.where(key_block(valid, 0), logits, _BLOCK_PAD_FILL)
    new_max = jnp.maximum(running_max, logits.max(axis=-1))
    correction = jnp.exp(running_max - new_max)
    p = jnp.exp(logits - new_max[..., None])
    denominator = denominator * correction + p.sum(axis=-1)
    if dropout_rate > 0.0:
      keep = jax.random.bernoulli(jax.random.fold_in(dropout_rng, index),
                                  1.0 - dropout_rate, p.shape)
      p = jnp.where(keep, p / (1.0 - dropout_rate), 0.0)
    numerator = numerator * correction[..., None] + jnp.einsum(
        'bhqk,bkhd->bhqd', p.astype(v_blk.dtype), v_blk).astype(acc_dtype)
    return (new_max, denominator, numerator), None

  stats_shape = (batch, n_heads, lq)
  d_head_v = jax.eval_shape(project_v, v[:, :1]).shape[-1] // n_heads
  init = (jnp.full(stats_shape, _BLOCK_PAD_FILL, acc_dtype),
          jnp.zeros(stats_shape, acc_dtype),
          jnp.zeros(stats_shape + (d_head_v,), acc_dtype))
  (row_max, denominator, numerator), _ = jax.lax.scan(
      step, init, jnp.arange(n_blocks))
  # Normalise as exp(max - logsumexp), rounded as the reference rounds it: in
  # a fully masked row logsumexp = -1e9 + log(Lk) rounds to -1e9, so the
  # reference weighs every key by 1 (a sum, not a mean); so do we.
  scale = jnp.exp(row_max - (row_max + jnp.log(denominator)))
  out = numerator * scale[..., None]  # (batch, heads, Lq, d_head)
  return attention_math.merge_heads(out).astype(jnp.float32)


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
  del n_heads
  if cudnn_supported(q, dropout_rate):
    return 'cudnn'
  if q.shape[1] <= FEW_QUERIES and k.shape[1] >= CHUNKED_MIN_KEYS:
    return 'chunked'  # memory: O(Lq * block) instead of O(Lq * Lk)
  # On a GPU the loop steps of 'fused' run one after another and lose to
  # XLA's own fusions of the reference (kernel_bench on an H200: 0.4-0.7x).
  return 'reference' if jax.default_backend() == 'gpu' else 'fused'


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
