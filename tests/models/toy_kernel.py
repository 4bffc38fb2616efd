"""A toy kernel: the reference math, counting its calls per entry point.

It stands for the module a new kernel would be; `RECORD` is its one record.
"""

import collections

from trax_qkv import kernels
from trax_qkv.kernels import reference

CALLS = collections.Counter()  # entry point -> calls (traces included)


def attend(q, k, v, mask, n_heads, dropout_rate=0.0, dropout_rng=None):
  CALLS['attend'] += 1
  return reference.dot_product_attention(
    q, k, v, mask, n_heads, dropout_rate, dropout_rng
  )[0]


def causal(q, k, v, dropout_rate=0.0, dropout_rng=None):
  CALLS['causal'] += 1
  return reference.per_head_attention(
    q, k, v, kernels.causal_mask(q.shape[1]), dropout_rate, dropout_rng
  )[0]


def cached(q, ks, vs, index, mask):
  del index
  CALLS['cached'] += 1
  return reference.per_head_attention(q, ks, vs, mask)[0]


# 'auto' asks it first, and picks it for exactly 7 keys.
RECORD = kernels.Kernel(
  'toy',
  attend,
  causal,
  cached,
  auto_when=lambda call: call.k_shape[1] == 7,
  auto_priority=-1,
)
