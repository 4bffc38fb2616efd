"""Attention with fewer input projections: what the three Dense layers buy.

Trax's `AttentionQKV` is `Serial(Parallel(Dense, Dense, Dense),
PureAttention, Dense)`. In self-attention Q, K and V come from the same
hidden states, so a reader asks why each gets its own Dense. These layers
take the projections away, one idea at a time, so that training them side
by side with the built-in measures the answer (docs/why_three_dense.md):

  'no_projection'      Q, K and V are the inputs as they come, split into
                       heads; the output Dense is kept.
  'shared_projection'  one Dense, the same weights for Q, K and V.
  'one_head'           the three Dense kept, n_heads=1 whatever the model
                       asks for.

They are registered in every site under these names
(`trax_qkv.models.variants`), through `register_attention` as a user's own
layer would be: a worked example of writing one. They run the
'reference' math, keep the built-in's inputs and outputs, and are never
chosen by 'auto' or by a default. None of them is bit-identical to
anything: they are different models.
"""

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

PROJECTIONS = ('none', 'shared')


class SharedDense(base.Layer):
  """One Dense applied to each of Q, K and V: `(q, k, v) -> (q W + b, k W +
  b, v W + b)`, initialized as `core.Dense` is."""

  def __init__(self, n_units):
    super().__init__(n_in=3, n_out=3, name='SharedDense')
    self._n_units = n_units
    self._kernel_init = init.GlorotUniformInitializer()
    self._bias_init = init.RandomNormalInitializer(1e-6)

  def forward(self, inputs):
    w, b = self.weights
    return tuple(jnp.dot(x, w) + b for x in inputs)

  def init_weights_and_state(self, input_signature):
    shape_w = (input_signature[0].shape[-1], self._n_units)
    rng_w, rng_b = fastmath.random.split(self.rng, 2)
    self.weights = (
      self._kernel_init(shape_w, rng_w),
      self._bias_init((self._n_units,), rng_b),
    )


def _check(projection, d_feature, n_heads, dropout, mode):
  if projection not in PROJECTIONS:
    raise ValueError(
      f'projection must be one of {PROJECTIONS}; got {projection!r}.'
    )
  checks.check_n_heads(n_heads)
  checks.check_d_feature(d_feature, n_heads)
  checks.check_dropout(dropout)
  checks.check_mode(mode)


def _input_projections(projection, d_feature):
  """A (q, k, v) -> (q, k, v) layer: nothing, or one shared Dense."""
  return SharedDense(d_feature) if projection == 'shared' else cb.Serial()


def AttentionQKV(
  projection,
  d_feature,
  n_heads=1,
  dropout=0.0,
  mode='train',
  cache_KV_in_predict=False,
  q_sparsity=None,
  result_sparsity=None,
):
  """`(AQ, AK, AV, mask) -> (new_A, mask)` as `trax.layers.AttentionQKV`,
  with `projection` ('none' or 'shared') in place of the three Dense.

  `cache_KV_in_predict` (LSTMSeq2SeqAttn, ConfigurableTransformer) is
  accepted and not used: K and V are recomputed each step, the same
  numbers. The sparse projections that ConfigurableTransformer can ask for
  (`q_sparsity`, `result_sparsity`) replace Dense layers these variants
  change, so only None is accepted.
  """
  del cache_KV_in_predict
  for name, value in (
    ('q_sparsity', q_sparsity),
    ('result_sparsity', result_sparsity),
  ):
    if value is not None:
      raise ValueError(
        f'{name} must be None for projection={projection!r}, which has no '
        f'sparse variant; got {value!r}.'
      )
  _check(projection, d_feature, n_heads, dropout, mode)
  return cb.Serial(
    _input_projections(projection, d_feature),
    PureAttention(n_heads=n_heads, dropout=dropout, mode=mode),
    core.Dense(d_feature),
  )


def Attention(projection, d_feature, n_heads=1, dropout=0.0, mode='train'):
  """`(x, mask) -> (new_x, mask)`: self-attention over `AttentionQKV`."""
  return cb.Serial(
    cb.Select([0, 0, 0]),
    AttentionQKV(projection, d_feature, n_heads, dropout, mode),
  )


def CausalAttention(
  projection,
  d_feature,
  n_heads=1,
  dropout=0.0,
  max_inference_length=2048,
  mode='train',
):
  """`x -> new_x`: causal self-attention as `trax.layers.CausalAttention`
  (its predict-mode cache included), with `projection` in place of the
  three Dense."""
  _check(projection, d_feature, n_heads, dropout, mode)
  return cb.Serial(
    cb.Select([0, 0, 0]),
    _input_projections(projection, d_feature),
    cb.Parallel(*(trax_attention.SplitIntoHeads(n_heads) for _ in 'qkv')),
    causal_attention.DotProductCausalAttention(
      dropout=dropout, max_inference_length=max_inference_length, mode=mode
    ),
    trax_attention.MergeHeads(n_heads),
    core.Dense(d_feature),
  )
