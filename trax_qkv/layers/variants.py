"""Attention with other input projections: what the three Dense layers buy.

Trax's `AttentionQKV` is `Serial(Parallel(Dense, Dense, Dense),
PureAttention, Dense)`. In self-attention Q, K and V come from the same
hidden states, so a reader asks why each gets its own Dense. These layers
change the projections one idea at a time, so that training them side by
side with the built-in measures the answer (docs/why_three_dense.md). A
`Projections` record says, for each of Q, K and V, what happens to it
before the heads are split:

  'dense'  its own Dense (d -> d), as in Trax's layer;
  'none'   nothing: the input as it comes;
  'q'      Q's Dense, the same weights (K, V only);
  'head'   its own Dense to one head's width (d -> d / n_heads), the same
           for every head (K, V only: multi-query attention);

and `temperature`: a learned per-head factor on the logits (initially 1),
for variants whose heads have no other way to sharpen. The output Dense is
always kept. `trax_qkv.models.variants` names the records and registers
them in every site through `register_attention`, as a user's own layer
would be. They run the 'reference' math, keep the built-in's inputs and
outputs, and are never chosen by 'auto' or by a default; none of them is
bit-identical to anything: they are different models.
"""

import dataclasses

from jax import numpy as jnp
from trax import fastmath
from trax.layers import attention as trax_attention
from trax.layers import base
from trax.layers import combinators as cb
from trax.layers import core
from trax.layers import initializers as init

from trax_qkv.layers import causal_attention
from trax_qkv.layers import checks
from trax_qkv.layers.attention import PureAttention

_KV = ('dense', 'none', 'q', 'head')
KINDS = {'q': ('dense', 'none'), 'k': _KV, 'v': _KV}


@dataclasses.dataclass(frozen=True)
class Projections:
  """What happens to Q, K and V before the heads are split (module doc)."""

  q: str = 'dense'
  k: str = 'dense'
  v: str = 'dense'
  temperature: bool = False

  def __post_init__(self):
    for name, kinds in KINDS.items():
      if getattr(self, name) not in kinds:
        raise ValueError(
          f'{name} must be one of {kinds}; got {getattr(self, name)!r}.'
        )
    if self.temperature and self.q != 'none':
      raise ValueError('temperature is for unprojected queries (q="none").')


class InputProjections(base.Layer):
  """`(q, k, v) -> (q', k', v')` as a `Projections` record says; each Dense
  initialized as `core.Dense` is, in the order Q, K, V, then the
  temperatures' log (zeros)."""

  def __init__(self, projections, d_feature, n_heads):
    super().__init__(n_in=3, n_out=3, name='InputProjections')
    self._p, self._d, self._n_heads = projections, d_feature, n_heads
    self._dense = [
      name for name in 'qkv' if getattr(projections, name) in ('dense', 'head')
    ]

  def forward(self, inputs):
    weights = dict(zip(self._dense, self.weights, strict=False))
    outputs = {}
    for name, x in zip('qkv', inputs, strict=True):
      kind = getattr(self._p, name)
      if kind == 'none':
        outputs[name] = x
      else:
        w, b = weights['q' if kind == 'q' else name]
        y = jnp.dot(x, w) + b
        outputs[name] = jnp.tile(y, self._n_heads) if kind == 'head' else y
    q = outputs['q']
    if self._p.temperature:  # q per head times its factor: logits times it
      factor = jnp.repeat(jnp.exp(self.weights[-1]), self._d // self._n_heads)
      q = q * factor
    return q, outputs['k'], outputs['v']

  def init_weights_and_state(self, input_signature):
    rngs = fastmath.random.split(self.rng, 2 * len(self._dense) + 1)
    weights = []
    for i, name in enumerate(self._dense):
      units = self._d
      if getattr(self._p, name) == 'head':
        units //= self._n_heads
      d_in = input_signature['qkv'.index(name)].shape[-1]
      weights.append(
        (
          init.GlorotUniformInitializer()((d_in, units), rngs[2 * i]),
          init.RandomNormalInitializer(1e-6)((units,), rngs[2 * i + 1]),
        )
      )
    if self._p.temperature:
      weights.append(jnp.zeros((self._n_heads,), jnp.float32))
    self.weights = tuple(weights)


def _check(projections, d_feature, n_heads, dropout, mode):
  if not isinstance(projections, Projections):
    raise TypeError(
      f'projections must be a Projections record; got {projections!r}.'
    )
  checks.check_n_heads(n_heads)
  checks.check_d_feature(d_feature, n_heads)
  checks.check_dropout(dropout)
  checks.check_mode(mode)


def AttentionQKV(
  projections,
  d_feature,
  n_heads=1,
  dropout=0.0,
  mode='train',
  cache_KV_in_predict=False,
  q_sparsity=None,
  result_sparsity=None,
):
  """`(AQ, AK, AV, mask) -> (new_A, mask)` as `trax.layers.AttentionQKV`,
  with `projections` in place of the three Dense.

  `cache_KV_in_predict` (LSTMSeq2SeqAttn, ConfigurableTransformer) is
  accepted and not used: K and V are recomputed each step, the same
  numbers. The sparse projections that ConfigurableTransformer can ask for
  (`q_sparsity`, `result_sparsity`) replace Dense layers these variants
  change, so only None is accepted.
  """
  del cache_KV_in_predict
  sparsity = {'q_sparsity': q_sparsity, 'result_sparsity': result_sparsity}
  for name, value in sparsity.items():
    if value is not None:
      raise ValueError(
        f'{name} must be None for these projections, which have no sparse '
        f'variant; got {value!r}.'
      )
  _check(projections, d_feature, n_heads, dropout, mode)
  return cb.Serial(
    InputProjections(projections, d_feature, n_heads),
    PureAttention(n_heads=n_heads, dropout=dropout, mode=mode),
    core.Dense(d_feature),
  )


def Attention(projections, d_feature, n_heads=1, dropout=0.0, mode='train'):
  """`(x, mask) -> (new_x, mask)`: self-attention over `AttentionQKV`."""
  return cb.Serial(
    cb.Select([0, 0, 0]),
    AttentionQKV(projections, d_feature, n_heads, dropout, mode),
  )


def CausalAttention(
  projections,
  d_feature,
  n_heads=1,
  dropout=0.0,
  max_inference_length=2048,
  mode='train',
):
  """`x -> new_x`: causal self-attention as `trax.layers.CausalAttention`
  (its predict-mode cache included), with `projections` in place of the
  three Dense."""
  _check(projections, d_feature, n_heads, dropout, mode)
  return cb.Serial(
    cb.Select([0, 0, 0]),
    InputProjections(projections, d_feature, n_heads),
    cb.Parallel(*(trax_attention.SplitIntoHeads(n_heads) for _ in 'qkv')),
    causal_attention.DotProductCausalAttention(
      dropout=dropout, max_inference_length=max_inference_length, mode=mode
    ),
    trax_attention.MergeHeads(n_heads),
    core.Dense(d_feature),
  )
