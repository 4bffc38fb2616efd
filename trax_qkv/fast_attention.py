"""Faster formulations of the same multi-head attention (pure functions).

Every function here computes what `attention_math.dot_product_attention`
computes -- same inputs, same float32 output, same -1e9 masking, and the same
softmax as exp(x - logsumexp(x)), whose float32 rounding makes a fully masked
query row weigh every key by 1 in trax -- within float32 rounding, but not
bit for bit. The layers use them when asked for through `implementation`:

  'reference'  attention_math: bit-identical to trax 1.4.1.
  'fused'      heads stay in place (einsum over (batch, L, heads, d_head), no
               transposes), 1/sqrt(d_head) folded into Q, softmax fused by XLA
               into one pass over the logits.
               Same dropout masks as the reference for the same rng.
  'chunked'    keys in blocks with an online softmax (lax.scan): memory
               O(Lq * block) instead of O(Lq * Lk), forward and backward.
               Dropout masks are drawn per block (same rate, other bits).
  'cudnn'      jax.nn.dot_product_attention's cuDNN kernel: GPU, bf16/fp16,
               no attention dropout.
  'auto'       the best of these for the device, shapes, dtype and dropout.
"""

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from trax_qkv import attention_math

IMPLEMENTATIONS = ('reference', 'fused', 'chunked', 'cudnn', 'auto')
MASK_FILL = attention_math.MASK_FILL
# Logit for key positions added to fill the last block: far below MASK_FILL,
# so they get zero weight even in a fully masked row.
_BLOCK_PAD_FILL = -1e30
# 'auto' switches to 'chunked' when a (batch, heads, Lq, Lk) float32 array
# would exceed this many bytes.
CHUNKED_THRESHOLD_BYTES = 256 * 2**20
DEFAULT_BLOCK_SIZE = 512


def _heads(x, n_heads):
  """(batch, L, d) -> (batch, L, heads, d_head): a reshape, no copy."""
  batch, length, d = x.shape
  return x.reshape((batch, length, n_heads, d // n_heads))


def _mask_bhqk(mask):
  """A (batch|1, 1, Lq|1, Lk) mask as booleans, broadcastable to bhqk."""
  return None if mask is None else mask.astype(bool)


def fused_attention(q, k, v, mask, n_heads, dropout_rate=0.0,
                    dropout_rng=None):
  """Multi-head attention without head transposes; see module docstring."""
  qh, kh, vh = (_heads(x, n_heads) for x in (q, k, v))
  qh = qh * jnp.asarray(1.0 / jnp.sqrt(qh.shape[-1]), qh.dtype)
  logits = jnp.einsum('bqhd,bkhd->bhqk', qh, kh)
  if mask is not None:
    logits = jnp.where(_mask_bhqk(mask), logits, MASK_FILL)
  weights = jnp.exp(logits - logsumexp(logits, axis=-1, keepdims=True))
  if dropout_rate > 0.0:
    weights = attention_math.attention_dropout(weights, dropout_rate,
                                               dropout_rng)
  out = jnp.einsum('bhqk,bkhd->bqhd', weights, vh)
  batch, lq = q.shape[:2]
  return out.reshape((batch, lq, v.shape[-1])).astype(jnp.float32)


def chunked_attention(q, k, v, mask, n_heads, dropout_rate=0.0,
                      dropout_rng=None, block_size=DEFAULT_BLOCK_SIZE):
  """Attention over key blocks with an online softmax; O(Lq*block) memory."""
  batch, lq, _ = q.shape
  lk = k.shape[1]
  block = min(block_size, lk)
  n_blocks = -(-lk // block)
  pad = n_blocks * block - lk
  qh = _heads(q, n_heads)
  qh = qh * jnp.asarray(1.0 / jnp.sqrt(qh.shape[-1]), qh.dtype)
  kh, vh = _heads(k, n_heads), _heads(v, n_heads)
  if mask is None:
    mask = jnp.ones((1, 1, 1, lk), bool)
  mask = jnp.broadcast_to(mask.astype(bool),
                          mask.shape[:2] + (mask.shape[2], lk))
  valid = jnp.arange(n_blocks * block) < lk  # False on block padding
  kh, vh = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (kh, vh))
  mask = jnp.pad(mask, ((0, 0), (0, 0), (0, 0), (0, pad)))

  def blocks(x, axis):  # split `axis` into (n_blocks, block), blocks first
    shape = x.shape[:axis] + (n_blocks, block) + x.shape[axis + 1:]
    return jnp.moveaxis(x.reshape(shape), axis, 0)

  xs = (blocks(kh, 1), blocks(vh, 1), blocks(mask, 3),
        valid.reshape((n_blocks, block)), jnp.arange(n_blocks))
  d_v = vh.shape[-1]
  acc_dtype = jnp.promote_types(q.dtype, jnp.float32)

  @jax.checkpoint  # recompute block logits in backward: memory stays small
  def step(carry, x):
    running_max, denominator, numerator = carry
    k_blk, v_blk, mask_blk, valid_blk, index = x
    logits = jnp.einsum('bqhd,bkhd->bhqk', qh, k_blk).astype(acc_dtype)
    logits = jnp.where(mask_blk, logits, MASK_FILL)
    logits = jnp.where(valid_blk, logits, _BLOCK_PAD_FILL)
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
  init = (jnp.full(stats_shape, _BLOCK_PAD_FILL, acc_dtype),
          jnp.zeros(stats_shape, acc_dtype),
          jnp.zeros(stats_shape + (d_v,), acc_dtype))
  (row_max, denominator, numerator), _ = jax.lax.scan(step, init, xs)
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
  logits_bytes = 4 * q.shape[0] * n_heads * q.shape[1] * k.shape[1]
  return 'chunked' if logits_bytes > CHUNKED_THRESHOLD_BYTES else 'fused'


_FUNCTIONS = {
    'reference': lambda *a, **kw: attention_math.dot_product_attention(
        *a, **kw)[0],
    'fused': fused_attention,
    'chunked': chunked_attention,
    'cudnn': cudnn_attention,
}


def attend(q, k, v, mask, n_heads, dropout_rate=0.0, dropout_rng=None,
           implementation='reference'):
  """Multi-head attention activations, float32 (batch, Lq, d_v).

  `implementation` is one of IMPLEMENTATIONS; 'auto' picks per call, and
  'cudnn' falls back to 'fused' where the kernel cannot run (no GPU, float32,
  or dropout), since the result is the same attention either way.
  """
  if implementation == 'auto':
    implementation = choose_implementation(q, k, n_heads, dropout_rate)
  if implementation == 'cudnn' and not cudnn_supported(q, dropout_rate):
    implementation = 'fused'
  return _FUNCTIONS[implementation](q, k, v, mask, n_heads,
                                    dropout_rate=dropout_rate,
                                    dropout_rng=dropout_rng)

