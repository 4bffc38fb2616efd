"""Multi-head scaled dot-product attention as pure functions (no Trax state).

Everything here takes and returns arrays; randomness comes in as an explicit
JAX PRNG key. The Trax layers in `trax_qkv.layers` are thin wrappers that pass
their mode, dropout rate and rng into these functions.

Shapes used throughout:
  q: (batch, Lq, d)   k: (batch, Lk, d)   v: (batch, Lk, d_v)
  mask: broadcastable to (batch, 1, Lq, Lk); nonzero means "may attend".

The reference formulation replays, operation for operation, what
`trax.layers.attention.PureAttention` does in trax 1.4.1 (heads split by
reshape + transpose, logits divided by sqrt(d_head), mask filled with -1e9,
softmax as exp(x - logsumexp(x)), dropout by a Bernoulli keep-mask drawn with
the same key and shape, float32 outputs). Keeping the same operations is what
makes outputs, gradients and dropout masks bit-identical to the built-in:
`jax.nn.softmax`, for example, would round differently.
"""

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

# Value written into masked logits, as Trax does; large and finite, so a fully
# masked row becomes a uniform distribution rather than NaN.
MASK_FILL = -1e9


def split_heads(x, n_heads):
  """(batch, L, d) -> (batch, n_heads, L, d // n_heads)."""
  batch, length, d_feature = x.shape
  x = x.reshape((batch, length, n_heads, d_feature // n_heads))
  return x.transpose((0, 2, 1, 3))


def merge_heads(x):
  """(batch, n_heads, L, d_head) -> (batch, L, n_heads * d_head)."""
  batch, n_heads, length, d_head = x.shape
  return x.transpose((0, 2, 1, 3)).reshape((batch, length, n_heads * d_head))


def keys_transposed(k):
  """(..., Lk, d_head) keys -> (..., d_head, Lk), the operand of q @ k^T."""
  return jnp.swapaxes(k, -1, -2)


def attention_weights(q, k, mask, k_transposed=False):
  """Per-head softmax(q k^T / sqrt(d_head)) with masked logits set to -1e9.

  Args:
    q: (batch, heads, Lq, d_head) queries.
    k: (batch, heads, Lk, d_head) keys, or with `k_transposed` their
      `keys_transposed` (batch, heads, d_head, Lk), e.g. kept from an
      earlier call: the same product, without transposing them again.
    mask: None, or broadcastable to (batch, heads, Lq, Lk).

  Returns:
    (batch, heads, Lq, Lk) attention weights; each query row sums to 1.
  """
  d_head = q.shape[-1]
  k_t = k if k_transposed else keys_transposed(k)
  logits = jnp.matmul(q, k_t) / jnp.sqrt(d_head)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.full_like(logits, MASK_FILL))
  return jnp.exp(logits - logsumexp(logits, axis=-1, keepdims=True))


def attention_dropout(weights, rate, rng):
  """Zeroes each attention weight with probability `rate`, rescales the rest.

  The keep-mask is `jax.random.bernoulli(rng, 1 - rate, weights.shape)`, so a
  given key always drops the same (batch, head, query, key) entries.
  """
  keep = jax.random.bernoulli(rng, 1.0 - rate, weights.shape)
  return jnp.where(keep, weights / (1.0 - rate), jnp.zeros_like(weights))


def per_head_attention(
  q, k, v, mask, dropout_rate=0.0, dropout_rng=None, k_transposed=False
):
  """Trax's `_per_head_attention`, operation for operation.

  Args:
    q: (..., Lq, d_head) queries; k: (..., Lk, d_head) keys (with
      `k_transposed`, (..., d_head, Lk): see `attention_weights`); v:
      (..., Lk, d_v) values.
    mask: None, or broadcastable to (..., Lq, Lk); nonzero = attend.
    dropout_rate: attention-weight dropout in [0, 1).
    dropout_rng: JAX PRNG key, needed when dropout_rate > 0.

  Returns:
    float32 (activations (..., Lq, d_v), weights after dropout (..., Lq,
    Lk)).
  """
  weights = attention_weights(q, k, mask, k_transposed)
  if dropout_rate > 0.0:
    weights = attention_dropout(weights, dropout_rate, dropout_rng)
  return (
    jnp.matmul(weights, v).astype(jnp.float32),
    weights.astype(jnp.float32),
  )


def dot_product_attention(
  q, k, v, mask, n_heads, dropout_rate=0.0, dropout_rng=None
):
  """Multi-head attention over already-projected queries, keys and values.

  Each head sees a d/n_heads slice of the projected features, so each head can
  match queries to keys by its own criterion and read its own part of the
  values; the heads are concatenated back to d features.

  Args:
    q: (batch, Lq, d) projected queries.
    k: (batch, Lk, d) projected keys.
    v: (batch, Lk, d_v) projected values.
    mask: None, or broadcastable to (batch, 1, Lq, Lk); nonzero = attend.
    n_heads: number of heads; must divide d and d_v.
    dropout_rate: attention-weight dropout in [0, 1); 0 disables it.
    dropout_rng: JAX PRNG key, required when dropout_rate > 0.

  Returns:
    (activations, weights): float32 (batch, Lq, d_v) and float32
    (batch, n_heads, Lq, Lk) attention weights (after dropout, as Trax
    reports them in 'viz' mode).
  """
  per_head, weights = per_head_attention(
    split_heads(q, n_heads),
    split_heads(k, n_heads),
    split_heads(v, n_heads),
    mask,
    dropout_rate,
    dropout_rng,
  )
  return merge_heads(per_head), weights
