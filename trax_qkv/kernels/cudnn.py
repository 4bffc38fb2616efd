"""'cudnn': `jax.nn.dot_product_attention`'s cuDNN kernel.

GPU only, bfloat16 or float16 inputs, no attention dropout. Asked for
explicitly where it cannot run, it raises (as `jax.nn.dot_product_attention`
does): only 'auto' falls back to another implementation.
"""

import jax
import jax.numpy as jnp

from trax_qkv.kernels import common

DTYPES = (jnp.bfloat16, jnp.float16)


def unsupported_reason(dtype=None, dropout_rate=0.0):
  """Why the kernel cannot run here, or None where it can.

  `dtype` None skips the dtype check (a layer learns its input dtype only
  at `init`).
  """
  backend = jax.default_backend()
  if backend != 'gpu':
    return f"it needs a GPU and JAX's default backend is {backend!r}"
  if dtype is not None and jnp.dtype(dtype) not in map(jnp.dtype, DTYPES):
    return f'it takes bfloat16 or float16 inputs; got {jnp.dtype(dtype).name}'
  if dropout_rate > 0.0:
    return (
      f"it has no attention dropout; got dropout {dropout_rate} in 'train' mode"
    )
  return None


def check_supported(dtype=None, dropout_rate=0.0):
  """Raises ValueError saying why cuDNN cannot run here, if it cannot."""
  reason = unsupported_reason(dtype, dropout_rate)
  if reason:
    raise ValueError(
      f"implementation='cudnn' cannot run here: {reason}. Use "
      "implementation='auto', which runs cuDNN where it can and the "
      'fastest other implementation elsewhere.'
    )


def cudnn_attention(q, k, v, mask, n_heads, dropout_rate=0.0, dropout_rng=None):
  """Multi-head attention through `jax.nn.dot_product_attention(...,
  implementation='cudnn')`.

  Args:
    q, k, v: (b, Lq, d), (b, Lk, d), (b, Lk, d_v); bfloat16 or float16.
    mask: None, or broadcastable to (b, 1, Lq, Lk); nonzero = attend.
    n_heads: heads; divides d and d_v.
    dropout_rate: must be 0 (the kernel has no dropout).
    dropout_rng: unused.

  Returns:
    float32 (b, Lq, d_v).

  Raises:
    ValueError: where the kernel cannot run (`unsupported_reason`).
  """
  del dropout_rng
  check_supported(q.dtype, dropout_rate)
  qh, kh, vh = (common.heads_last(x, n_heads) for x in (q, k, v))
  if mask is not None:
    mask = jnp.broadcast_to(
      mask.astype(bool), (q.shape[0], 1, q.shape[1], k.shape[1])
    )
  out = jax.nn.dot_product_attention(
    qh, kh, vh, mask=mask, implementation='cudnn'
  )
  return out.reshape(q.shape[:2] + (v.shape[-1],)).astype(jnp.float32)


def cudnn_causal_attention(q, k, v, dropout_rate=0.0, dropout_rng=None):
  """Causal attention through cuDNN's causal flag (no mask array).

  Args:
    q, k, v: per-head (g, L, d_head), (g, L, d_head), (g, L, d_v).
    dropout_rate: must be 0; dropout_rng: unused.

  Returns:
    float32 (g, L, d_v).
  """
  del dropout_rng
  check_supported(q.dtype, dropout_rate)
  out = jax.nn.dot_product_attention(
    q[:, :, None],
    k[:, :, None],
    v[:, :, None],
    is_causal=True,
    implementation='cudnn',
  )
  return out[:, :, 0].astype(jnp.float32)
