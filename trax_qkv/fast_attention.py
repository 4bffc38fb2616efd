"""Faster formulations of the same multi-head attention (pure functions).

Every function here computes what `attention_math.dot_product_attention`
computes -- same inputs, same float32 output, same -1e9 masking, and the same
softmax as exp(x - logsumexp(x)), whose float32 rounding makes a fully masked
query row weigh every key by 1 in trax -- within float32 rounding, but not
bit for bit. The layers use them when asked for through `implementation`:

  'reference'  attention_math: bit-identical to trax 1.4.1.
  'fused'      queries in blocks, 1/sqrt(d_head) folded into Q, mask, softmax
               and the V product done per block while the block's logits are
               in cache, and a hand-written backward pass that recomputes the
               weights from the saved logsumexp: O(block * Lk) memory.
               Dropout masks are drawn per query block (same rate, other bits).
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
# 'auto' runs 'chunked' (keys in blocks) when there are too few queries for
# query blocks to help and the keys are this many or more.
CHUNKED_MIN_KEYS = 4096
DEFAULT_BLOCK_SIZE = 512
# Queries per block in 'fused': (heads, 64, Lk) float32 logits stay in cache.
DEFAULT_QUERY_BLOCK = 64


def _heads(x, n_heads):
  """(batch, L, d) -> (batch, L, heads, d_head): a reshape, no copy."""
  batch, length, d = x.shape
  return x.reshape((batch, length, n_heads, d // n_heads))


def _mask_bhqk(mask):
  """A (batch|1, 1, Lq|1, Lk) mask as booleans, broadcastable to bhqk."""
  return None if mask is None else mask.astype(bool)


def _query_block_size(lq, block):
  """Largest divisor of lq that is <= block (blocks must tile Lq exactly)."""
  return max(d for d in range(1, min(block, lq) + 1) if lq % d == 0)


def _blocked_logits(q_block, k, mask_block):
  logits = jnp.einsum('bhqd,bhkd->bhqk', q_block, k)
  return jnp.where(mask_block, logits, MASK_FILL)


def _split_query_blocks(x, n, axis):
  """Splits `axis` into n equal blocks, stacked on a new leading axis."""
  shape = x.shape[:axis] + (n, x.shape[axis] // n) + x.shape[axis + 1:]
  return jnp.moveaxis(x.reshape(shape), axis, 0)


def _join_query_blocks(x, axis):
  x = jnp.moveaxis(x, 0, axis)
  return x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 2:])


def _mask_blocks(mask, n_blocks):
  """(batch, 1, Lq|1, Lk) mask -> one mask per query block, stacked."""
  if mask.shape[2] > 1:
    return _split_query_blocks(mask, n_blocks, 2)
  return jnp.broadcast_to(mask[None], (n_blocks,) + mask.shape)


def _keep_mask(rng, index, rate, shape):
  return jax.random.bernoulli(jax.random.fold_in(rng, index), 1.0 - rate,
                              shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _blocked_core(q, k, v, mask, rate, block, rng):
  return _blocked_forward(q, k, v, mask, rate, block, rng)[0]


def _blocked_forward(q, k, v, mask, rate, block, rng):
  """q, k, v: (batch, heads, L, d_head), q already scaled."""
  n_blocks = q.shape[2] // block
  masks = _mask_blocks(mask, n_blocks)

  def one_block(x):
    q_block, mask_block, index = x
    logits = _blocked_logits(q_block, k, mask_block)
    lse = logsumexp(logits, axis=-1, keepdims=True)
    weights = jnp.exp(logits - lse)
    if rate > 0.0:
      weights = jnp.where(_keep_mask(rng, index, rate, weights.shape),
                          weights / (1.0 - rate), 0.0)
    return jnp.einsum('bhqk,bhkd->bhqd', weights, v), lse

  out, lse = jax.lax.map(one_block, (_split_query_blocks(q, n_blocks, 2),
                                     masks, jnp.arange(n_blocks)))
  return _join_query_blocks(out, 2), (q, k, v, mask, lse, rng)


def _blocked_backward(rate, block, residuals, d_out):
  """Per query block: recompute the weights from the saved logsumexp."""
  q, k, v, mask, lse, rng = residuals
  n_blocks = q.shape[2] // block
  masks = _mask_blocks(mask, n_blocks)

  def one_block(carry, x):
    d_k, d_v = carry
    q_block, mask_block, lse_block, d_out_block, index = x
    weights = jnp.exp(_blocked_logits(q_block, k, mask_block) - lse_block)
    d_weights = jnp.einsum('bhqd,bhkd->bhqk', d_out_block, v)
    kept = weights
    if rate > 0.0:
      keep = _keep_mask(rng, index, rate, weights.shape)
      kept = jnp.where(keep, weights / (1.0 - rate), 0.0)
      d_weights = jnp.where(keep, d_weights / (1.0 - rate), 0.0)
    d_v = d_v + jnp.einsum('bhqk,bhqd->bhkd', kept, d_out_block)
    # Softmax backward; masked logits were constants, so they get no grad.
    d_logits = weights * (d_weights - jnp.sum(d_weights * weights, axis=-1,
                                              keepdims=True))
    d_logits = jnp.where(mask_block, d_logits, 0.0)
    d_q_block = jnp.einsum('bhqk,bhkd->bhqd', d_logits, k)
    d_k = d_k + jnp.einsum('bhqk,bhqd->bhkd', d_logits, q_block)
    return (d_k, d_v), d_q_block

  (d_k, d_v), d_q = jax.lax.scan(
      one_block, (jnp.zeros_like(k), jnp.zeros_like(v)),
      (_split_query_blocks(q, n_blocks, 2), masks, lse,
       _split_query_blocks(d_out, n_blocks, 2), jnp.arange(n_blocks)))
  return _join_query_blocks(d_q, 2), d_k, d_v, None, None


_blocked_core.defvjp(
    lambda q, k, v, mask, rate, block, rng: _blocked_forward(
        q, k, v, mask, rate, block, rng),
    _blocked_backward)


def fused_attention(q, k, v, mask, n_heads, dropout_rate=0.0,
                    dropout_rng=None, block_size=DEFAULT_QUERY_BLOCK):
  """Query-blocked attention with a hand-written backward pass.

  1/sqrt(d_head) is folded into Q, and queries are processed in blocks so
  that each block's (heads, block, Lk) logits are masked, soft-maxed and
  multiplied with V while still in cache, instead of making several passes
  over the whole (batch, heads, Lq, Lk) array. The backward pass recomputes
  each block's weights from the saved logsumexp (as flash attention does)
  rather than storing them. Dropout masks are drawn per query block.
  """
  block = _query_block_size(q.shape[1], block_size)
  qh = attention_math.split_heads(q, n_heads)
  qh = qh * jnp.asarray(1.0 / jnp.sqrt(qh.shape[-1]), qh.dtype)
  kh = attention_math.split_heads(k, n_heads)
  vh = attention_math.split_heads(v, n_heads)
  if mask is None:
    mask = jnp.ones((1, 1, 1, k.shape[1]), bool)
  mask = jnp.broadcast_to(mask.astype(bool),
                          (q.shape[0], 1) + mask.shape[2:])
  if dropout_rng is None:
    dropout_rng = jax.random.PRNGKey(0)  # unused when dropout_rate == 0
  out = _blocked_core(qh, kh, vh, mask, float(dropout_rate), block,
                      dropout_rng)
  return attention_math.merge_heads(out).astype(jnp.float32)


def chunked_attention(q, k, v, mask, n_heads, dropout_rate=0.0,
                      dropout_rng=None, block_size=None, project_k=None,
                      project_v=None):
  """Attention over key blocks with an online softmax; O(Lq*block) memory.

  Each step slices one block of keys and values out of K and V (no stacked
  copies; one padded copy only when Lk is not a multiple of the block), and `jax.checkpoint` recomputes its logits in the backward pass, so no
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
  """What 'auto' runs for these inputs."""
  if cudnn_supported(q, dropout_rate):
    return 'cudnn'
  del n_heads
  few_queries = q.shape[1] <= DEFAULT_QUERY_BLOCK
  return 'chunked' if few_queries and k.shape[1] >= CHUNKED_MIN_KEYS else (
      'fused')


_FUNCTIONS = {
    'reference': lambda *a, **kw: attention_math.dot_product_attention(
        *a, **kw)[0],
    'fused': fused_attention,
    'chunked': chunked_attention,
    'cudnn': cudnn_attention,
}


def resolve_implementation(implementation, q, k, n_heads, dropout_rate):
  """The implementation that runs: 'auto' picks for these inputs, and
  'cudnn' falls back to 'fused' where the kernel cannot run (no GPU,
  float32, or dropout), since the result is the same attention either way."""
  if implementation == 'auto':
    implementation = choose_implementation(q, k, n_heads, dropout_rate)
  if implementation == 'cudnn' and not cudnn_supported(q, dropout_rate):
    implementation = 'fused'
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
