"""Multi-head attention math as pure JAX functions: no Trax, no TensorFlow.

Every implementation computes what `reference.dot_product_attention`
computes -- same inputs, float32 output, -1e9 masking, softmax as
exp(x - logsumexp(x)) -- within float32 rounding; 'reference' is that
function, operation for operation as trax 1.4.1 runs it, so bit-identical:

  'reference'  trax's own math (reference.py).
  'fused'      cache-sized tiles with a flash-style backward (fused.py);
               fastest on CPUs.
  'chunked'    keys in blocks with an online softmax (chunked.py); memory
               O(Lq * block) instead of O(Lq * Lk).
  'cudnn'      jax.nn.dot_product_attention's cuDNN kernel (cudnn.py): GPU,
               bfloat16/float16, no dropout; raises where it cannot run.
  'auto'       one of the above, chosen by `choose` for the device, shapes,
               dtype and dropout.

Causal self-attention has its own functions (CAUSAL_FUNCTIONS, causal.py):
'fused' and 'chunked' visit only the blocks on or below the diagonal (with
cache-sized and with `chunked.DEFAULT_BLOCK_SIZE` blocks), 'cudnn' uses the
kernel's causal flag; in predict mode they attend over the filled part of
the cache only.

`resolve` is the one place that turns a requested name into the one that
runs; the layers call it once per call and pass the result down.
"""

import functools

import jax

from trax_qkv.kernels import causal
from trax_qkv.kernels import chunked
from trax_qkv.kernels import cudnn
from trax_qkv.kernels import fused
from trax_qkv.kernels import reference

IMPLEMENTATIONS = ('reference', 'fused', 'chunked', 'cudnn', 'auto')
# 'auto' runs 'chunked' for at most FEW_QUERIES queries over at least
# CHUNKED_MIN_KEYS keys, where the (Lq, Lk) logits and the projected K and V
# are what fills memory.
FEW_QUERIES = 64
CHUNKED_MIN_KEYS = 4096
# 'auto' runs the reference when all (batch, heads, Lq, Lk) logits fit in
# this many floats (4 MB): nothing to tile, and its backward, which keeps
# the weights instead of recomputing them, is the cheaper one there.
REFERENCE_MAX_LOGITS = 2 ** 20

FUNCTIONS = {
    'reference': lambda *a, **kw: reference.dot_product_attention(*a,
                                                                  **kw)[0],
    'fused': fused.fused_attention,
    'chunked': chunked.chunked_attention,
    'cudnn': cudnn.cudnn_attention,
}


# Causal attention of per-head (rows, L, d_head) q, k, v:
# f(q, k, v, dropout_rate=, dropout_rng=) -> float32 (rows, L, d_v).
CAUSAL_FUNCTIONS = {
    'reference': lambda q, k, v, **kw: reference.per_head_attention(
        q, k, v, causal_mask(q.shape[1]), **kw)[0],
    'fused': causal.causal_attention,
    'chunked': functools.partial(causal.causal_attention,
                                 block=chunked.DEFAULT_BLOCK_SIZE),
    'cudnn': cudnn.cudnn_causal_attention,
}


def causal_mask(length):
  """(1, length, length) bool: query i may attend to keys 0..i."""
  return jax.numpy.tril(jax.numpy.ones((1, length, length), bool))


def check_implementation(implementation, name='implementation'):
  """Raises ValueError unless `implementation` is one of IMPLEMENTATIONS."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f'{name} must be one of {IMPLEMENTATIONS}; got '
                     f'{implementation!r}.')


def choose(q, k, n_heads, dropout_rate):
  """What 'auto' runs for these inputs (measurements: docs/benchmarks.md)."""
  if cudnn.unsupported_reason(q.dtype, dropout_rate) is None:
    return 'cudnn'
  if q.shape[1] <= FEW_QUERIES and k.shape[1] >= CHUNKED_MIN_KEYS:
    return 'chunked'  # memory: O(Lq * block) instead of O(Lq * Lk)
  # On a GPU the loop steps of 'fused' run one after another and lose to
  # XLA's own fusions of the reference (H200: 0.4-0.7x).
  if jax.default_backend() == 'gpu':
    return 'reference'
  if q.shape[0] * n_heads * q.shape[1] * k.shape[1] <= REFERENCE_MAX_LOGITS:
    return 'reference'
  return 'fused'


def resolve(implementation, q, k, n_heads, dropout_rate):
  """The implementation that runs for these inputs (arrays or ShapeDtypes).

  'auto' is chosen for the inputs; 'cudnn' raises ValueError where it
  cannot run; any other name runs as asked.
  """
  check_implementation(implementation)
  if implementation == 'auto':
    return choose(q, k, n_heads, dropout_rate)
  if implementation == 'cudnn':
    cudnn.check_supported(q.dtype, dropout_rate)
  return implementation


def resolve_causal(implementation, q, k, dropout_rate, predict=False):
  """`resolve` for causal attention of per-head (rows, L, d_head) inputs.

  In predict mode, 'auto' off the GPU runs 'fused': over the filled part
  of the cache it always does less than the reference over all of it.
  """
  if (implementation == 'auto' and predict
      and cudnn.unsupported_reason(q.dtype) is not None
      and jax.default_backend() != 'gpu'):
    return 'fused'
  return resolve(implementation, q, k, 1, dropout_rate)


def attend(q, k, v, mask, n_heads, dropout_rate=0.0, dropout_rng=None,
           implementation='reference'):
  """Multi-head attention activations, float32 (batch, Lq, d_v).

  Args:
    q: (batch, Lq, d) projected queries; k: (batch, Lk, d); v: (batch, Lk,
      d_v).
    mask: None, or broadcastable to (batch, 1, Lq, Lk); nonzero = attend.
    n_heads: number of heads; divides d and d_v.
    dropout_rate: attention-weight dropout in [0, 1).
    dropout_rng: JAX PRNG key, needed when dropout_rate > 0.
    implementation: one of IMPLEMENTATIONS (resolved by `resolve`).
  """
  implementation = resolve(implementation, q, k, n_heads, dropout_rate)
  return FUNCTIONS[implementation](q, k, v, mask, n_heads,
                                   dropout_rate=dropout_rate,
                                   dropout_rng=dropout_rng)
