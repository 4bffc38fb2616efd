"""`DotProductCausalAttention` and `CausalAttention`: drop-ins for trax 1.4.1's.

Causal self-attention is what a decoder or a language model runs: position
i attends to positions 0..i only. Trax builds it as `ConfigurableAttention`
(Dense projections for Q, K and V, heads split into the batch axis, the
attention core, heads merged, a Dense output) around
`DotProductCausalAttention`, the core, which also keeps the predict-mode
cache: keys and values of the tokens decoded so far, in buffers of
`max_inference_length` positions, and the index of the next free one.

The layers here have the built-in's trees (sublayers, weights, state,
shape-assert wrappers), so init keys, dropout keys and checkpoints carry
over; the math comes from `trax_qkv.kernels` with the causal mask.
"""

import gin
import jax
import jax.numpy as jnp
from trax.layers import attention as trax_attention
from trax.layers import combinators as cb
from trax.layers import convolution
from trax.layers import core
from trax.layers.assert_shape import assert_shape

from trax_qkv import kernels
from trax_qkv.layers import checks
from trax_qkv.layers import kernel_layer
from trax_qkv.layers.attention import RowsDense


def empty_cache(input_signature, max_length):
  """The predict-mode state before the first token: zero key and value
  buffers of `max_length` positions, and the next position, 0."""
  _, k, v = input_signature
  return (
    jnp.zeros((k.shape[0], max_length, k.shape[-1]), k.dtype),
    jnp.zeros((v.shape[0], max_length, v.shape[-1]), v.dtype),
    jnp.array(0),
  )


def append_to_cache(cache, new_k, new_v):
  """Writes the new keys and values at the cache's next position.

  Returns the new cache and the (1, new, max_length) mask of the new
  queries: query j (at position index + j) may attend to the cached
  positions up to its own.
  """
  ks, vs, index = cache
  new = new_k.shape[1]
  ks = jax.lax.dynamic_update_slice_in_dim(ks, new_k, index, axis=1)
  vs = jax.lax.dynamic_update_slice_in_dim(vs, new_v, index, axis=1)
  mask = jnp.arange(ks.shape[1]).reshape((1, 1, -1)) <= (
    jnp.arange(new) + index
  ).reshape((1, new, 1))
  return (ks, vs, index + new), mask


@assert_shape('bld,bld,bld->bld')
@gin.configurable(
  'QkvDotProductCausalAttention', module='trax_qkv', denylist=['mode']
)
class DotProductCausalAttention(kernel_layer.KernelLayer):
  """Maps per-head `(Q, K, V)` to activations, each position attending to
  itself and the positions before it.

  Inputs come with the heads in the batch axis, (batch * heads, L, d_head),
  as `trax.layers.SplitIntoHeads` makes them. In 'predict' mode the layer
  takes one or more new positions per call and attends over its cache; in
  'viz' mode its state holds the (batch * heads, L, L) attention weights.
  """

  def __init__(
    self,
    dropout=0.0,
    max_inference_length=2048,
    mode='train',
    implementation='reference',
  ):
    """Creates a DotProductCausalAttention layer.

    Args:
      dropout: rate in [0, 1) at which attention weights are dropped in
          'train' mode.
      max_inference_length: positions the predict-mode cache holds.
      mode: one of 'train', 'eval', 'predict', 'viz'.
      implementation: 'reference' (bit-identical to the built-in), another
          kernel of `trax_qkv.kernels.names()`, or 'auto' (see
          `KernelLayer`).
    """
    checks.check_positive_int('max_inference_length', max_inference_length)
    super().__init__(3, 1, dropout, mode, implementation)
    self._max_len = max_inference_length

  def check_inputs(self, inputs):
    checks.check_causal_inputs(inputs)

  def _call(self, q, k):
    predict = self._mode == 'predict'
    return kernels.Call(
      q.shape,
      # What a predict-mode step reads: the whole cache.
      (k.shape[0], self._max_len, k.shape[2]) if predict else k.shape,
      q.dtype,
      1,
      self.dropout_rate,
      causal=True,
      predict=predict,
    )

  def init_weights_and_state(self, input_signature):
    if self._mode == 'predict':
      self.state = empty_cache(input_signature, self._max_len)

  def forward(self, inputs):
    self.check_inputs(inputs)
    q, k, v = inputs
    kernel = self.kernel_for(q, k)
    if self._mode == 'predict':
      index = self.state[2]
      self.state, mask = append_to_cache(self.state, k, v)
      ks, vs, _ = self.state
      return kernel.cached(q, ks, vs, index, mask)
    if self._mode == 'viz':
      # The heads are already in the batch axis, as in Trax's own math.
      activations, self.state = kernels.reference.per_head_attention(
        q, k, v, kernels.causal_mask(q.shape[1])
      )
      return activations
    return kernel.causal(
      q, k, v, dropout_rate=self.dropout_rate, dropout_rng=self.rng
    )


@assert_shape('bld->bld')
@gin.configurable('QkvCausalAttention', module='trax_qkv', denylist=['mode'])
def CausalAttention(
  d_feature,
  n_heads=1,
  dropout=0.0,
  max_inference_length=2048,
  use_dconv=False,
  mode='train',
  implementation='reference',
):
  """Maps activations to activations: multi-head causal self-attention.

  Data flow, as in trax 1.4.1 (`trax.layers.CausalAttention`):

      x --Dense--> Q --split heads--\\
      x --Dense--> K --split heads---DotProductCausalAttention--merge--Dense
      x --Dense--> V --split heads--/

  Args:
    d_feature: feature size of the input, Q, K, V and the output.
    n_heads: number of attention heads; must divide d_feature.
    dropout: attention-weight dropout rate in [0, 1), 'train' mode only.
    max_inference_length: positions the predict-mode cache holds.
    use_dconv: follow each projection with a causal depthwise convolution.
    mode: one of 'train', 'eval', 'predict', 'viz'.
    implementation: formulation of the attention math (see
        DotProductCausalAttention).
  """
  checks.check_n_heads(n_heads)
  checks.check_d_feature(d_feature, n_heads)

  dense = RowsDense if kernels.projects_rows(implementation) else core.Dense

  def _Projection():
    if use_dconv:
      return cb.Serial(dense(d_feature), convolution.CausalDepthwiseConv())
    return dense(d_feature)

  return trax_attention.ConfigurableAttention(
    _Projection(),
    _Projection(),
    _Projection(),
    dense(d_feature),
    n_heads=n_heads,
    qkv_attention_layer=DotProductCausalAttention(
      dropout=dropout,
      max_inference_length=max_inference_length,
      mode=mode,
      implementation=implementation,
    ),
  )
